"""Typed events: the proto conversion checked against the types, the one filter, the bus."""

import dataclasses
import json

import pytest

from lens_ebpf.agent.events import (
    KINDS,
    ContainerChange,
    DeviceChange,
    DeviceInventory,
    EventBus,
    EventFilter,
    FlowClosed,
    Gap,
    GpuFault,
    NodeTuned,
    ProcessEvent,
    RdmaUse,
)
from lens_ebpf.agent.stream import convert
from lens_ebpf.protocol.gen import lens_pb2 as pb

FLOW = FlowClosed(
    ts_ns=1,
    pid=7,
    comm="curl",
    cgroup_id=3,
    family="ipv4",
    laddr="10.0.0.1",
    lport=40000,
    raddr="10.0.0.7",
    rport=443,
    direction="egress",
    cls="internalHosts",
    sent_bytes=10,
    received_bytes=20,
    retransmits=1,
    duration_ns=99,
    reason="normal",
    remote_service="web",
    pod="cli",
    namespace="apps",
)
EXEC = ProcessEvent(
    kind="process_exec",
    ts_ns=2,
    pid=8,
    ppid=1,
    comm="sh",
    cgroup_id=4,
    cgroup="/kubepods/x",
    filename="/bin/sh",
    container_id="abc123",
    container="app",
    pod="web-0",
    namespace="team-a",
    pod_uid="u",
    workload_kind="StatefulSet",
    workload="web",
)
GPU_CHANGE = DeviceChange(
    vendor="amd",
    bdf="0000:03:00.0",
    change="changed",
    device_kind="gpu",
    key="5F1A2B3C",
    index=1,
    model="AMD Instinct MI300X",
    serial="5F1A2B3C",
    driver_version="6.10.5",
    vbios_version="113-M30",
    firmware_version="",
    retired_pages_pending=True,
    fields=("serial", "vbios_version"),
    slot="0000:03:00.0",
)
RDMA_PORT = DeviceChange(
    vendor="mlx5",
    bdf="0000:41:00.0",
    change="",
    device_kind="rdma_port",
    key="mlx5_0/1",
    model="MT4129",
    firmware_version="28.39.1002",
    port_state="ACTIVE",
    link_layer="InfiniBand",
    rate="400 Gb/sec (4X NDR)",
    slot="mlx5_0/1",
)
EXAMPLES = {
    "flow_closed": FLOW,
    "abnormal_flow": dataclasses.replace(FLOW, kind="abnormal_flow"),
    "process_exec": EXEC,
    "process_exit": dataclasses.replace(EXEC, kind="process_exit", exit_code=3, signal=0),
    "oom_kill": dataclasses.replace(EXEC, kind="oom_kill"),
    "container_start": ContainerChange(
        kind="container_start",
        ts_ns=3,
        container_id="abc123",
        pod="web-0",
        devices=("/dev/dri/renderD128",),
    ),
    "container_exit": ContainerChange(kind="container_exit", ts_ns=4, container_id="abc123"),
    "device_change": GPU_CHANGE,
    "device_inventory": DeviceInventory(devices=(GPU_CHANGE, RDMA_PORT)),
    "gap": Gap(lost=5, reason="slow_subscriber"),
    "rdma_open": RdmaUse(
        kind="rdma_open",
        device="rxe0",
        queue_pairs=2,
        pod="llm-0",
        namespace="ml",
        container="trainer",
        container_id="c" * 64,
    ),
    "rdma_close": RdmaUse(
        kind="rdma_close",
        device="rxe0",
        queue_pairs=0,
        pod="llm-0",
        namespace="ml",
        container="trainer",
        container_id="c" * 64,
    ),
    "gpu_fault": GpuFault(
        gpu_index=0,
        bdf="0000:18:00.0",
        uuid="GPU-1111",
        vendor="nvidia",
        fault="xid",
        code="79",
        message="NVRM: Xid (PCI:0000:18:00): 79",
        pid=4242,
        pod="train-0",
        namespace="ml",
        workload="train",
    ),
    "node_tuned": NodeTuned(setting="vm.max_map_count", old_value=65530, new_value=262144),
}


