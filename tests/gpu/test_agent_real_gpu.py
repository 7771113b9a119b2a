"""On a node with a real NVIDIA GPU (skipped elsewhere, with the reason): the agent's
dcgm-exporter families (`devices.compat: [dcgm]`) equal what nvidia-smi says of the same
GPUs. Identity and memory exactly; temperature and power, which move between two reads,
within a small band. The agent runs with its BPF features off: no BCC needed (a lent
GPU machine has none)."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess

import pytest

from tests.agentproc import AgentProc, parse_samples
from tests.conftest import wait_for

FIELDS = (
    "index,uuid,name,pci.bus_id,driver_version,memory.used,memory.reserved,"
    "temperature.gpu,power.draw"
)


def nvidia_smi() -> list[dict[str, str]] | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    res = subprocess.run(
        [smi, f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if res.returncode != 0 or not res.stdout.strip():
        return None
    rows = csv.reader(io.StringIO(res.stdout), skipinitialspace=True)
    return [dict(zip(FIELDS.split(","), row, strict=True)) for row in rows]


def test_dcgm_families_equal_nvidia_smi_on_a_real_gpu() -> None:
    if nvidia_smi() is None:
        pytest.skip(
            "no NVIDIA GPU with a working nvidia-smi on this machine "
            "(run on a GPU node: docs/agent/compat.md)"
        )
    env = {"LENS_DEVICES__COMPAT": "[dcgm]", "LENS_COLLECTORS__GPU__INTERVAL_SECONDS": "1"}
    agent = AgentProc(
        "--no-collector.tcp", "--no-collector.processes", "--no-collector.drops", env=env
    )
    try:
        agent.wait_ready()

        def dcgm() -> dict[str, dict[str, tuple[dict[str, str], float]]] | None:
            out: dict[str, dict[str, tuple[dict[str, str], float]]] = {}
            for name, labels, value in parse_samples(agent.metrics_text()):
                if name.startswith("DCGM_FI_"):
                    out.setdefault(labels["gpu"], {})[name] = (labels, value)
            return out or None

        got = wait_for(dcgm, "the dcgm families", timeout=30)
        smi = nvidia_smi()
        assert smi is not None and sorted(got) == sorted(row["index"] for row in smi)
        for row in smi:
            fams = got[row["index"]]
            labels, used = fams["DCGM_FI_DEV_FB_USED"]
            assert (labels["UUID"], labels["modelName"], labels["DCGM_FI_DRIVER_VERSION"]) == (
                row["uuid"],
                row["name"],
                row["driver_version"],
            )
            assert labels["pci_bus_id"] == row["pci.bus_id"]
            assert used == float(row["memory.used"])  # MiB, without the driver's reserve
            if row["memory.reserved"].isdigit():
                assert fams["DCGM_FI_DEV_FB_RESERVED"][1] == float(row["memory.reserved"])
            assert abs(fams["DCGM_FI_DEV_GPU_TEMP"][1] - float(row["temperature.gpu"])) <= 3
            if row["power.draw"] not in ("[N/A]", "N/A"):
                power = fams["DCGM_FI_DEV_POWER_USAGE"][1]
                assert abs(power - float(row["power.draw"])) <= max(15.0, 0.1 * power)
    finally:
        assert agent.stop() == 0
