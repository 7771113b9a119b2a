"""The compiled event path (lens_ebpf/agent/native) against the Python path it stands in
for: the same ring records through both give the same wire bytes and the same events,
record by record, for every field's range; what it cannot handle is counted; the bus
hands its events to each kind of subscriber as the Python path's."""

import ctypes
import dataclasses
import importlib.util
import random
import re
import socket
import tomllib
from pathlib import Path

import pytest

from lens_ebpf.agent import native
from lens_ebpf.agent.bpf.layouts import FlowEvent
from lens_ebpf.agent.events import EventBus, EventFilter, FlowClosed
from lens_ebpf.agent.net.policy import CLASS_NAMES
from lens_ebpf.agent.stream import convert
from lens_ebpf.agent.tcp import decode
from lens_ebpf.protocol.gen import lens_pb2 as pb

NODE = ("gpu-node-7", "10.1.2.3")
HEAD = pb.Event(node_name=NODE[0], node_ip=NODE[1]).SerializeToString()


@pytest.fixture(scope="module")
def mod():
    got, why = decode.compiled_flows()
    # scripts/setup.sh builds it (make test runs it first): missing here is a broken build
    assert got is not None, why
    return got


def record(rng: random.Random, **fields: object) -> bytes:
    """A struct flow_event with every field drawn over its whole range (edges often)."""

    def num(bits: int) -> int:
        return rng.choice([0, 1, 127, 128, 16383, 16384, (1 << bits) - 1, rng.getrandbits(bits)])

    ev = FlowEvent()
    for name in ("ts_ns", "duration_ns", "sent", "recv", "cgroup_id"):
        setattr(ev, name, num(64))
    ev.pid, ev.retrans = num(32), num(32)
    ev.lport, ev.rport = num(16), num(16)
    ev.family = rng.choice([socket.AF_INET, socket.AF_INET6])
    for name in ("laddr", "raddr"):
        raw = rng.randbytes(16)
        if ev.family == socket.AF_INET:
            raw = bytes(10) + b"\xff\xff" + raw[12:]
        getattr(ev, name)[:] = list(raw)
    ev.direction = rng.choice([0, 1, 2, 255])
    ev.cls = rng.choice([*CLASS_NAMES, 0, 9, 200, 255])
    ev.reason = rng.choice([*range(len(decode.CLOSE_REASONS)), 6, 99, 255])
    ev.comm = rng.choice(
        [
            b"",
            b"curl",
            b"python3.11",
            b"x" * 16,
            b"caf\xc3\xa9",
            b"bad\xff\xfeutf8",
            b"a\x00hidden",
            rng.randbytes(16),
        ]
    )
    for name, value in fields.items():
        setattr(ev, name, value)
    return bytes(ev)


def python_path(rec: bytes, seq: int, ts: int, extra: dict | None, kind: str) -> FlowClosed:
    """What tcp_flows publishes for the record through the Python path: decoded,
    enriched (Enrichment.flow), its kind, numbered (EventBus.publish)."""
    ev = decode.flow_record(rec)
    if extra is not None:
        ev = dataclasses.replace(ev, **extra)
    if kind != ev.kind:
        ev = dataclasses.replace(ev, kind=kind)
    object.__setattr__(ev, "seq", seq)
    object.__setattr__(ev, "ts_unix_nano", ts)
    return ev


def test_layout_is_the_programs(mod) -> None:
    layout = mod.flow_event_layout()
    assert layout["size"] == ctypes.sizeof(FlowEvent) == 104
    for name, *_ in FlowEvent._fields_:
        assert layout[name] == getattr(FlowEvent, name).offset, name


