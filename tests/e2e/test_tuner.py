"""The system tuner in a running agent, on this kernel's own /proc/sys: a real sysctl
raised (and put back afterwards), a higher one left alone, a failure counted, the
change on the gRPC stream; absent when off."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from lens_ebpf.protocol.gen import lens_pb2 as pb
from lens_ebpf.protocol.gen import lens_pb2_grpc
from tests.agentproc import AgentProc, free_port
from tests.conftest import hang_guard, wait_for

pytestmark = pytest.mark.e2e

MAP_COUNT = Path("/proc/sys/vm/max_map_count")
PID_MAX = Path("/proc/sys/kernel/pid_max")


def test_tuner_raises_a_real_sysctl_and_says_so(tmp_path: Path) -> None:
    orig = int(MAP_COUNT.read_text())
    pid_max = int(PID_MAX.read_text())
    port = free_port()
    cfg = tmp_path / "lens.yaml"
    cfg.write_text(f"""grpc:
  listen: 127.0.0.1:{port}
collectors:
  tuner:
    interval_seconds: 0.5
    open_files: 0
    sysctls:
      vm.max_map_count: {orig + 1}
      kernel.pid_max: {min(pid_max, 4096) - 1}
      vm.no_such_setting: 1
""")
    agent = AgentProc(
        "--config",
        str(cfg),
        "--tuner",
        "--no-collector.tcp",
        "--no-collector.processes",
        "--no-collector.drops",
    )
    try:
        agent.wait_ready()
        raised = {"setting": "vm.max_map_count"}
        assert agent.wait_sample("lens_tuner_changes_total", raised, 1) == 1
        assert int(MAP_COUNT.read_text()) == orig + 1
        assert agent.sample("lens_tuner_setting_current", raised) == orig + 1
        assert agent.sample("lens_tuner_setting_desired", raised) == orig + 1
        # higher than asked: left alone
        assert int(PID_MAX.read_text()) == pid_max
        assert agent.sample("lens_tuner_setting_current", {"setting": "kernel.pid_max"}) == pid_max
        assert agent.sample("lens_tuner_changes_total", {"setting": "kernel.pid_max"}) == 0
        # a failure is named and counted, and the agent keeps serving
        unknown = {"setting": "vm.no_such_setting", "reason": "unknown"}
        wait_for(
            lambda: (agent.sample("lens_tuner_errors_total", unknown) or 0) >= 2,
            "two failed runs counted",
        )
        status, ready = agent.json("/readyz")
        assert status == 200 and ready["features"]["tuner"]["state"] == "running"
        rows = {r["setting"]: r for r in agent.json("/tuner")[1]["data"]}
        assert rows["vm.max_map_count"]["current"] == orig + 1
        assert "no such sysctl" in rows["vm.no_such_setting"]["error"]
        # the change went out on the stream (it came before anyone subscribed: resume)
        stub = lens_pb2_grpc.EventServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        stream = stub.Subscribe(
            pb.SubscribeRequest(kinds=["node_tuned"], from_seq=1), timeout=hang_guard(10)
        )
        ev = next(iter(stream))
        stream.cancel()
        assert ev.WhichOneof("payload") == "node_tuned"
        assert (ev.node_tuned.setting, ev.node_tuned.old_value, ev.node_tuned.new_value) == (
            "vm.max_map_count",
            orig,
            orig + 1,
        )
    finally:
        agent.stop()
        MAP_COUNT.write_text(f"{orig}\n")


def test_tuner_is_absent_when_off() -> None:
    orig = MAP_COUNT.read_text()
    agent = AgentProc("--no-collector.tcp", "--no-collector.processes", "--no-collector.drops")
    try:
        agent.wait_ready()
        status, ready = agent.json("/readyz")
        assert ready["features"]["tuner"] == {"state": "off", "reason": "disabled by config"}
        assert "lens_tuner_" not in agent.metrics_text()
        assert agent.json("/tuner")[1]["data"] == []
        assert MAP_COUNT.read_text() == orig
    finally:
        agent.stop()
