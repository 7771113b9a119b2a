"""GPU collectors through the running agent: a hanging nvidia-smi, REST from fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agentproc import AgentProc, get
from tests.conftest import wait_for

pytestmark = pytest.mark.e2e
FIX = Path(__file__).parent.parent / "fixtures" / "gpu"

STAND_IN = """#!/bin/sh
# nvidia-smi stand-in: answers from the recorded CSV until told to hang
case "$(cat {mode})" in hang) exec sleep 600 ;; esac
case "$*" in
  *--query-gpu*) cat {gpus} ;;
  *--query-compute-apps*) cat {apps} ;;
esac
"""


def test_hanging_nvidia_smi_times_out_serves_stale_and_metrics_go_on(tmp_path: Path) -> None:
    mode = tmp_path / "mode"
    mode.write_text("ok")
    tool = tmp_path / "nvidia-smi"
    tool.write_text(
        STAND_IN.format(
            mode=mode, gpus=FIX / "nvidia-smi-gpus.csv", apps=FIX / "nvidia-smi-apps.csv"
        )
    )
    tool.chmod(0o755)
    env = {
        "LENS_COLLECTORS__GPU__NVIDIA_SMI": str(tool),
        "LENS_COLLECTORS__GPU__INTERVAL_SECONDS": "1",
        "LENS_COLLECTORS__GPU__TIMEOUT_SECONDS": "1",
        "LENS_DEVICES__SYSFS_ROOT": str(tmp_path),  # no amdgpu here
    }
    agent = AgentProc("--no-collector.tcp", "--no-collector.processes", env=env)
    try:
        agent.wait_ready()
        assert agent.wait_sample("hw_gpu_count", {"node": agent_node(agent)}, 2) == 2
        mode.write_text("hang")

        def stale() -> bool:  # scrapes answer all along (how fast: python -m bench)
            status, _ = get(agent.base + "/metrics")
            assert status == 200
            return agent.sample("lens_gpu_reading_stale", {"vendor": "nvidia"}) == 1

        wait_for(stale, "a stale reading")
        labels = {"gpu_index": "0", "vendor": "nvidia"}
        assert agent.sample("gpu_utilization_percent", labels) == 87  # last good reading
        assert (
            agent.sample(
                "lens_agent_collector_errors_total", {"collector": "gpu", "reason": "timeout"}
            )
            >= 1
        )
        status, cards = agent.json("/cardMetrics")
        assert cards["data"][0]["stale"] is True
    finally:
        mode.write_text("ok")
        assert agent.stop() == 0


def agent_node(agent: AgentProc) -> str:
    return agent.json("/node")[1]["data"]["node_name"]


def test_gpu_rest_routes_from_fixture_sysfs_and_dev() -> None:
    env = {
        "LENS_DEVICES__SYSFS_ROOT": str(FIX / "sys"),
        "LENS_DEVICES__DEV_ROOT": str(FIX / "dev"),
        "LENS_COLLECTORS__GPU__NVIDIA_SMI": "lens-no-such-tool",
    }
    agent = AgentProc("--no-collector.tcp", "--no-collector.processes", env=env)
    try:
        agent.wait_ready()
        status, gpus = agent.json("/gpus")
        assert status == 200 and gpus["code"] == 0 and gpus["message"] == "success"
        rows = {g["bus"]["bdf"]: g for g in gpus["data"]}
        assert sorted(rows) == ["0000:c1:00.0", "0001:03:00.0"]
        # the host's device names, not the fixture root the agent read them from
        assert rows["0000:c1:00.0"]["dri_device"]["card"] == "/dev/dri/card1"
        assert rows["0001:03:00.0"]["dri_device"]["render"] == "/dev/dri/renderD129"
        _, dri = agent.json("/driMapping")
        by_card = {k: (d["card_id"], d["pci_addr"]) for k, d in dri["data"].items()}
        assert by_card == {
            "/dev/dri/card1": (1, "0000:c1:00.0"),
            "/dev/dri/card2": (2, "0001:03:00.0"),
        }
        _, cards = agent.json("/cardMetrics")
        assert cards["data"][1]["power_draw_watts"] == 125.0
        _, drv = agent.json("/gpuDriverVersion")  # the amdgpu module's version in sysfs
        assert drv == {"code": 0, "data": "6.7.0", "message": "success"}
        assert (
            agent.sample(
                "hw_gpu_power_draw_watts",
                {
                    "node": agent_node(agent),
                    "gpu_index": "0",
                    "gpu_name": "AMD Instinct MI300X",
                    "gpu_uuid": "0x18a96c02d4e1c0a3",
                    "vendor": "amd",
                },
            )
            == 301.0
        )
    finally:
        assert agent.stop() == 0