@pytest.mark.parametrize("seed", range(4))
def test_same_bytes_and_events_as_the_python_path(mod, seed: int) -> None:
    rng = random.Random(seed)
    records = [record(rng) for _ in range(3000)]
    seq0, ts = rng.getrandbits(40) + 1, 1_700_000_000_000_000_000 + seed
    events, bad, err = mod.flows(records, seq0, ts, HEAD, None, None)
    assert (bad, err) == (0, None)
    assert len(events) == len(records)
    # the same records back to back, as native.ring_take hands them over
    blob, *_ = mod.flows(b"".join(records), seq0, ts, HEAD, None, None)
    assert [(e.seq, e._wire, e.record) for e in blob] == [
        (e.seq, e._wire, e.record) for e in events
    ]
    with pytest.raises(ValueError, match="not whole"):
        mod.flows(b"".join(records)[:-1], seq0, ts, HEAD, None, None)
    for i, (rec, got) in enumerate(zip(records, events, strict=True)):
        want = python_path(rec, seq0 + i, ts, None, "flow_closed")
        assert (got.kind, got.seq, got.ts_unix_nano, got.record) == (
            "flow_closed",
            seq0 + i,
            ts,
            rec,
        )
        # the Python path's encode, and protobuf's own serialization of the message
        assert got._wire == convert.encode(want, *NODE), (i, want)
        assert got._wire == convert.to_pb(want, *NODE).SerializeToString()
        made = got.event()
        assert made == want and made._wire == got._wire


def test_an_ipv4_peer_of_a_dual_stack_socket_is_spelled_as_the_python_path_does(mod) -> None:
    """An AF_INET6 socket's IPv4 peer (::ffff:a.b.c.d): a.b.c.d on the wire, in what
    enrichment is asked and in the event, as tcp/decode.py spells it."""
    rng = random.Random(5)
    mapped = bytes(10) + b"\xff\xff"
    records = [
        record(
            rng,
            family=socket.AF_INET6,
            laddr=(ctypes.c_uint8 * 16)(*mapped, 10, 213, 128, 9),
            raddr=(ctypes.c_uint8 * 16)(*mapped, 10, 213, 128, i),
        )
        for i in range(4)
    ]
    asked: list[tuple[str, str]] = []

    def enrich(cls: str, raddr: str, laddr: str) -> dict:
        asked.append((raddr, laddr))
        return {}

    events, bad, err = mod.flows(records, 1, 5, HEAD, enrich, None)
    assert (bad, err) == (0, None)
    assert asked == [(f"10.213.128.{i}", "10.213.128.9") for i in range(4)]
    for i, (rec, got) in enumerate(zip(records, events, strict=True)):
        want = python_path(rec, 1 + i, 5, {}, "flow_closed")
        assert (want.family, want.raddr, want.laddr) == ("ipv4", f"10.213.128.{i}", "10.213.128.9")
        assert got._wire == convert.encode(want, *NODE)
        assert got.event() == want


def test_enrichment_and_abnormal_flows(mod) -> None:
    rng = random.Random(7)
    records = [record(rng) for _ in range(400)]
    asked: list[tuple[str, str, str]] = []

    def enrich(cls: str, raddr: str, laddr: str) -> dict:
        asked.append((cls, raddr, laddr))
        n = len(asked)
        out = {
            "cls": "k8sPod" if n % 2 else cls,
            "remote_namespace": "ns" * (n % 3),
            "remote_pod": f"pod-{n}" if n % 5 else "",
            "remote_workload_kind": "Job",
            "remote_workload": "train" * (n % 2),
            "remote_service": "",
            "namespace": "é" * (n % 4),
            "pod": "p" * (n % 300),
        }
        if n % 7 == 0:
            out.update(workload_kind="Deployment", workload="web")
        return out

    def abnormal(raddr: str) -> bool:
        return raddr.endswith(("1", "3", "5"))

    seq0, ts = 10, 123
    events, bad, err = mod.flows(records, seq0, ts, HEAD, enrich, abnormal)
    assert (bad, err) == (0, None)
    # the Python path, with the same answers (enrich is asked once a record, in order)
    expect: list[FlowClosed] = []
    seq = seq0
    for rec, (cls, raddr, laddr), extra in zip(
        records, asked, (e.extra for e in events if e.kind == "flow_closed"), strict=True
    ):
        base = decode.flow_record(rec)
        assert (cls, raddr, laddr) == (base.cls, base.raddr, base.laddr)
        expect.append(python_path(rec, seq, ts, extra, "flow_closed"))
        seq += 1
        if abnormal(raddr):
            expect.append(python_path(rec, seq, ts, extra, "abnormal_flow"))
            seq += 1
    assert 0 < sum(e.kind == "abnormal_flow" for e in expect) < len(records)
    assert [e.seq for e in events] == list(range(seq0, seq))
    for got, want in zip(events, expect, strict=True):
        assert got.kind == want.kind
        assert got._wire == convert.encode(want, *NODE)
        assert got.event() == want


