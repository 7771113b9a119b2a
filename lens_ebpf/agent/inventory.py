"""What changed between two reads of the node's devices: device_change events (a GPU or
RDMA port appeared, disappeared, or changed identity or state) and device_inventory
snapshots (at start, and each time the reporter (re)connects), so the recorder can
keep every node's inventory and a changelog. The records come from the device collectors
(lens_ebpf/agent/devices/inventory.py); nothing changes: nothing is sent.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

from lens_ebpf.agent.events import DeviceChange, DeviceInventory, Event

# what a change is made of: every record field but the event's own and the bookkeeping
_META = {"kind", "seq", "ts_unix_nano", "change", "fields"}
FIELDS = tuple(f.name for f in dataclasses.fields(DeviceChange) if f.name not in _META)


def differing(old: DeviceChange, new: DeviceChange) -> tuple[str, ...]:
    return tuple(f for f in FIELDS if getattr(old, f) != getattr(new, f))


class DeviceWatch:
    """Every device collector's latest records by scope (gpu, rdma); publishes a
    device_change for each difference, and a device_inventory once every expected scope
    has read once, and again on inventory_again()."""

    def __init__(self, publish: Callable[[Event], object]) -> None:
        self.publish = publish
        self._lock = threading.Lock()
        self._records: dict[str, dict[str, DeviceChange]] = {}
        self._expected: set[str] = set()
        self._announced = False
        self.changes = 0  # device_change events published

    def expect(self, scope: str) -> None:
        """A collector that will update this scope (the first inventory waits for it)."""
        with self._lock:
            self._expected.add(scope)

    def update(self, scope: str, records: dict[str, DeviceChange]) -> None:
        with self._lock:
            old = self._records.get(scope)
            self._records[scope] = records
            out: list[Event] = []
            if old is not None:
                for slot in sorted(old.keys() - records.keys()):
                    out.append(dataclasses.replace(old[slot], change="disappeared"))
                for slot in sorted(records.keys() - old.keys()):
                    out.append(dataclasses.replace(records[slot], change="appeared"))
                for slot in sorted(records.keys() & old.keys()):
                    if fields := differing(old[slot], records[slot]):
                        out.append(
                            dataclasses.replace(records[slot], change="changed", fields=fields)
                        )
            self.changes += len(out)
            if not self._announced and self._expected <= self._records.keys():
                self._announced = True
                out.append(self._inventory())
        for ev in out:  # outside the lock: a subscriber may ask for the inventory
            self.publish(ev)

    def _inventory(self) -> DeviceInventory:
        devices = [
            r for scope in sorted(self._records) for _, r in sorted(self._records[scope].items())
        ]
        return DeviceInventory(devices=tuple(devices))

    def inventory_again(self) -> None:
        """Publish the inventory again (the reporter reconnected), once there is one."""
        with self._lock:
            ev = self._inventory() if self._announced else None
        if ev is not None:
            self.publish(ev)
