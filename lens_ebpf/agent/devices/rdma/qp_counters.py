"""Per-QP hardware counters (`rdma statistic qp`), where the driver binds them (mlx5).

A counter (`cntn`) is bound to one or more QPs of one process: in `auto` mode the kernel
binds each new QP of a given type to a counter of its own process, so a counter's values
are that process's traffic. Binding changes the device's counter mode, so lens-ebpf does
it only when asked (`collectors.rdma.qp_counters`): `rdma statistic qp set link DEV/PORT
auto type on`. Drivers without per-QP counters (rxe, siw) refuse or bind nothing; the
metrics are then absent, never zero.

    $ rdma statistic qp show
    link mlx5_2/1 cntn 4 qp-type RC pid 30892 comm ib_send_bw rx_write_requests 0 ...
        LQPN: <178>
    $ rdma -j statistic qp show
    [{"ifindex":0,"ifname":"mlx5_2","port":1,"cntn":4,"qp-type":"RC","pid":30892,
      "comm":"ib_send_bw","rx_write_requests":0,...,"lqpn":[178]}]
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field

from lens_ebpf.agent.devices.rdma.resources import ToolOutputError, json_objects

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
META = {"ifindex", "ifname", "port", "cntn", "qp-type", "pid", "comm", "lqpn"}


class QpCounterParseError(ToolOutputError):
    """Output that is not what `rdma statistic qp show` prints."""


@dataclass(frozen=True)
class QpCounter:
    device: str
    port: int
    cntn: int
    qp_type: str
    pid: int | None
    comm: str
    counters: dict[str, int] = field(default_factory=dict)
    lqpns: tuple[int, ...] = ()


def parse_json(text: str) -> list[QpCounter]:
    out = []
    for item in json_objects(text, "statistic qp show", QpCounterParseError):
        if not all(k in item for k in ("ifname", "port", "cntn")):
            raise QpCounterParseError(f"counter without ifname/port/cntn: {str(item)[:60]}")
        counters = {
            k: v
            for k, v in item.items()
            if k not in META and NAME.match(k) and isinstance(v, int) and not isinstance(v, bool)
        }
        lqpn = item.get("lqpn", [])
        pid = item.get("pid")
        out.append(
            QpCounter(
                str(item["ifname"]),
                int(item["port"]),
                int(item["cntn"]),
                str(item.get("qp-type", "")),
                pid if isinstance(pid, int) else None,
                str(item.get("comm", "")).strip("[]"),
                counters,
                tuple(q for q in lqpn if isinstance(q, int)) if isinstance(lqpn, list) else (),
            )
        )
    return out


def parse_text(text: str) -> list[QpCounter]:
    """The text form: a `link DEV/PORT cntn N [qp-type T] [pid P] comm C name value ...`
    line, then an indented `LQPN: <n,n>` line."""
    out: list[QpCounter] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words:
            continue
        if words[0] == "LQPN:" and out:
            qpns = line.split("<", 1)[-1].rstrip(">").strip()
            last = out[-1]
            out[-1] = QpCounter(
                last.device,
                last.port,
                last.cntn,
                last.qp_type,
                last.pid,
                last.comm,
                last.counters,
                tuple(int(q) for q in qpns.split(",") if q.strip().isdigit()),
            )
            continue
        if words[0] != "link" or len(words) < 4 or "/" not in words[1] or words[2] != "cntn":
            raise QpCounterParseError(f"line {lineno}: expected 'link DEV/PORT cntn N ...'")
        device, _, port = words[1].rpartition("/")
        meta: dict[str, str] = {}
        rest = words[2:]
        counters: dict[str, int] = {}
        for name, value in zip(rest[::2], rest[1::2], strict=False):
            if name in ("cntn", "qp-type", "pid", "comm"):
                meta[name] = value
            elif NAME.match(name) and value.isdigit():
                counters[name] = int(value)
            else:
                raise QpCounterParseError(f"line {lineno}: bad counter {name!r} {value!r}")
        if len(rest) % 2 or not port.isdigit() or not meta.get("cntn", "").isdigit():
            raise QpCounterParseError(f"line {lineno}: fields do not pair up")
        pid = meta.get("pid", "")
        out.append(
            QpCounter(
                device,
                int(port),
                int(meta["cntn"]),
                meta.get("qp-type", ""),
                int(pid) if pid.isdigit() else None,
                meta.get("comm", "").strip("[]"),
                counters,
            )
        )
    return out


def parse(text: str) -> list[QpCounter]:
    return parse_json(text) if text.lstrip().startswith("[") else parse_text(text)


def bind_auto(tool: str, device: str, port: int, timeout: float) -> str:
    """Turns on automatic per-QP counters by QP type on one port; "" when done, else why
    not (the driver has none, an older iproute2)."""
    res = subprocess.run(
        [tool, "statistic", "qp", "set", "link", f"{device}/{port}", "auto", "type", "on"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return "" if res.returncode == 0 else (res.stderr.strip() or f"exit {res.returncode}")