def test_what_it_cannot_handle_is_counted(mod) -> None:
    rng = random.Random(3)
    good = [record(rng) for _ in range(5)]
    short = good[0][:50]
    events, bad, err = mod.flows([good[0], short, good[1], b"", good[2]], 1, 5, HEAD, None, None)
    assert bad == 2 and isinstance(err, ValueError) and "50 bytes" in str(err)
    assert [e.seq for e in events] == [1, 2, 3]  # numbered without holes
    assert [e.record for e in events] == good[:3]

    calls = 0

    def enrich(cls: str, raddr: str, laddr: str) -> object:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise KeyError("index gone")
        return [] if calls == 4 else {}

    events, bad, err = mod.flows(good, 1, 5, HEAD, enrich, None)
    assert bad == 2 and isinstance(err, KeyError)  # the first error of the batch
    assert len(events) == 3

    def broken(raddr: str) -> bool:
        raise RuntimeError("policy")

    events, bad, err = mod.flows(good[:2], 1, 5, HEAD, None, broken)
    # each flow published before its abnormal check failed, as _publish does
    assert bad == 2 and isinstance(err, RuntimeError)
    assert [e.kind for e in events] == ["flow_closed", "flow_closed"]
    with pytest.raises(TypeError):
        mod.flows(5, 1, 5, HEAD, None, None)


def test_bus_hands_compiled_events_to_each_kind_of_subscriber(mod) -> None:
    rng = random.Random(11)
    records = [record(rng, cls=next(iter(CLASS_NAMES))) for _ in range(50)]
    bus = EventBus(queue_size=30, history=1000, node=NODE)
    raw_all = bus.subscribe("raw", raw=True)
    flows_only = bus.subscribe(
        "kinds", accept=EventFilter(kinds=frozenset({"abnormal_flow"})), raw=True
    )
    python = bus.subscribe("python", maxsize=100)
    comm = bus.subscribe("comm", accept=EventFilter(comm="curl"), maxsize=100)
    own = bus.subscribe("own", accept=lambda ev: ev.sent_bytes > 0, maxsize=100)
    bus.publish(
        FlowClosed(
            ts_ns=1,
            pid=1,
            comm="x",
            cgroup_id=1,
            family="ipv4",
            laddr="a",
            lport=1,
            raddr="b",
            rport=2,
            direction="egress",
            cls="c",
            sent_bytes=0,
            received_bytes=0,
            retransmits=0,
            duration_ns=0,
            reason="normal",
        )
    )
    made = bus.publish_batch(lambda seq, ts: mod.flows(records, seq, ts, HEAD, None, None)[0])
    assert [e.seq for e in made] == list(range(2, 52)) and bus.seq == 51
    assert bus.published["flow_closed"] == 51
    # raw: the bus's own objects; 51 into a queue of 30: the oldest 21 dropped and counted
    held = raw_all.drain(100)
    assert held == made[-30:] and raw_all.dropped == 21 and raw_all.last_dropped_seq == 21
    assert flows_only.drain(100) == []
    # the others get the Python events, equal to what the Python path publishes
    events = python.drain(100)
    assert [type(e) for e in events] == [FlowClosed] * 51
    assert events[1:] == [
        python_path(r, i + 2, made[0].ts_unix_nano, None, "flow_closed")
        for i, r in enumerate(records)
    ]
    curl = [e for e in events if e.comm == "curl"]
    assert comm.drain(100) == curl
    assert own.drain(100) == [e for e in events if e.sent_bytes > 0]
    assert python.get(timeout=0) is None
    held, gone = bus.since(40)
    assert [e.seq for e in held] == list(range(40, 52)) and gone == 0
    assert [convert.wire(e, *NODE) for e in held] == [e._wire for e in made[-12:]]


# -- process records: exec, exit, OOM kill ------------------------------------------------


class Known(dict):
    """proc_events.c's known_cgroups map, as the Python path writes it (by value)."""

    def __setitem__(self, key: object, value: object) -> None:
        super().__setitem__(key.value, value.value)  # type: ignore[attr-defined]