def test_every_proto_payload_has_an_event_type_and_back() -> None:
    assert set(KINDS) == set(convert.PAYLOADS) == set(EXAMPLES)


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_every_proto_field_is_read_from_the_typed_event(kind: str) -> None:
    ev = EXAMPLES[kind]
    msg = getattr(convert.to_pb(ev, "node-a", "10.1.1.1"), kind)
    for f in msg.DESCRIPTOR.fields:
        if f.name == "identity":
            for g in pb.Identity.DESCRIPTOR.fields:
                assert getattr(msg.identity, g.name) == ev[g.name], g.name
        elif f.message_type is not None:  # events inside an event (an inventory's devices)
            sub = getattr(pb, f.message_type.name)
            assert list(getattr(msg, f.name)) == [convert.message(sub, e) for e in ev[f.name]]
            assert getattr(msg, f.name)[1].rate == "400 Gb/sec (4X NDR)"
        elif f.is_repeated:
            assert list(getattr(msg, f.name)) == list(ev[f.name]), f.name
        else:
            assert getattr(msg, f.name) == ev[f.name], f.name


def test_wire_names_and_json() -> None:
    assert FLOW["class"] == FLOW.get("class") == "internalHosts"
    d = FLOW.to_dict()
    assert d["class"] == "internalHosts" and "cls" not in d
    assert json.loads(json.dumps(d))["sent_bytes"] == 10
    with pytest.raises(KeyError):
        FLOW["no_such_field"]
    with pytest.raises(ValueError, match="no kind"):
        ProcessEvent(kind="flow_closed", ts_ns=0, pid=0, ppid=0, comm="", cgroup_id=0, cgroup="")
    with pytest.raises(dataclasses.FrozenInstanceError):
        FLOW.pid = 8  # type: ignore[misc]


def test_one_filter_for_subscribe_and_trace() -> None:
    assert EventFilter()(FLOW) and EventFilter()(EXEC)
    assert EventFilter(kinds=frozenset({"process_exec"}))(EXEC)
    assert not EventFilter(kinds=frozenset({"process_exec"}))(FLOW)
    assert EventFilter(namespace="team-a", pod="web-0", container="abc")(EXEC)
    assert EventFilter(container="app")(EXEC) and not EventFilter(container="bcd")(EXEC)
    assert not EventFilter(namespace="team-b")(EXEC)
    # class applies only to events that have one
    assert EventFilter(cls="dns")(EXEC) and not EventFilter(cls="dns")(FLOW)
    # a kernel comm holds 15 characters: a longer name given matches its first 15
    assert EventFilter(comm="curl-with-a-long-name")(
        dataclasses.replace(FLOW, comm="curl-with-a-lon")
    )
    req = pb.SubscribeRequest(kinds=["process_exec"], namespace="team-a", container="abc")
    assert convert.matcher(req) == EventFilter(
        kinds=frozenset({"process_exec"}), namespace="team-a", container="abc"
    )
    assert "unknown kind(s) 'nope'" in (convert.validate(pb.SubscribeRequest(kinds=["nope"])) or "")


def test_bus_stamps_each_event_once_in_order() -> None:
    bus = EventBus(queue_size=2, history=10)
    sub = bus.subscribe("t", accept=EventFilter(kinds=frozenset({"flow_closed"})))
    unnumbered = dataclasses.replace(FLOW)
    first, ex, second = (bus.publish(e) for e in (unnumbered, EXEC, FLOW))
    assert (first.seq, ex.seq, second.seq) == (1, 2, 3)
    assert first.ts_unix_nano > 0
    assert unnumbered.seq == 0  # numbered as a copy: an event is never changed
    assert [sub.get(0).seq, sub.get(0).seq] == [1, 3]  # type: ignore[union-attr]
    held, gone = bus.since(2)
    assert [e.seq for e in held] == [2, 3] and gone == 0
    assert bus.published == {"flow_closed": 2, "process_exec": 1}


def test_bus_says_which_kinds_a_subscriber_can_take() -> None:
    bus = EventBus(queue_size=2)
    changes: list[bool] = []
    flows = frozenset({"flow_closed", "abnormal_flow"})
    bus.on_change(lambda: changes.append(bus.wants(flows)))
    assert not bus.wants(flows)
    procs = bus.subscribe("p", accept=EventFilter(kinds=frozenset({"process_exec"})))
    assert changes == [False]
    anything = bus.subscribe("a", accept=lambda ev: True)  # a callable: it may take any kind
    assert changes == [False, True]
    bus.unsubscribe(anything)
    abn = bus.subscribe("f", accept=EventFilter(kinds=frozenset({"abnormal_flow"}), pod="x"))
    bus.unsubscribe(abn)
    bus.unsubscribe(procs)
    assert changes == [False, True, False, True, False, False]


