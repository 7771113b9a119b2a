"""The Management pages' parts that need no service: the agent's objects Initialize
installs (deploy/agent, packaged as a byte copy, built as kustomize builds it), the
runner's observers (what job history records), settings checked as the file is."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from lens_ebpf.core.runner import Job, Run, Runner
from lens_ebpf.recorder import config
from lens_ebpf.recorder.management import manifest, settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_AGENT = ROOT / "deploy" / "agent"
PACKAGED = ROOT / "lens_ebpf" / "recorder" / "management" / "agent"


def test_the_packaged_agent_manifest_is_deploy_agent_byte_for_byte() -> None:
    theirs = sorted(p.name for p in DEPLOY_AGENT.iterdir() if p.is_file())
    assert sorted(p.name for p in PACKAGED.iterdir() if p.is_file()) == theirs
    for name in theirs:
        assert (PACKAGED / name).read_bytes() == (
            DEPLOY_AGENT / name
        ).read_bytes(), f"copy deploy/agent/{name} to lens_ebpf/recorder/management/agent/"


def test_the_objects_are_those_kustomize_builds() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl (its kustomize builds deploy/agent)")
    got = subprocess.run(
        [kubectl, "kustomize", str(DEPLOY_AGENT)], capture_output=True, text=True, timeout=60
    )
    assert got.returncode == 0, got.stderr
    built = [d for d in yaml.safe_load_all(got.stdout) if d]
    assert manifest.objects() == built  # the same objects, in kustomize's order


def test_an_image_replaces_only_the_agents_image() -> None:
    plain, other = manifest.objects(), manifest.objects("docker.io/amd/lens-ebpf:0.2.0")
    for a, b in zip(plain, other, strict=True):
        if a["kind"] != "DaemonSet":
            assert a == b
            continue
        ca, cb = (
            a["spec"]["template"]["spec"]["containers"],
            b["spec"]["template"]["spec"]["containers"],
        )
        assert [c["image"] for c in cb] == ["docker.io/amd/lens-ebpf:0.2.0"]
        assert [{**c, "image": ""} for c in ca] == [{**c, "image": ""} for c in cb]
    assert manifest.agent_image() == "lens-ebpf:0.1.0"
    assert manifest.split_image("registry:5000/ns/lens-ebpf") == (
        "registry:5000/ns/lens-ebpf",
        "latest",
    )
    rbac = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
    assert {manifest.path_of(d) for d in plain if d["kind"] == "ClusterRoleBinding"} == {
        f"{rbac}/lens-ebpf",
        f"{rbac}/lens-ebpf-auth-delegator",
    }


def test_observers_hear_each_run_with_its_error_and_result() -> None:
    heard: list[Run] = []

    def boom() -> None:
        raise ValueError("no")

    runner = Runner(
        [Job("boom", 60, boom, leader_only=True), Job("n", 60, lambda: 3, False)],
        is_leader=lambda: True,
    )
    runner.observe(heard.append)
    runner.observe(lambda run: 1 / 0)  # an observer's failure is its own
    assert runner.run("boom") and runner.run("n")
    (failed, counted) = heard
    assert (failed.job.name, failed.error, failed.result) == ("boom", "ValueError: no", None)
    assert "raise ValueError" in failed.stack and failed.ended >= failed.started
    assert (counted.error, counted.result, counted.stack) == ("", 3, "")
    assert runner.state["n"].runs == 1 and runner.state["boom"].failures == 1


def test_a_setting_is_checked_as_the_file_checks_it() -> None:
    cfg = config.load(env={})
    assert settings.checked(cfg, "recorder.training.slowdown_factor", "2") == 2.0
    for key, bad in (
        ("recorder.training.slowdown_factor", "fast"),
        ("recorder.training.slowdown_factor", 1.0),
        ("log_level", "chatty"),
        ("recorder.detection.batch", 0),
    ):
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            settings.checked(cfg, key, bad)
    shown = dict(settings.flatten(cfg))
    assert "recorder.api.token_file" in shown and "recorder.database_url" in shown
    assert settings.shown("recorder.remote_write.basic_auth.password_file", "/p") == "******"
    assert (
        settings.shown("recorder.database_url", "postgresql+psycopg://u:pw@db/lens")
        == "postgresql+psycopg://u:***@db/lens"
    )
    assert json.dumps(
        settings.shown(
            "recorder.remote_write.device_labels", cfg.recorder.remote_write.device_labels
        )
    )