class Cgroups:
    """Enrichment.cgroup's answers for a few cgroups: some final, some not yet."""

    def __init__(self, rng: random.Random) -> None:
        whos = [
            {"container_id": "", "container": "", "pod": "", "namespace": "", "pod_uid": ""},
            {
                "container_id": "abc123" * 8,
                "container": "trainer",
                "pod": "llama-0",
                "namespace": "ml",
                "pod_uid": "u-1",
                "workload_kind": "PyTorchJob",
                "workload": "llama",
            },
            {
                "container_id": "d" * 64,
                "container": "é-side",
                "pod": "web-7",
                "namespace": "prod",
                "pod_uid": "u-2",
            },
        ]
        self.answers = {
            cg: (f"/kubepods/cg{cg}" if cg else "", rng.choice(whos), cg % 2 == 0)
            for cg in (0, 1, 2, 3, 77, 2**63 + 5)
        }
        self.asked = 0

    def cgroup(self, cgroup_id: int) -> tuple[str, dict, bool]:
        self.asked += 1
        return self.answers[cgroup_id]


def proc_record(rng: random.Random, pids: list[int], cgroups: list[int]) -> bytes:
    from lens_ebpf.agent.bpf.layouts import ProcEvent

    ev = ProcEvent()
    ev.ts_ns = rng.getrandbits(64)
    ev.cgroup_id = rng.choice(cgroups)
    ev.kind = rng.choice([1, 1, 2, 2, 3, 0, 9])
    ev.pid, ev.ppid = rng.choice(pids), rng.choice([0, 1, rng.getrandbits(32)])
    ev.exit_code = rng.choice([0, 1, 255, -1, -(2**31), 2**31 - 1])
    ev.signal = rng.choice([0, 0, 9, 15, -3])
    ev.flags = rng.choice([0, 4, 8, 12, 1])
    ev.comm = rng.choice([b"", b"python3", b"x" * 16, b"caf\xc3\xa9", b"bad\xff", b"a\x00b"])
    ev.filename = rng.choice([b"", b"/usr/bin/python3", b"/" + b"p" * 254, b"/bin/\xff\xfe"])
    return bytes(ev)


def procs_rig(rng_seed: int) -> object:
    """A ProcEvents with its kernel side left out: a real cache and bus, the cgroups'
    answers from Cgroups, the known_cgroups map as a dict."""
    from lens_ebpf.agent.config import BpfConfig
    from lens_ebpf.agent.metrics.cache import MetricCache
    from lens_ebpf.agent.processes import proc_events

    p = proc_events.ProcEvents.__new__(proc_events.ProcEvents)
    proc_events.RingProgram.__init__(p, loader=None)  # type: ignore[arg-type]
    p.bpf_cfg = BpfConfig(max_processes=20)
    p.cache = MetricCache(3600, 1000)
    for name in proc_events._METRICS:
        extra = ("exit_class",) if name == proc_events.EXITS else ()
        p.cache.register(name, "counter", "h", (*proc_events.IDENTITY, *extra))
    p.bus = EventBus(100000, history=100000, node=NODE)
    p.enrich = Cgroups(random.Random(rng_seed))
    p.bpf = {b"known_cgroups": Known()}
    p._comms = {}
    p.head = HEAD
    p.native = None
    return p


