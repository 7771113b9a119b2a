"""The fuzz of issue 69, bounded and seeded (tests/fuzzlab.py): every route of the recorder's
route tables with generated parameters, path values and bodies, the collector port's streams
and the agent's gRPC calls with generated messages, authenticated and not; no 5xx, no
traceback or error logged, the service answering /readyz after each. On SQLite, and
PostgreSQL with fewer examples a route. bench/fuzz.py runs the same longer."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests import fuzzlab, pglab

# examples a route (LENS_FUZZ_EXAMPLES=N for more); the whole file about a minute here
EXAMPLES = {"sqlite": 5, "postgresql": 2}
SCALE = int(os.environ.get("LENS_FUZZ_EXAMPLES", "0"))
TARGETS = fuzzlab.targets()
# the services' threads (jitter, backoff) use the random module while examples are drawn
pytestmark = [
    pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisDeprecationWarning"),
    pytest.mark.filterwarnings("ignore:label\\(\\) is deprecated:DeprecationWarning"),
]


@pytest.fixture(scope="module")
def logged() -> Iterator[fuzzlab.Logged]:
    with fuzzlab.Logged() as got:
        yield got


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def recorder(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, logged: fuzzlab.Logged
) -> Iterator[fuzzlab.RecorderUnderFuzz]:
    tmp = tmp_path_factory.mktemp("fuzz")
    pg = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp / 'recorder.db'}"
    else:
        why = pglab.unavailable()
        if why:
            pytest.skip(why)
        pg = pglab.Postgres().init()
        url = pg.create_database("lens_fuzz")
    app = fuzzlab.RecorderUnderFuzz(url, tmp, logged)
    app.examples = SCALE or EXAMPLES[request.param]
    yield app
    app.close()
    if pg is not None:
        pg.destroy()


@pytest.mark.parametrize("target", TARGETS, ids=str)
def test_no_input_answers_5xx_or_logs_a_traceback(
    recorder: fuzzlab.RecorderUnderFuzz, target: fuzzlab.Target
) -> None:
    recorder.fuzz_route(target, recorder.examples)


def test_the_collector_port_takes_any_stream(recorder: fuzzlab.RecorderUnderFuzz) -> None:
    recorder.fuzz_collector(SCALE or 15 * recorder.examples)


def test_the_agents_port_takes_any_call(
    tmp_path_factory: pytest.TempPathFactory, logged: fuzzlab.Logged
) -> None:
    agent = fuzzlab.AgentUnderFuzz(tmp_path_factory.mktemp("agent"), logged)
    try:
        agent.fuzz(SCALE or 40)
    finally:
        agent.close()


# -- what the fuzz found ----------------------------------------------------------------------
def test_a_message_that_does_not_decode_ends_the_stream_saying_so() -> None:
    """A Report stream whose second message is not an Event ended OK, acknowledging the
    first and silently dropping the third: the reporter never heard why. Now
    INVALID_ARGUMENT, what came before held and acknowledged."""
    import io

    import grpc

    from lens_ebpf.protocol.collector_server import CollectorServer, EventReceiver
    from lens_ebpf.protocol.gen import lens_pb2 as pb

    out = io.StringIO()
    server = CollectorServer(EventReceiver(out), "127.0.0.1:0", None)
    frames = [
        pb.Event(seq=1, oom_kill=pb.OomKill(pid=1)).SerializeToString(),
        b"\xff" * 10,
        pb.Event(seq=2, oom_kill=pb.OomKill(pid=2)).SerializeToString(),
    ]
    acks = []
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            call = ch.stream_stream(
                "/lens.v1.CollectorService/Report",
                request_serializer=None,
                response_deserializer=pb.Ack.FromString,
            )
            with pytest.raises(grpc.RpcError) as got:
                for ack in call(iter(frames), metadata=[("lens-node", "gpu-1")], timeout=10):
                    acks.append(ack.seq)
    finally:
        server.stop()
    assert got.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a lens.v1.Event" in (got.value.details() or "")
    assert acks == [0, 1]
    assert [int(json.loads(line)["seq"]) for line in out.getvalue().splitlines()] == [1]


def test_a_nul_in_an_agents_string_is_stored(recorder_app: Any, db_url: str) -> None:
    """An event whose strings held a NUL (a pod name, a device's model) was refused by
    PostgreSQL's text and jsonb: the write dropped, an error logged, the node's
    acknowledgement held back. Now stored with U+FFFD, on both databases."""
    from lens_ebpf.protocol.gen import lens_pb2 as pb
    from tests.recorder.conftest import rows
    from tests.recorder.test_node_events import report

    app = recorder_app(db_url)
    ident = pb.Identity(namespace="ml", pod="bert\x00-0", pod_uid="uid-\x00", container="c")
    gpu = pb.DeviceChange(
        device_kind="gpu", vendor="amd", slot="0000:15:00.0", key="k\x00", model="MI300X\x00"
    )
    events = [
        pb.Event(
            seq=1,
            ts_unix_nano=1_795_000_000_000_000_000,
            oom_kill=pb.OomKill(pid=1, comm="py\x00thon", identity=ident),
        ),
        pb.Event(
            seq=2,
            ts_unix_nano=1_795_000_000_000_000_001,
            device_inventory=pb.DeviceInventory(devices=[gpu]),
        ),
    ]
    assert report(app.collect_port, "gpu-1", events)[-1] == 2  # both held
    got = rows(db_url, "node_events")
    assert [(r["seq"], r["pod"], r["pod_uid"]) for r in got] == [
        (1, "bert\ufffd-0", "uid-\ufffd"),
        (2, "", ""),
    ]
    assert got[0]["payload"]["comm"] == "py\ufffdthon"
    assert [(d["key"], d["model"]) for d in rows(db_url, "node_devices")] == [
        ("k\ufffd", "MI300X\ufffd")
    ]
