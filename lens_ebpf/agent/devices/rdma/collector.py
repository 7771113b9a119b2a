"""RDMA/InfiniBand metrics: sysfs devices, ports and counters, plus `rdma statistic`
(their families: lens_ebpf/agent/devices/rdma/families.py), queue pairs and the /rdma route."""

from __future__ import annotations

import dataclasses
import logging
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.core import Metric
from pydantic import Field

from lens_ebpf.agent.devices import inventory
from lens_ebpf.agent.devices.rdma import qp_counters, resources, statistic, sysfs
from lens_ebpf.agent.devices.rdma.families import device_metrics, stat_metrics
from lens_ebpf.agent.events import RdmaUse, owner_fields
from lens_ebpf.agent.feature import CollectorFeature, Settings, register
from lens_ebpf.core.collector import PeriodicCollector
from lens_ebpf.core.exposition import counter, gauge

log = logging.getLogger(__name__)


def guid_bytes(guid: str) -> str:
    """sysfs's '0c42:a103:0065:2a3c' as the node exporter writes GUIDs: eight bytes,
    '0c:42:a1:03:00:65:2a:3c'. Anything that is not 64 bits of hex is left as it is."""
    bare = guid.replace(":", "").strip().lower()
    if len(bare) != 16 or any(c not in "0123456789abcdef" for c in bare):
        return guid
    return ":".join(bare[i : i + 2] for i in range(0, 16, 2))


def rest_view(
    devices: list[sysfs.RdmaDevice],
    stats: list[statistic.PortStats],
    links: list[resources.Link] | None = None,
    qps: dict[tuple[str, int], list[dict[str, Any]]] | None = None,
) -> list[dict[str, Any]]:
    """/rdma in the node exporter's shape: one entry per port. if_index is the RDMA device
    index `rdma link` or `rdma statistic` reports; for a device neither lists, the
    device's position by name, or the next index no other device holds. With resource
    tracking, each port lists its queue pairs (`queue_pairs`)."""
    index = {s.device: s.ifindex for s in stats if s.ifindex is not None}
    index.update({link.device: link.index for link in links or []})
    taken = set(index.values())
    for position, d in enumerate(devices):
        if d.name not in index:
            while position in taken:
                position += 1
            index[d.name] = position
            taken.add(position)
    out = []
    for d in devices:
        for p in d.ports:
            out.append(
                {
                    "if_index": index[d.name],
                    "if_name": d.name,
                    "node_guid": guid_bytes(d.node_guid),
                    "sys_image_guid": guid_bytes(d.sys_image_guid),
                    "port_guid": guid_bytes(p.port_guid),
                    "link_layer": p.link_layer,
                    # lens-ebpf's additions
                    "port": p.number,
                    "state": p.state_name,
                    "netdev": d.netdev,
                }
            )
            if qps is not None:
                out[-1]["queue_pairs"] = qps.get((d.name, p.number), [])
    return out


def uverbs_devices(
    devices: list[sysfs.RdmaDevice], uverbs: dict[int, str], view: list[dict[str, Any]]
) -> dict[str, dict[str, Any]]:
    """/dev/infiniband/uverbsN -> the RDMA device behind it, in /pods' device shape."""
    by_name = {row["if_name"]: row for row in view}
    out = {}
    for n, name in uverbs.items():
        row = by_name.get(name)
        out[f"/dev/infiniband/uverbs{n}"] = {
            "name": name,
            "id": row["if_index"] if row else -1,
            "kind": "RDMA",
            "uuid": row["node_guid"] if row else "",
        }
    return out


IDENTITY = ("namespace", "pod", "container", "workload")
MAX_QP_SERIES = 1000  # lens_rdma_queue_pairs series; QPs beyond are counted, not labelled


QpRows = list[tuple[resources.QueuePair, dict[str, str]]]  # each QP with who holds it


def qp_rows(
    qps: list[resources.QueuePair],
    identify: Callable[[int], dict[str, str]],
    first_port: dict[str, int],
) -> QpRows:
    """Each QP with who holds it: the pod identity of its process (empty for the host's
    processes and the kernel's QPs); a QP the kernel gave no port (5.10) on its device's
    first port."""
    cache: dict[int, dict[str, str]] = {}
    out = []
    for qp in qps:
        who = {}
        if qp.pid is not None:
            who = cache.get(qp.pid) or cache.setdefault(qp.pid, identify(qp.pid))
        if qp.port is None:
            qp = dataclasses.replace(qp, port=first_port.get(qp.device, 0))
        out.append((qp, who))
    return out


