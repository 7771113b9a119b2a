"""The two ways records leave a ring buffer (bpf.ring_reader): a pass over the ring's own
mapping (lens_ebpf/agent/bpf/ringbuf.py) and BCC's callback per record. Both deliver every
record in order; a record whose handling fails is counted as lost and the next goes on."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from lens_ebpf.agent import config
from lens_ebpf.agent.bpf import ringbuf
from lens_ebpf.agent.bpf.layouts import c_text
from lens_ebpf.agent.bpf.loader import BpfLoader
from lens_ebpf.agent.containers.cgroups import CgroupIndex
from lens_ebpf.agent.containers.resolver import ContainerResolver
from lens_ebpf.agent.containers.runtime import ContainerdState
from lens_ebpf.agent.enrich import Enrichment
from lens_ebpf.agent.events import EventBus
from lens_ebpf.agent.metrics.cache import MetricCache
from lens_ebpf.agent.processes.proc_events import _PROC_EVENT, EV_EXEC, ProcEvents
from tests.bpf.conftest import polling
from tests.conftest import EMULATED, wait_for

pytestmark = pytest.mark.bpf


# the readers meet the kernel's ring buffer; the encoders are user space alone, so the
# kernel matrix's guests (an emulated CPU, a compile each) run the python encoder's on the
# host only
@pytest.fixture(
    params=[
        ("mapped", "compiled"),
        pytest.param(
            ("mapped", "python"),
            marks=pytest.mark.skipif(
                EMULATED, reason="the python encoder is user space alone: host only"
            ),
        ),
        ("callback", "compiled"),
    ],
    ids="-".join,
)
def procs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ProcEvents]:
    reader, encoder = request.param
    if reader == "mapped" and (why := ringbuf.available()):
        pytest.skip(why)
    cfg = config.load(None, env={"LENS_BPF__RING_READER": reader})
    loader = BpfLoader()
    resolver = ContainerResolver(CgroupIndex.for_host(), ContainerdState(tmp_path / "none"))
    p = ProcEvents(
        cfg.bpf, MetricCache(3600, 1000), EventBus(10000), loader, Enrichment(resolver), encoder
    )
    assert p.start(), loader.status
    assert (p.ring is not None) == (reader == "mapped")
    assert p.encoder.startswith(encoder), p.encoder
    with polling(p, loader):
        yield p


def test_every_record_in_order_and_a_failed_one_counted(procs: ProcEvents, tmp_path) -> None:
    """Three runs of a program under a name of its own: the first exec's record makes the
    handler fail (counted as lost, with its reason); every other record of the runs comes,
    in the order the kernel wrote them."""
    name = f"rb{uuid.uuid4().hex[:10]}"
    probe = tmp_path / name
    shutil.copy("/bin/true", probe)
    handle, handle_batch = procs._handle, procs._handle_batch
    failed: list[int] = []

    def spoiled(rec: bytes) -> bool:
        fields = _PROC_EVENT.unpack_from(rec)
        if fields[2] == EV_EXEC and c_text(fields[9]).endswith(name) and not failed:
            failed.append(fields[3])
            return True
        return False

    def failing_once(rec: bytes) -> None:  # the Python path's handler fails on it
        if spoiled(rec):
            raise ValueError("a record this test makes unreadable")
        handle(rec)

    def failing_once_compiled(recs: bytes | list[bytes]) -> None:  # the compiled path: cut
        assert handle_batch is not None
        if isinstance(recs, bytes):  # whole records back to back (native.ring_take)
            size = _PROC_EVENT.size
            recs = [recs[i : i + size] for i in range(0, len(recs), size)]
        handle_batch([rec[:40] if spoiled(rec) else rec for rec in recs])

    procs._handle = failing_once
    if handle_batch is not None:
        procs._handle_batch = failing_once_compiled
    sub = procs.bus.subscribe("t", accept=lambda e: e.get("comm") == name, maxsize=1000)
    try:
        for _ in range(3):
            subprocess.run([str(probe)], check=True)
        got: list = []

        def all_came() -> bool:
            while (ev := sub.get(0)) is not None:
                got.append(ev)
            return len(got) >= 5

        wait_for(all_came, "five records of three runs, one failed")
    finally:
        procs.bus.unsubscribe(sub)
        procs._handle, procs._handle_batch = handle, handle_batch
    assert [e["kind"] for e in got] == [
        "process_exit",
        "process_exec",
        "process_exit",
        "process_exec",
        "process_exit",
    ]
    assert got[0]["pid"] == failed[0]  # the failed exec's process still ends on record
    assert [e["pid"] for e in got[1:]] == [
        got[1]["pid"],
        got[1]["pid"],
        got[3]["pid"],
        got[3]["pid"],
    ]
    assert procs.handler_errors == 1
    assert procs.loader.event_counts()["proc_events"][1]["handler_error"] == 1
    if procs.ring is not None:  # the reader leaves nothing behind what it delivered (a busy
        # machine's other processes keep writing: the ring is seldom empty)
        ring, written = procs.ring, procs.ring._prod[0]
        wait_for(lambda: ring._cons[0] >= written, "the reader takes what was written")