@pytest.mark.parametrize("seed", range(3))
def test_process_records_same_bytes_events_counts_as_the_python_path(mod, seed: int) -> None:
    from lens_ebpf.agent.processes import proc_events

    assert native.layout_differs(mod.proc_event_layout(), proc_events.layouts.ProcEvent) == ""
    compiled, why = proc_events.compiled_procs()
    assert compiled is mod, why
    rng = random.Random(seed)
    pids = [rng.getrandbits(22) for _ in range(40)]  # comms bounded at 20: some go
    cgroups = [0, 1, 2, 3, 77, 2**63 + 5]
    batches = [
        [proc_record(rng, pids, cgroups) for _ in range(rng.choice([1, 7, 300]))] for _ in range(20)
    ]
    py, nat = procs_rig(seed), procs_rig(seed)
    nat.native = mod
    nat._record_size = len(batches[0][0])
    for i, batch in enumerate(batches):
        for rec in batch:
            py._on_event(rec)
        # as a list, or back to back as native.ring_take hands them over
        nat._on_records(b"".join(batch) if i % 2 else batch)
    assert nat.events_received == py.events_received
    assert py.handler_errors == nat.handler_errors == 0
    want, got = list(py.bus.history), list(nat.bus.history)
    assert len(got) == len(want) > 500
    assert {e.kind for e in want} == {"process_exec", "process_exit", "oom_kill"}
    for w, g in zip(want, got, strict=True):
        object.__setattr__(w, "ts_unix_nano", g.ts_unix_nano)  # the bus's clock, apart
        assert g._wire == convert.encode(w, *NODE), w
        assert g._wire == convert.to_pb(w, *NODE).SerializeToString()
        assert g.event() == w
        # the record kept up to its filename's end (the history holds 100,000 of them)
        assert len(g.record) == 56 + len(g.record[56:].split(b"\0")[0])

    def counts(p: object) -> dict:  # the series and values, in any order
        return {fam.name: sorted(series) for fam, series in p.cache.snapshot()}

    assert counts(nat) == counts(py)
    assert sum(v for _, v in counts(py)[proc_events.EXITS]) > 100
    assert nat._comms == py._comms and len(nat._comms) <= 20
    assert dict(nat.bpf[b"known_cgroups"]) == dict(py.bpf[b"known_cgroups"]) != {}
    # the compiled path asks once per cgroup a batch, the Python path once a record
    assert nat.enrich.asked < py.enrich.asked


def test_process_records_it_cannot_handle_are_counted(mod) -> None:
    rng = random.Random(5)
    good = [proc_record(rng, [1, 2], [0]) for _ in range(30)]
    good = [r for r in good if r[16] in (1, 2, 3)][:4]  # kinds it publishes
    idents = {0: ("", {"pod": "x", "namespace": "n", "container": "c"})}
    events, counts, bad, err = mod.procs(
        [good[0], good[1][:40], good[2]], 1, 9, HEAD, idents, {}, 10
    )
    assert bad == 1 and isinstance(err, ValueError) and [e.seq for e in events] == [1, 2]
    events, counts, bad, err = mod.procs(good, 1, 9, HEAD, {}, {}, 10)
    assert bad == 4 and isinstance(err, KeyError) and events == [] and counts == {}
    assert mod.proc_cgroups([good[0], b"short"]) == [(0, bool(good[0][36] & 8))]


def test_ring_take_reads_what_is_committed_in_order(mod) -> None:
    """native.ring_take on a mapping laid out as the kernel lays a ring buffer out (a
    consumer page; a producer page, then the data area twice): committed records of the
    size back to back, oldest first; DISCARD ones skipped, other sizes counted, a BUSY
    one stops the pass; the consumer position moves past what was taken, and a record
    that wraps past the end reads whole."""
    import mmap
    import struct

    page, size, rec = 4096, 4096, 24
    consumer = mmap.mmap(-1, page)
    producer = bytearray(page + 2 * size)

    def put(at: int, length: int, flags: int, fill: bytes) -> int:
        """A record at position at (its header, then its data, in both copies)."""
        for base in (page, page + size):
            off = base + at % size
            struct.pack_into("<II", producer, off, length | flags, 0)
            for i, byte in enumerate(fill[:length]):
                producer[page + (at % size + 8 + i) % size] = byte
                producer[page + size + (at % size + 8 + i) % size] = byte
        return at + ((length + 8 + 7) & ~7)

    records = [bytes([n]) * rec for n in range(1, 5)]
    pos = put(0, rec, 0, records[0])
    pos = put(pos, rec, 1 << 30, b"d" * rec)  # discarded
    pos = put(pos, 10, 0, b"x" * 10)  # another size
    pos = put(pos, rec, 0, records[1])
    busy = pos
    pos = put(pos, rec, 1 << 31, records[2])  # still being written
    pos = put(pos, rec, 0, records[3])
    struct.pack_into("<Q", producer, 0, pos)
    got, other = mod.ring_take(consumer, bytes(producer), size - 1, page, rec)
    assert (got, other) == (records[0] + records[1], 1)
    assert struct.unpack_from("<Q", consumer, 0)[0] == busy
    # committed now: the rest comes, and nothing twice
    put(busy, rec, 0, records[2])
    got, other = mod.ring_take(consumer, bytes(producer), size - 1, page, rec)
    assert (got, other) == (records[2] + records[3], 0)
    assert mod.ring_take(consumer, bytes(producer), size - 1, page, rec) == (b"", 0)
    # a record that wraps around the end of the data area reads whole
    start = size - 16
    struct.pack_into("<Q", consumer, 0, start)
    end = put(start, rec, 0, records[0])
    struct.pack_into("<Q", producer, 0, end)
    assert mod.ring_take(consumer, bytes(producer), size - 1, page, rec) == (records[0], 0)
    with pytest.raises(ValueError, match="ring buffer"):
        mod.ring_take(consumer, bytes(producer), size - 2, page, rec)  # not a power of two