def qp_metrics(rows: QpRows) -> list[Metric]:
    """lens_rdma_queue_pairs{device,port,type,comm,namespace,pod,container,workload}: QPs
    open now, bounded; the rest in lens_rdma_queue_pairs_unlabelled."""
    counts: dict[tuple[str, ...], int] = {}
    over = 0
    for qp, who in rows:
        key = (qp.device, str(qp.port), qp.type, qp.comm, *(who.get(k, "") for k in IDENTITY))
        if key in counts or len(counts) < MAX_QP_SERIES:
            counts[key] = counts.get(key, 0) + 1
        else:
            over += 1
    fam = gauge(
        "lens_rdma_queue_pairs",
        "Queue pairs open now, by the process (comm) and "
        "pod that created them; the kernel's own under their comm",
    )
    for key, n in sorted(counts.items()):
        fam.add(dict(zip(("device", "port", "type", "comm", *IDENTITY), key, strict=True)), n)
    unl = gauge(
        "lens_rdma_queue_pairs_unlabelled",
        f"Queue pairs beyond the " f"{MAX_QP_SERIES} labelled series",
    )
    unl.add({}, over)
    return [fam, unl]


class RdmaCollector(PeriodicCollector):
    name = "rdma"

    def __init__(
        self,
        interval: float,
        sysfs_root: Path = Path("/sys"),
        runner: Callable[[], str] | None = None,
        rdma: Callable[..., str] | None = None,
        identify: Callable[[int], dict[str, str]] | None = None,
        bind: Callable[[str, int], str] | None = None,
    ) -> None:
        super().__init__(interval)
        self.sysfs_root = sysfs_root
        self.runner = runner  # `rdma statistic`; None: no rdma tool; sysfs only
        self.rdma = rdma  # rdma(*args) -> `rdma -j ARGS`'s output; None: no rdma tool
        self.identify = identify or (lambda pid: {})
        # per-QP counters (opt in): bind(device, port) turns on auto binding -> "" or why
        # not; each port is asked once
        self.bind = bind
        self.bound: dict[tuple[str, int], str] = {}
        # (container_id, device) -> QPs, for container_start-like open/close events
        self.holders: dict[tuple[str, str], tuple[int, dict[str, str]]] = {}
        self.publish: Callable[[RdmaUse], object] = lambda _ev: None
        self.on_devices: Callable[[list[sysfs.RdmaDevice]], object] = lambda _devs: None

    def refresh(self) -> list[Metric]:
        devices = sysfs.read_devices(self.sysfs_root)
        self.on_devices(devices)
        stats: list[statistic.PortStats] = []
        links: list[resources.Link] = []
        rows: QpRows | None = None
        rdma = self.rdma
        if devices and self.runner is not None:
            stats = self._tool("statistic", statistic.parse, self.runner) or []
        first_port = {d.name: d.ports[0].number for d in devices if d.ports}
        if devices and rdma is not None:
            links = self._tool("link", resources.parse_links, lambda: rdma("link", "show")) or []
            qps = self._tool(
                "resource", resources.parse_qps, lambda: rdma("resource", "show", "qp")
            )
            rows = qp_rows(qps, self.identify, first_port) if qps is not None else None
        for d in devices:  # rxe and siw have no device/net in sysfs; `rdma link` says
            if not d.netdev:
                d.netdev = next(
                    (ln.netdev for ln in links if ln.device == d.name and ln.netdev), ""
                )
        by_port: dict[tuple[str, int], list[dict[str, Any]]] | None = None
        if rows is not None:
            by_port = {}
            for qp, who in rows:
                by_port.setdefault((qp.device, qp.port or 0), []).append(
                    {
                        "lqpn": qp.lqpn,
                        "type": qp.type,
                        "state": qp.state,
                        "pid": qp.pid,
                        "comm": qp.comm,
                        **{k: who.get(k, "") for k in (*IDENTITY, "container_id")},
                    }
                )
            self._changes(rows)
        self.views["rdma"] = rest_view(devices, stats, links, by_port)
        self.views["uverbs"] = sysfs.uverbs_map(self.sysfs_root)
        self.views["devices"] = uverbs_devices(devices, self.views["uverbs"], self.views["rdma"])
        if not devices:
            log.debug("rdma: no devices under %s", self.sysfs_root / "class/infiniband")
        qp_fams = qp_metrics(rows) if rows is not None else []
        if devices and rdma is not None and self.bind is not None:
            qp_fams += self._qp_counters(devices, rdma)
        return device_metrics(devices) + stat_metrics(stats) + qp_fams

    def _qp_counters(
        self, devices: list[sysfs.RdmaDevice], rdma: Callable[..., str]
    ) -> list[Metric]:
        """lens_rdma_qp_counter_total{device,port,counter,comm,namespace,pod,container,
        workload}: the per-QP counters the driver keeps, summed per process name and pod;
        lens_rdma_qp_counters_bound{device,port} says where binding took."""
        assert self.bind is not None
        for d in devices:
            for p in d.ports:
                if (d.name, p.number) not in self.bound:
                    why = self.bind(d.name, p.number)
                    self.bound[(d.name, p.number)] = why
                    if why:
                        log.info("rdma: no per-QP counters on %s/%d: %s", d.name, p.number, why)
        got = (
            self._tool("statistic qp", qp_counters.parse, lambda: rdma("statistic", "qp", "show"))
            or []
        )
        sums: dict[tuple[str, ...], int] = {}
        for c in got:
            who = self.identify(c.pid) if c.pid is not None else {}
            for name, value in c.counters.items():
                key = (c.device, str(c.port), name, c.comm, *(who.get(k, "") for k in IDENTITY))
                if key in sums or len(sums) < MAX_QP_SERIES:
                    sums[key] = sums.get(key, 0) + value
        fam = counter(
            "lens_rdma_qp_counter",
            "Per-QP hardware counters (collectors.rdma." "qp_counters), summed per process and pod",
        )
        for key, value in sorted(sums.items()):
            fam.add(
                dict(zip(("device", "port", "counter", "comm", *IDENTITY), key, strict=True)), value
            )
        bound = gauge(
            "lens_rdma_qp_counters_bound",
            "1 where per-QP counters were bound " "(auto, by QP type), 0 where the driver refused",
        )
        for (dev, port), why in sorted(self.bound.items()):
            bound.add({"device": dev, "port": str(port)}, 0 if why else 1)
        return [fam, bound]

    def _changes(self, rows: QpRows) -> None:
        """An event when a container opens its first QP on a device, and when it has
        closed its last."""
        now: dict[tuple[str, str], tuple[int, dict[str, str]]] = {}
        for qp, who in rows:
            if who.get("container_id"):
                n, _ = now.get((who["container_id"], qp.device), (0, who))
                now[(who["container_id"], qp.device)] = (n + 1, who)
        for key in sorted(now.keys() - self.holders.keys()):
            n, who = now[key]
            self.publish(
                RdmaUse(kind="rdma_open", device=key[1], queue_pairs=n, **owner_fields(who))
            )
        for key in sorted(self.holders.keys() - now.keys()):
            self.publish(
                RdmaUse(
                    kind="rdma_close",
                    device=key[1],
                    queue_pairs=0,
                    **owner_fields(self.holders[key][1]),
                )
            )
        self.holders = now

    def _tool(self, what: str, parse: Callable[[str], Any], run: Callable[[], str]) -> Any:
        """parse(run()) of one rdma tool command, or None with the error counted."""
        try:
            return parse(run())
        except subprocess.TimeoutExpired:
            self.count_error("timeout")
        except OSError as exc:
            log.warning("rdma %s: %s", what, exc)
            self.count_error("command")
        except resources.ToolOutputError as exc:
            log.warning("rdma %s: unparsable output: %s", what, exc)
            self.count_error("parse")
        return None


