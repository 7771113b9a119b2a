"""The system tuner against a /proc/sys tree laid out as the kernel's: raises what is
low, leaves what is higher, names and counts what it cannot do."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from lens_ebpf.agent import config
from lens_ebpf.agent.events import NodeTuned
from lens_ebpf.agent.features.tuner import (
    Tuner,
    TunerSettings,
    check_rows,
    desired_settings,
)
from lens_ebpf.core.settings import ConfigError


def proc_sys(root: Path, values: dict[str, str]) -> Path:
    for name, text in values.items():
        path = root / name.replace(".", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return root


def samples(tuner: Tuner) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for m in tuner.refresh()
        for s in m.samples
    }


def test_raises_what_is_low_and_leaves_what_is_higher(tmp_path: Path) -> None:
    root = proc_sys(
        tmp_path,
        {
            "vm.max_map_count": "65530",
            "fs.nr_open": "1048576",
            "fs.file-max": "9223372036854775807",
        },
    )
    events: list[NodeTuned] = []
    desired = desired_settings(TunerSettings())  # the shipped defaults
    assert desired == {"vm.max_map_count": 262144, "fs.nr_open": 131072, "fs.file-max": 131072}
    tuner = Tuner(30, root, desired, events.append)
    got = samples(tuner)
    assert (root / "vm/max_map_count").read_text() == "262144\n"
    assert (root / "fs/nr_open").read_text() == "1048576\n"  # higher: left alone
    assert (root / "fs/file-max").read_text() == "9223372036854775807\n"
    setting = (("setting", "vm.max_map_count"),)
    assert got[("lens_tuner_changes_total", setting)] == 1
    assert got[("lens_tuner_setting_current", setting)] == 262144
    assert got[("lens_tuner_setting_desired", setting)] == 262144
    assert got[("lens_tuner_setting_current", (("setting", "fs.nr_open"),))] == 1048576
    assert got[("lens_tuner_changes_total", (("setting", "fs.nr_open"),))] == 0
    assert [(e.kind, e.setting, e.old_value, e.new_value) for e in events] == [
        ("node_tuned", "vm.max_map_count", 65530, 262144)
    ]
    # the next round finds it high enough: nothing more to do
    assert samples(tuner)[("lens_tuner_changes_total", setting)] == 1
    assert len(events) == 1
    # an operator raised it further: left alone
    (root / "vm/max_map_count").write_text("500000\n")
    assert samples(tuner)[("lens_tuner_setting_current", setting)] == 500000
    assert (root / "vm/max_map_count").read_text() == "500000\n"


def test_what_it_cannot_do_is_named_and_counted(tmp_path: Path) -> None:
    root = proc_sys(
        tmp_path,
        {
            "vm.max_map_count": "65530",
            "kernel.core_pattern": "core",
            "vm.dirty_ratio": "garbage 12",
        },
    )
    (root / "vm/swappiness").mkdir()  # a write that fails
    desired = {
        "vm.no_such_setting": 1,
        "kernel.core_pattern": 5,
        "vm.dirty_ratio": 20,
        "vm.swappiness": 10,
        "vm.max_map_count": 262144,
    }
    tuner = Tuner(30, root, desired)
    for _ in range(2):
        got = samples(tuner)
    errors = {labels: v for (name, labels), v in got.items() if name == "lens_tuner_errors_total"}
    assert errors == {
        (("reason", "unknown"), ("setting", "vm.no_such_setting")): 2,
        (("reason", "not_a_number"), ("setting", "kernel.core_pattern")): 2,
        (("reason", "not_a_number"), ("setting", "vm.dirty_ratio")): 2,
        (("reason", "read_failed"), ("setting", "vm.swappiness")): 2,
    }
    # the others are still kept
    assert (root / "vm/max_map_count").read_text() == "262144\n"
    report = {r["setting"]: r for r in tuner.report()}
    assert "no such sysctl" in report["vm.no_such_setting"]["error"]
    assert report["vm.max_map_count"]["error"] == ""


@pytest.mark.skipif(os.geteuid() != 0, reason="a read-only bind mount needs root")
def test_a_read_only_proc_sys_is_counted(tmp_path: Path) -> None:
    root = proc_sys(tmp_path / "sys", {"vm.max_map_count": "65530"})
    subprocess.run(["mount", "--bind", "-o", "ro", str(root), str(root)], check=True)
    try:
        tuner = Tuner(30, root, {"vm.max_map_count": 262144})
        got = samples(tuner)
    finally:
        subprocess.run(["umount", str(root)], check=True)
    key = ("lens_tuner_errors_total", (("reason", "read_only"), ("setting", "vm.max_map_count")))
    assert got[key] == 1
    assert got[("lens_tuner_setting_current", (("setting", "vm.max_map_count"),))] == 65530
    assert "Read-only file system" in tuner.report()[0]["error"]


def test_settings_refuse_namespaced_and_malformed_sysctls() -> None:
    for bad, why in (
        ({"net.core.somaxconn": 4096}, "belongs to a namespace"),
        ({"kernel.shmmax": 1}, "belongs to a namespace"),
        ({"vm/max_map_count": 1}, "not a sysctl name"),
        ({"vm.max_map_count": -1}, "non-negative"),
    ):
        with pytest.raises(ConfigError, match=why):
            config.load(None, env={}, overrides={("collectors", "tuner", "sysctls"): bad})
    cfg = config.load(None, env={"LENS_COLLECTORS__TUNER__OPEN_FILES": "0"})
    s = cfg.collectors.section("tuner")
    assert isinstance(s, TunerSettings) and not s.enabled  # off unless asked for
    assert desired_settings(s) == {"vm.max_map_count": 262144}


def test_check_reads_and_changes_nothing(tmp_path: Path) -> None:
    root = proc_sys(tmp_path, {"vm.max_map_count": "65530", "fs.nr_open": "1048576"})
    rows = list(check_rows(root, {"vm.max_map_count": 262144, "fs.nr_open": 131072, "vm.gone": 1}))
    assert [(r["setting"], r["current"], r["action"]) for r in rows] == [
        ("vm.max_map_count", 65530, "would raise"),
        ("fs.nr_open", 1048576, "ok"),
        ("vm.gone", None, f"vm.gone: no such sysctl ({root}/vm/gone)"),
    ]
    assert (root / "vm/max_map_count").read_text() == "65530\n"