def test_owner_fields_names_every_owner_field() -> None:
    """events.OwnerFields is the typed mirror of Owner's own fields: the two do not drift."""
    from lens_ebpf.agent.events import Event, Owner, OwnerFields, owner_fields

    own = {f.name for f in dataclasses.fields(Owner)} - {f.name for f in dataclasses.fields(Event)}
    assert set(OwnerFields.__annotations__) == own
    assert owner_fields({"pod": "p", "other": "x"}) == {**dict.fromkeys(own, ""), "pod": "p"}


def test_zero_fields_left_out_make_the_same_bytes() -> None:
    """message() passes only the fields that are not at their zero value: the bytes are
    those of the message with every field set."""
    for ev in (
        dataclasses.replace(FLOW, seq=3, ts_unix_nano=5, retransmits=0, pod=""),
        dataclasses.replace(EXEC, seq=4, ts_unix_nano=6),
    ):
        cls = convert.PAYLOADS[ev.kind]
        fields, identity = convert._PLANS[cls]
        full = {name: getattr(ev, attr) for name, attr in fields}
        if identity:
            full["identity"] = pb.Identity(**{n: getattr(ev, a) for n, a in convert._IDENTITY})
        every = pb.Event(
            seq=ev.seq,
            ts_unix_nano=ev.ts_unix_nano,
            node_name="n",
            node_ip="",
            **{ev.kind: cls(**full)},
        )
        assert convert.to_pb(ev, "n", "").SerializeToString() == every.SerializeToString()


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_encode_writes_protobufs_own_bytes(kind: str) -> None:
    """convert.encode (what every stream and the reporter send) builds the payload and the
    Event's fields apart: the bytes are those of to_pb's message, for every kind, with and
    without a sequence number, a timestamp before 1970 and an empty node."""
    for seq, ts, node in (
        (0, 0, ("", "")),
        (7, 1_764_000_000_123_456_789, ("node-a", "10.1.1.1")),
        (2**40, -5, ("nœud", "fd00::1")),
    ):
        ev = dataclasses.replace(EXAMPLES[kind], seq=seq, ts_unix_nano=ts)
        assert convert.encode(ev, *node) == convert.to_pb(ev, *node).SerializeToString()
        assert pb.Event.FromString(convert.encode(ev, *node)) == convert.to_pb(ev, *node)


@pytest.mark.parametrize("kind", sorted(EXAMPLES))
def test_maker_makes_what_the_constructor_makes(kind: str) -> None:
    """events.maker (the decoders' way, through slots) gives every type the event its own
    __init__ gives, defaults included; an event keeps no __dict__ (slots: the history's
    100,000 events, 1.4 KB each with one), and its wire encoding is no part of its value."""
    from lens_ebpf.agent.events import maker

    ev = EXAMPLES[kind]
    cls = type(ev)
    given = {f.name: getattr(ev, f.name) for f in dataclasses.fields(cls) if f.init}
    made = maker(cls)(**given)
    assert made == ev and type(made) is cls and made._wire == b""
    assert not hasattr(made, "__dict__")
    convert.wire(made, "n", "")
    assert made == ev and made._wire and "_wire" not in made.to_dict() and "_wire" not in repr(made)
    required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
    if required:  # a field without a default must be given, as to __init__
        with pytest.raises(TypeError, match=required[0]):
            maker(cls)()
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.seq = 5  # type: ignore[misc]


def test_maker_takes_named_fields_by_position() -> None:
    from lens_ebpf.agent.events import maker

    make = maker(ProcessEvent, ("kind", "pid", "comm"))
    ev = make("process_exit", 7, "sh", ts_ns=1, ppid=1, cgroup_id=2, cgroup="/", exit_code=3)
    assert ev == ProcessEvent(
        kind="process_exit", pid=7, comm="sh", ts_ns=1, ppid=1, cgroup_id=2, cgroup="/", exit_code=3
    )
    with pytest.raises(TypeError, match="no_such"):
        maker(ProcessEvent, ("pid", "no_such"))
