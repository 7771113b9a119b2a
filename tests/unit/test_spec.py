"""Program specs resolved against the tracepoint formats real kernels describe.

tests/fixtures/tracefs/<kernel>/ holds the format files of every tracepoint the specs
name, copied from Debian's 5.10, 6.1 and 6.12 kernels booted in QEMU and from the
development machines' 6.18 (`python -m tests.vm.formats` refreshes them).
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from lens_ebpf.agent import tracefs
from lens_ebpf.agent.bpf import btf
from lens_ebpf.agent.bpf.spec import (
    BTF,
    BTF_TRACEPOINT,
    ITER,
    KPROBE,
    RAW_TRACEPOINT,
    TRACEPOINT,
    BtfField,
    Kernel,
    Need,
    Plan,
    ProbePath,
    ProgramSpec,
    resolve,
)
from lens_ebpf.agent.check import feature_plans, feature_support
from lens_ebpf.agent.processes import proc_events
from lens_ebpf.agent.tcp import tcp_flows

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "tracefs"
BYTES_FNS = frozenset({"tcp_sendmsg", "tcp_recvmsg", "inet_recvmsg", "inet6_recvmsg"})


def kernel(name: str, kprobes: bool = True, functions: frozenset[str] = BYTES_FNS) -> Kernel:
    return Kernel(FIXTURES / name / "events", kprobes, functions if kprobes else frozenset())


def only(tmp_path: Path, *tracepoints: str) -> Path:
    """An events tree holding just these tracepoints (6.18's formats)."""
    events = tmp_path / "events"
    for tp in tracepoints:
        rel = tp.replace(":", "/")
        (events / rel).mkdir(parents=True)
        src = FIXTURES / "6.18" / "events" / rel / "format"
        (events / rel / "format").write_text(src.read_text())
    return events


# kernel -> (bytes path, defines that must be set, defines that must not be)
EXPECT = {
    "5.10": (
        KPROBE,
        {"LENS_BYTES_KPROBE", "LENS_RTT", "LENS_RETRANS", "LENS_RESETS"},
        {"LENS_TP_TCP_PROBE_SKADDR", "LENS_TP_RETRANSMIT_ERR", "LENS_BYTES_TRACEPOINT"},
    ),
    "6.1": (
        KPROBE,
        {"LENS_BYTES_KPROBE", "LENS_RTT"},
        {"LENS_TP_TCP_PROBE_SKADDR", "LENS_TP_RETRANSMIT_ERR"},
    ),
    "6.12": (
        TRACEPOINT,
        {"LENS_BYTES_TRACEPOINT", "LENS_TP_TCP_PROBE_SKADDR"},
        {"LENS_TP_RETRANSMIT_ERR", "LENS_BYTES_KPROBE"},
    ),
    "6.18": (
        TRACEPOINT,
        {"LENS_BYTES_TRACEPOINT", "LENS_TP_TCP_PROBE_SKADDR", "LENS_TP_RETRANSMIT_ERR"},
        {"LENS_BYTES_KPROBE"},
    ),
}


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_tcp_flows_paths_and_fields_per_kernel(name: str) -> None:
    path, on, off = EXPECT[name]
    plan = resolve(tcp_flows.SPEC, kernel(name))
    assert plan.loadable
    assert plan.paths() == {
        "lifecycle": TRACEPOINT,
        "bytes": path,
        "retransmits": TRACEPOINT,
        "resets": TRACEPOINT,
        "rtt": TRACEPOINT,
    }
    assert on <= set(plan.defines), plan.defines
    assert not off & set(plan.defines), plan.defines
    if path == KPROBE:
        assert plan.kprobes() == (
            "tcp_sendmsg",
            "tcp_sendmsg:return",
            "tcp_recvmsg",
            "tcp_recvmsg:return",
            "inet_recvmsg",
            "inet6_recvmsg",
        )
        assert "sock:sock_send_length" not in plan.tracepoints()
        assert plan.choices["bytes"].reason == (
            "no iter: BTF (/sys/kernel/btf/vmlinux absent or unreadable) missing; "
            "no raw_tracepoint or tracepoint: sock:sock_send_length, sock:sock_recv_length "
            "missing"
        )
    else:
        assert plan.kprobes() == ()
        # these fixtures carry no BTF: the classic tracepoints, saying why
        assert plan.choices["bytes"].reason == (
            "no iter or raw_tracepoint: BTF (/sys/kernel/btf/vmlinux absent or unreadable) "
            "missing"
        )


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_proc_events_degrades_only_the_missing_fields(name: str) -> None:
    plan = resolve(proc_events.SPEC, kernel(name))
    assert plan.loadable and plan.paths().pop("cgroup_paths") == "off"  # no BTF given
    assert set(plan.paths().values()) - {"off"} == {TRACEPOINT}
    assert ("LENS_TP_EXIT_GROUP_DEAD" in plan.defines) is (name == "6.18")
    assert "LENS_TP_OOM_COMM" in plan.defines  # every kernel here names the OOM victim
    if name != "6.18":
        assert plan.degraded == [
            "sched:sched_process_exit has no group_dead: "
            "the thread-group leader's exit stands for the process's"
        ]


def test_no_kprobes_and_no_byte_tracepoints_turns_only_tcp_flows_off() -> None:
    k = kernel("5.10", kprobes=False)
    features = {f: feature_support(p, n) for f, (p, n) in feature_plans(k).items()}
    assert features["tcp_flows"]["supported"] is False
    assert features["tcp_flows"]["reason"] == (
        "bytes: no iter: BTF (/sys/kernel/btf/vmlinux absent or unreadable) missing; "
        "no raw_tracepoint or tracepoint: sock:sock_send_length, "
        "sock:sock_recv_length missing; no kprobe: kprobes (kernel built without them) missing"
    )
    assert features["processes"]["supported"] is True
    # RTT needs the flows program, which cannot load here
    assert features["tcp_rtt"]["supported"] is False


def test_a_kernel_without_the_process_tracepoints_says_each_reason_once(tmp_path: Path) -> None:
    # what lens-ebpf check printed on a real GPU node (Ubuntu 24.04, tracefs not mounted):
    # the plan's off reason and the needs' own reasons, each twice
    k = Kernel(tmp_path / "events", False, frozenset())  # no tracefs events, no kprobes
    reason = feature_support(*feature_plans(k)["processes"])["reason"]
    pieces = reason.split("; ")
    assert len(pieces) == len(set(pieces))
    assert pieces[0] == "fork: no tracepoint: sched:sched_process_fork missing"


def test_missing_kernel_function_is_named() -> None:
    k = kernel("6.1", functions=BYTES_FNS - {"tcp_recvmsg"})
    plan = resolve(tcp_flows.SPEC, k)
    assert not plan.loadable
    assert plan.off_reason.endswith("no kprobe: tcp_recvmsg() missing")


def test_disabled_need_and_missing_optional_tracepoint(tmp_path: Path) -> None:
    plan = resolve(tcp_flows.SPEC, kernel("6.18"), disabled=[tcp_flows.RTT])
    assert plan.paths()["rtt"] == "off" and "LENS_RTT" not in plan.defines
    assert plan.choices["rtt"].reason == "disabled by config"
    # a kernel without tcp_probe: the flows still load, RTT is off with the reason
    events = only(
        tmp_path, "sock:inet_sock_set_state", "sock:sock_send_length", "sock:sock_recv_length"
    )
    plan = resolve(tcp_flows.SPEC, Kernel(events, False))
    assert plan.loadable
    assert plan.paths() == {
        "lifecycle": TRACEPOINT,
        "bytes": TRACEPOINT,
        "retransmits": "off",
        "resets": "off",
        "rtt": "off",
    }
    assert plan.choices["rtt"].reason == (
        "no btf: BTF (/sys/kernel/btf/vmlinux absent or unreadable) missing; "
        "no tracepoint: tcp:tcp_probe missing"
    )


def test_format_fields_as_bcc_names_them() -> None:
    fields = tracefs.tracepoint_fields("oom:mark_victim", FIXTURES / "6.1" / "events")
    assert "data_loc_comm" in fields and "pid" in fields
    assert "common_pid" not in fields
    probe = tracefs.tracepoint_fields("tcp:tcp_probe", FIXTURES / "5.10" / "events")
    assert {"saddr", "daddr", "sport", "dport", "srtt"} <= probe
    assert "skaddr" not in probe and "family" not in probe


def test_summary_says_what_an_absent_optional_need_costs(tmp_path: Path) -> None:
    events = only(
        tmp_path, "sched:sched_process_fork", "sched:sched_process_exec", "sched:sched_process_exit"
    )
    plan = resolve(proc_events.SPEC, Kernel(events, False))
    assert plan.loadable
    assert plan.summary() == (
        "exit_codes: off (no btf: BTF (/sys/kernel/btf/vmlinux absent or unreadable) missing; "
        "no tracepoint: syscalls:sys_enter_exit_group, "
        "syscalls:sys_enter_exit missing): exits carry no exit code; "
        "signals: off (no tracepoint: signal:signal_deliver missing): "
        "exits carry no killing signal; "
        "oom: off (no tracepoint: oom:mark_victim missing): no OOM kill events; "
        "cgroup_paths: off (no btf: BTF (/sys/kernel/btf/vmlinux absent or unreadable) "
        "missing): a container gone before the agent reads its records is not named"
    )


def test_kprobe_profile_gives_hits_and_misses_per_event() -> None:
    # as 6.1's trace_kprobe.c prints it: "  %-44s %15lu %15lu"
    text = (
        "  r_tcp_sendmsg_bcc_139                                   4811               0\n"
        "  r_tcp_recvmsg_bcc_139                                   9120              17\n"
    )
    assert tracefs.parse_kprobe_profile(text) == {
        "r_tcp_sendmsg_bcc_139": (4811, 0),
        "r_tcp_recvmsg_bcc_139": (9120, 17),
    }
    assert tracefs.parse_kprobe_profile("") == {}


# The running kernel's own BTF (bpf/btf.py): the paths that need it, and what passes them over.
HOST_BTF = btf.running()
needs_btf = pytest.mark.skipif(
    HOST_BTF is None, reason="this kernel has no /sys/kernel/btf/vmlinux"
)


def placed_as_btf_says(plan: Plan, members: dict[str, str]) -> None:
    """Each -D define of the plan is the byte offset the host's BTF gives its member."""
    assert HOST_BTF is not None
    for define, member in members.items():
        got = HOST_BTF.member(member)
        assert got is not None and plan.defines[define] == got[0], (define, member, got)


@needs_btf
def test_with_btf_bytes_come_from_the_socket_counters_through_the_tcp_iterator() -> None:
    plan = resolve(tcp_flows.SPEC, Kernel(FIXTURES / "6.18" / "events", False, btf=HOST_BTF))
    assert plan.paths()["bytes"] == ITER and plan.choices["bytes"].reason == ""
    assert plan.iterators() == ("tcp",)
    assert plan.raw_tracepoints() == () and plan.kprobes() == ()
    assert "sock:sock_send_length" not in plan.tracepoints()
    placed_as_btf_says(
        plan,
        {
            "LENS_TCP_BYTES_ACKED_OFF": "tcp_sock.bytes_acked",
            "LENS_TCP_COPIED_SEQ_OFF": "tcp_sock.copied_seq",
            "LENS_SK_FLAGS_OFF": "sock.__sk_common.skc_flags",
        },
    )
    assert plan.defines["LENS_BYTES_COUNTERS"] == 1


@needs_btf
def test_an_iterator_without_the_socket_lock_keeps_a_program_per_message() -> None:
    """5.10's TCP iterator (BTF has bpf_iter__tcp, not bpf_tcp_iter_state) walks without
    each socket's lock: the per-message paths, saying why."""

    class NoLock:
        def __init__(self, real: object) -> None:
            self._real = real

        def struct_id(self, name: str) -> int | None:
            return None if name == "bpf_tcp_iter_state" else self._real.struct_id(name)

        def __getattr__(self, name: str) -> object:
            return getattr(self._real, name)

    k = Kernel(FIXTURES / "6.18" / "events", False, btf=NoLock(HOST_BTF))  # type: ignore[arg-type]
    plan = resolve(tcp_flows.SPEC, k)
    assert plan.paths()["bytes"] == RAW_TRACEPOINT
    assert plan.choices["bytes"].reason == (
        "no iter: a TCP iterator that locks each socket (Linux 5.15+) "
        "(BTF struct bpf_tcp_iter_state) missing"
    )


@needs_btf
def test_with_btf_no_iterator_bytes_go_raw_and_exit_codes_take_the_task_field() -> None:
    k = Kernel(FIXTURES / "6.18" / "events", False, btf=HOST_BTF, iterators=False)
    plan = resolve(tcp_flows.SPEC, k)
    assert plan.paths()["bytes"] == RAW_TRACEPOINT
    assert plan.choices["bytes"].reason == "no iter: BPF iterators (turned off) missing"
    assert plan.raw_tracepoints() == ("sock:sock_send_length", "sock:sock_recv_length")
    assert "sock:sock_send_length" not in plan.tracepoints()
    assert HOST_BTF is not None
    family, protocol = (
        HOST_BTF.member("sock.__sk_common.skc_family"),
        HOST_BTF.member("sock.sk_protocol"),
    )
    assert family is not None and protocol is not None
    assert plan.defines["LENS_BYTES_RAW"] == 1
    assert plan.defines["LENS_SK_FAMILY_OFF"] == family[0]
    assert plan.defines["LENS_SK_PROTOCOL_OFF"] == protocol[0]
    # RTT sampled from the socket where BTF places srtt_us: tcp_probe not attached
    assert plan.paths()["rtt"] == BTF and "tcp:tcp_probe" not in plan.tracepoints()
    srtt = HOST_BTF.member("tcp_sock.srtt_us")
    assert srtt is not None and plan.defines["LENS_TCP_SRTT_OFF"] == srtt[0]
    assert plan.defines["LENS_RTT_SAMPLED"] == 1 and "LENS_RTT" not in plan.defines
    procs = resolve(proc_events.SPEC, k)
    assert procs.paths()["exit_codes"] == BTF
    assert "syscalls:sys_enter_exit_group" not in procs.tracepoints()
    assert procs.defines["LENS_TASK_EXIT_CODE_OFF"] == HOST_BTF.member("task_struct.exit_code")[0]  # type: ignore[index]
    # a kernel before sock_send_length has BTF too, and still takes the kprobes
    old = Kernel(FIXTURES / "5.10" / "events", True, BYTES_FNS, HOST_BTF, iterators=False)
    assert resolve(tcp_flows.SPEC, old).paths()["bytes"] == KPROBE


@needs_btf
def test_btf_that_does_not_match_passes_the_path_over_saying_why() -> None:
    k = Kernel(FIXTURES / "6.18" / "events", False, btf=HOST_BTF)
    wrong_args = ProbePath(
        RAW_TRACEPOINT, ("sock:sock_send_length",), args=("struct sock *", "long")
    )
    assert k.missing(wrong_args) == [
        "sock:sock_send_length arguments (struct sock *, int, int; expected struct sock *, long)"
    ]
    no_member = ProbePath(BTF, (), btf=(BtfField("X", "sock.no_such_member", 2),))
    assert k.missing(no_member) == ["BTF sock.no_such_member"]
    wrong_size = ProbePath(BTF, (), btf=(BtfField("X", "task_struct.exit_code", 8),))
    assert k.missing(wrong_size) == ["BTF task_struct.exit_code of 8 bytes (it has 4)"]
    no_struct = ProbePath(BTF, (), btf=(BtfField("X", "no_such_struct.field", 4),))
    assert k.missing(no_struct) == ["BTF no_such_struct.field"]
    fallback = ProbePath(TRACEPOINT, ("sock:sock_send_length",), "FALLBACK")
    spec = ProgramSpec("t", (Need("n", (wrong_args, fallback)),))
    plan = resolve(spec, k)
    assert plan.paths() == {"n": TRACEPOINT} and "FALLBACK" in plan.defines
    assert plan.choices["n"].reason.startswith("no raw_tracepoint: sock:sock_send_length arguments")


@needs_btf
def test_with_btf_the_lifecycle_attaches_btf_typed_and_reads_the_socket_where_btf_says() -> None:
    plan = resolve(tcp_flows.SPEC, Kernel(FIXTURES / "6.18" / "events", False, btf=HOST_BTF))
    assert plan.paths()["lifecycle"] == BTF_TRACEPOINT and plan.choices["lifecycle"].reason == ""
    assert plan.btf_tracepoints() == ("sock:inet_sock_set_state",)
    assert "sock:inet_sock_set_state" not in plan.tracepoints()
    assert plan.defines["LENS_LIFECYCLE_BTF"] == 1
    assert HOST_BTF is not None
    placed_as_btf_says(
        plan,
        {
            "LENS_INET_SPORT_OFF": "inet_sock.inet_sport",
            "LENS_INET_SADDR_OFF": "inet_sock.inet_saddr",
            "LENS_SK_DPORT_OFF": "sock.__sk_common.skc_dport",
            "LENS_SK_V6_DADDR_OFF": "sock.__sk_common.skc_v6_daddr",
        },
    )
    # what the loader attaches it against: the kernel's btf_trace_<event> typedef, which
    # the plan carries so the loader does not parse the kernel's BTF again
    tid = HOST_BTF.trace_typedef("inet_sock_set_state")
    assert tid is not None and plan.btf_trace_ids == {"sock:inet_sock_set_state": tid}
    assert HOST_BTF.trace_typedef("no_such_event") is None


@needs_btf
def test_a_lifecycle_that_cannot_go_btf_typed_takes_the_classic_tracepoint_unreported() -> None:
    """Passing the BTF-typed attachment over loses nothing (the same data at a little more
    per run): neither the plan's summary nor check's reason mentions it."""
    for k in (
        Kernel(
            FIXTURES / "6.18" / "events",
            False,
            btf=HOST_BTF,
            btf_tracepoints=False,
            no_btf_tracepoints_why="failed to load: Permission denied",
        ),
        Kernel(FIXTURES / "6.18" / "events", False),
    ):
        plan = resolve(tcp_flows.SPEC, k)
        assert plan.paths()["lifecycle"] == TRACEPOINT
        assert plan.choices["lifecycle"].reason == ""
        assert plan.tracepoints()[0] == "sock:inet_sock_set_state"
        assert plan.btf_tracepoints() == () and "LENS_LIFECYCLE_BTF" not in plan.defines
        assert plan.btf_trace_ids == {}
        assert "lifecycle" not in plan.summary()


@needs_btf
@pytest.mark.parametrize("parent", ["__parent", "parent"])
def test_cgroup_paths_read_the_kernfs_parent_by_either_name(parent: str) -> None:
    """Linux 6.15 renamed kernfs_node.parent to __parent: either places the same member;
    the first path, passed over where the name is the other, is not reported."""
    assert HOST_BTF is not None
    host: btf.Btf = HOST_BTF
    real = host.member("kernfs_node.__parent") or host.member("kernfs_node.parent")
    assert real is not None

    class Named:
        def __init__(self, inner: object) -> None:
            self._inner = inner

        def member(self, path: str) -> tuple[int, int] | None:
            if path.startswith("kernfs_node.") and path.endswith("parent"):
                return real if path == f"kernfs_node.{parent}" else None
            return host.member(path)

        def __getattr__(self, name: str) -> object:
            return getattr(self._inner, name)

    k = Kernel(FIXTURES / "6.18" / "events", False, btf=cast(btf.Btf, Named(host)))
    plan = resolve(proc_events.SPEC, k)
    assert plan.paths()["cgroup_paths"] == "btf" and "cgroup_paths" not in plan.summary()
    placed_as_btf_says(
        plan,
        {
            "LENS_TASK_CGROUPS_OFF": "task_struct.cgroups",
            "LENS_CSS_SET_DFL_CGRP_OFF": "css_set.dfl_cgrp",
            "LENS_CGROUP_KN_OFF": "cgroup.kn",
            "LENS_KERNFS_NAME_OFF": "kernfs_node.name",
        },
    )
    assert plan.defines["LENS_KERNFS_PARENT_OFF"] == real[0]
    assert plan.defines["LENS_CGROUP_PATHS"] == 1