class RdmaSettings(Settings):
    interval_seconds: float = Field(5.0, gt=0)
    queue_pairs: bool = True  # resource tracking (`rdma resource show qp`) and `rdma link`
    # per-QP counters: binds them (`rdma statistic qp set link D/P auto type on`), which
    # changes the device's counter mode for everyone; off unless asked for
    qp_counters: bool = False
    tool: str = "rdma"
    timeout_seconds: float = Field(5.0, gt=0)


@register("rdma", order=30, settings={"rdma": RdmaSettings})
class RdmaFeature(CollectorFeature):
    """/sys/class/infiniband and `rdma statistic show`; the /rdma route."""

    VIEWS = {"/rdma": ("rdma", [])}

    def make(self) -> RdmaCollector:
        c = self.ctx.settings("rdma", RdmaSettings)
        tool = shutil.which(c.tool)
        runner = None
        if tool:

            def runner() -> str:
                return resources.run_rdma(tool, c.timeout_seconds, "statistic", "show")

        tool_json = None
        if tool and c.queue_pairs:

            def tool_json(*args: str) -> str:
                return resources.run_rdma(tool, c.timeout_seconds, *args)

        bind = None
        if tool and c.qp_counters:

            def bind(device: str, port: int) -> str:
                return qp_counters.bind_auto(tool, device, port, c.timeout_seconds)

        rdma = RdmaCollector(
            c.interval_seconds,
            Path(self.ctx.devices.sysfs_root),
            runner,
            tool_json,
            identify=self.ctx.enrich.pid,
            bind=bind,
        )
        rdma.publish = self.ctx.bus.publish
        watch, node = self.ctx.watch, self.ctx.node.name
        watch.expect("rdma")
        rdma.on_devices = lambda devs: watch.update("rdma", inventory.rdma_records(devs, node))
        self.ctx.offers.rdma_devices = lambda: rdma.views.get("devices", {})
        return rdma
