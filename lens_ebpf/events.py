"""Event bus: ring-buffer records and other events fan out to bounded subscriber queues."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

Event = dict[str, Any]


class Subscription:
    """A bounded queue; when full the oldest event goes and the loss is counted."""

    def __init__(
        self, name: str, maxsize: int, accept: Callable[[Event], bool] | None = None
    ) -> None:
        self.name = name
        self.accept = accept
        self.dropped = 0
        self._queue: collections.deque[Event] = collections.deque()
        self._maxsize = maxsize
        self._cond = threading.Condition()

    def put(self, event: Event) -> None:
        with self._cond:
            if len(self._queue) >= self._maxsize:
                self._queue.popleft()
                self.dropped += 1
            self._queue.append(event)
            self._cond.notify()

    def get(self, timeout: float | None = None) -> Event | None:
        with self._cond:
            if not self._queue:
                self._cond.wait(timeout)
            return self._queue.popleft() if self._queue else None

    def __len__(self) -> int:
        return len(self._queue)


class EventBus:
    """Numbers events (seq, strictly increasing per agent), keeps a bounded history for
    resume, and publishes each to every subscriber whose filter accepts it, in order."""

    def __init__(self, queue_size: int, history: int = 0) -> None:
        self.queue_size = queue_size
        self._subs: list[Subscription] = []
        self._lock = threading.Lock()
        self.published: collections.Counter[str] = collections.Counter()
        self.seq = 0
        # maxlen 0 keeps nothing: no history without a flag to say so
        self.history: collections.deque[Event] = collections.deque(maxlen=history)
        self._dropped_gone: collections.Counter[str] = collections.Counter()

    def subscribe(
        self,
        name: str,
        accept: Callable[[Event], bool] | None = None,
        maxsize: int | None = None,
    ) -> Subscription:
        sub = Subscription(name, maxsize or self.queue_size, accept)
        with self._lock:
            self._subs.append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subs:
                self._subs.remove(sub)
                self._dropped_gone[sub.name] += sub.dropped

    def publish(self, event: Event) -> None:
        with self._lock:
            self.seq += 1
            event["seq"] = self.seq
            event.setdefault("ts_unix_nano", time.time_ns())
            self.published[event["kind"]] += 1
            self.history.append(event)
            for sub in self._subs:
                if sub.accept is None or sub.accept(event):
                    sub.put(event)

    def since(self, seq: int) -> tuple[list[Event], int]:
        """Events with seq >= the given one still held, and how many older ones are gone."""
        with self._lock:
            held = [e for e in self.history if e["seq"] >= seq]
            first = self.history[0]["seq"] if self.history else self.seq + 1
        return held, max(0, first - seq)

    def dropped_by_subscriber(self) -> dict[str, int]:
        with self._lock:
            out = collections.Counter(self._dropped_gone)
            for sub in self._subs:
                out[sub.name] += sub.dropped
        return dict(out)

    def subscriptions(self) -> list[Subscription]:
        with self._lock:
            return list(self._subs)


class EventBusCollector(Collector):
    """Events published by kind, and events each subscriber lost to a full queue."""

    def __init__(self, bus: EventBus) -> None:
        self._bus = bus

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        pub = Metric("lens_agent_events_published", "Events published by kind", "counter")
        for kind, n in sorted(self._bus.published.items()):
            pub.add_sample("lens_agent_events_published_total", {"kind": kind}, n)
        lost = Metric(
            "lens_agent_subscriber_events_dropped",
            "Events a subscriber lost because its queue was full",
            "counter",
        )
        for name, n in sorted(self._bus.dropped_by_subscriber().items()):
            lost.add_sample("lens_agent_subscriber_events_dropped_total", {"subscriber": name}, n)
        live = Metric("lens_agent_subscribers", "Subscribers attached to the event bus", "gauge")
        counts = collections.Counter(s.name for s in self._bus.subscriptions())
        for name, n in sorted(counts.items()):
            live.add_sample("lens_agent_subscribers", {"subscriber": name}, n)
        yield pub
        yield lost
        yield live