# -------------------------------------------------------------- named field numbers

PB_MESSAGES = ("Event", "FlowClosed", "ProcessExec", "ProcessExit", "OomKill", "Identity")


def pb_defines() -> dict[str, int]:
    text = (native.HERE / "pb_fields.h").read_text()
    return {m[1]: int(m[2]) for m in re.finditer(r"(?m)^#define (PB_\w+) (\d+)\s*$", text)}


def upper_snake(camel: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).upper()


def field_number(define: str) -> int | None:
    """The lens.v1 number a PB_<MESSAGE>_<FIELD> name stands for, None if it names none."""
    for msg in PB_MESSAGES:
        prefix = f"PB_{upper_snake(msg)}_"
        if define.startswith(prefix):
            by_name = getattr(pb, msg).DESCRIPTOR.fields_by_name
            got = by_name.get(define[len(prefix) :].lower())
            return got.number if got is not None else None
    return None


def test_each_named_field_number_is_the_protos() -> None:
    got = pb_defines()
    assert len(got) >= 30
    assert {name: field_number(name) for name in got} == got


def test_runs_of_fields_written_in_a_loop_are_consecutive() -> None:
    """_native.c writes enrichment's fields (extra_keys) from
    PB_FLOW_CLOSED_REMOTE_NAMESPACE on and Identity's (identity_keys) from
    PB_IDENTITY_CONTAINER_ID on, one number up each."""
    src = (native.HERE / "_native.c").read_text()
    for array, msg, first in (
        ("extra_keys", pb.FlowClosed, "PB_FLOW_CLOSED_REMOTE_NAMESPACE"),
        ("identity_keys", pb.Identity, "PB_IDENTITY_CONTAINER_ID"),
    ):
        body = re.search(rf"{array}\[\] = \{{(.*?)\}};", src, flags=re.S)
        assert body, array
        keys = re.findall(r'"(\w+)"', body[1])
        numbers = [msg.DESCRIPTOR.fields_by_name[k].number for k in keys]
        start = pb_defines()[first]
        assert numbers == list(range(start, start + len(keys))), array


def test_no_field_is_written_by_a_bare_number() -> None:
    src = (native.HERE / "_native.c").read_text()
    calls = re.findall(r"\b(?:put_(?:uint|int|str|pystr|identity)|pack)\(\s*&?\w+,\s*([^,]+),", src)
    assert len(calls) >= 28
    assert [c for c in calls if re.search(r"\b\d+\b", c)] == []
    assert re.findall(r"\b\d+ << 3", src) == []  # a tag made by hand


def test_setup_py_builds_it_as_the_native_module_does() -> None:
    """A wheel's module (setup.py's optional Extension) is built with the flags, include
    dirs and SOURCE_HASH of `python -m lens_ebpf.agent.native`, and the wheel ships the
    sources load() hashes, so a wheel's module loads; no compile here."""
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("lens_setup", root / "setup.py")
    assert spec is not None and spec.loader is not None
    setup_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(setup_py)  # not __main__: it calls no setup()
    ext = setup_py.extension()
    assert ext.name == "lens_ebpf.agent.native._native"
    assert ext.optional is True
    assert ext.define_macros == [("SOURCE_HASH", f'"{native.source_hash()}"')]
    assert [(root / d).resolve() for d in ext.include_dirs] == list(native.include_dirs())
    assert (root / ext.sources[0]).resolve() == native.SOURCE
    assert tuple(ext.extra_compile_args) == native.COMPILE_FLAGS
    shipped = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    hashed = {p.name for p in native.sources() if p.parent == native.HERE}
    assert hashed <= set(shipped["package-data"]["lens_ebpf.agent.native"])
