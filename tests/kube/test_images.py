"""The lab's images (tests/kube/images.py): the project's two images configured as the
Dockerfile says and runnable, the pause and busybox images doing what a node asks of
them, every image in containerd under the name a pod spec's `image:` resolves to, and a
second build that does nothing. Builds what the cache lacks first (about 6 min on 2 cores
when what the Dockerfile copies changed; nothing when cached)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import containerlab
from tests.conftest import hang_guard, wait_for
from tests.containerlab import Containerd
from tests.kube import images

# A hang guard: the first test's setup builds what the cache lacks (4-7 min measured on 2
# busy cores when the project's sources changed; debootstrap on a cold cache adds 40-60 s).
pytestmark = pytest.mark.timeout(1800)


def dockerfile_settings(target: str) -> dict[str, Any]:
    """ENTRYPOINT, CMD and USER of a Dockerfile stage, inherited from the stages it
    builds on, as the image's config names them."""
    stages: dict[str, tuple[str, dict[str, Any]]] = {}
    current: dict[str, Any] = {}
    text = images.DOCKERFILE.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if m := re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line.strip(), re.IGNORECASE):
            current = {}
            stages[m.group(2) or m.group(1)] = (m.group(1), current)
        elif m := re.match(r"(ENTRYPOINT|CMD|USER)\s+(.+)", line.strip()):
            key = {"ENTRYPOINT": "Entrypoint", "CMD": "Cmd", "USER": "User"}[m.group(1)]
            current[key] = m.group(2) if key == "User" else json.loads(m.group(2))
    settings: dict[str, Any] = {"Entrypoint": None, "Cmd": None, "User": ""}
    chain = []
    while target in stages:
        parent, own = stages[target]
        chain.append(own)
        target = parent
    for own in reversed(chain):
        settings.update(own)
    return settings


def test_kubelet_names() -> None:
    """containerd_name spells what the kubelet asks containerd for."""
    assert images.containerd_name("lens-ebpf:0.1.0") == "docker.io/library/lens-ebpf:0.1.0"
    assert images.containerd_name("busybox") == "docker.io/library/busybox:latest"
    assert images.containerd_name("prom/prometheus:v2") == "docker.io/prom/prometheus:v2"
    assert images.containerd_name("localhost/lens-lab/pause:1") == "localhost/lens-lab/pause:1"
    assert images.containerd_name("quay.io/a/b:2") == "quay.io/a/b:2"
    assert images.containerd_name("reg:5000/b") == "reg:5000/b:latest"
    assert images.containerd_name("b@sha256:ab") == "docker.io/library/b@sha256:ab"


def test_names_come_from_the_dockerfile_and_deploy() -> None:
    assert images.BASE == "debian:bookworm-20241111-slim"  # the Dockerfile's FROM today
    assert (images.AGENT, images.RECORDER) == ("lens-ebpf:0.1.0", "lens-ebpf-recorder:0.1.0")


def test_pip_config_mounts_what_it_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Local paths move under PIP_MOUNTS (a local index with the directory above simple/,
    where its pages link to), remote URLs stay, missing paths are dropped."""
    (tmp_path / "pypi" / "simple").mkdir(parents=True)
    (tmp_path / "ca.crt").write_text("")
    monkeypatch.setattr(
        images,
        "_pip_settings",
        lambda: {
            "global": {
                "cert": f"{tmp_path}/ca.crt",
                "extra-index-url": f"file://{tmp_path}/pypi/simple https://mirror.example/simple",
                "find-links": "/nonexistent/wheels",
                "timeout": "60",
            }
        },
    )
    text, mounts = images.pip_config()
    m = images.PIP_MOUNTS
    assert f"cert = {m}{tmp_path}/ca.crt" in text
    assert (
        f"extra-index-url = file://{m}{tmp_path}/pypi/simple " "https://mirror.example/simple"
    ) in text
    assert "find-links" not in text and "timeout = 60" in text
    assert mounts == [
        (tmp_path / "ca.crt", f"{m}{tmp_path}/ca.crt"),
        (tmp_path / "pypi", f"{m}{tmp_path}/pypi"),
    ]


@pytest.fixture(scope="module")
def built() -> dict[str, Any]:
    """The stamp after a build (nothing to do when cached). Not checked for being current:
    the checkout may change while the build runs."""
    if why := images.cannot_build():
        pytest.skip(why)
    print(images.build(), flush=True)
    got = images.read_stamp()
    assert all(images.archive(ref).is_file() for ref in images.IMAGES)
    assert set(got["images"]) == set(images.IMAGES)
    return got


# The private containerd's root is kept between runs, as the node lab's is: each image
# is imported once per build of it, not once per run (the two project images: ~67 s).
KEPT_ROOT = images.CACHE.parent / "images-test" / "containerd"


@pytest.fixture(scope="module")
def containerd(built: dict[str, Any]) -> Iterator[tuple[Containerd, list[str]]]:
    """A private containerd with every pod image in k8s.io, imported where its archive
    changed since the last import there."""
    if reason := containerlab.unavailable():
        pytest.skip(reason)
    KEPT_ROOT.mkdir(parents=True, exist_ok=True)
    c = Containerd(Path(f"/tmp/lens-ctd-img{os.getpid()}"), root=KEPT_ROOT)
    try:
        # what a run stopped mid-test left: the kept root keeps images only
        for kind in ("tasks", "containers"):
            if ids := k8s(c, kind, "ls", "-q").stdout.split():
                k8s(c, kind, "rm", *(["-f"] if kind == "tasks" else []), *ids)
        t = time.monotonic()
        names = images.import_missing(str(c.sock), KEPT_ROOT / "lens-imported.json")
        print(f"{len(names)} images in containerd after {time.monotonic() - t:.1f} s")
        yield c, names
    finally:
        c.stop()


def k8s(c: Containerd, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return c.ctr("--namespace", "k8s.io", *args, check=False, timeout=timeout)


@pytest.mark.parametrize("ref", [images.AGENT, images.RECORDER])
def test_project_image_config_is_the_dockerfiles(built: dict[str, Any], ref: str) -> None:
    config = images.image_config(images.containerd_name(ref))
    want = dockerfile_settings(images.TARGETS[ref])
    got = {k: config.get(k) or want[k].__class__() for k in want}
    assert got == want
    assert want["Entrypoint"] == ["lens-ebpf"]  # what the runs below rely on


def test_the_recorder_runs_as_nobody(built: dict[str, Any]) -> None:
    assert images.image_config(images.containerd_name(images.RECORDER))["User"] == "65534"


def test_import_names_what_a_pod_spec_asks_for(
    containerd: tuple[Containerd, list[str]],
) -> None:
    c, names = containerd
    want = [images.containerd_name(r) for r in images.POD_IMAGES]
    assert names == want
    assert "docker.io/library/lens-ebpf:0.1.0" in names  # image: lens-ebpf:0.1.0
    listed = k8s(c, "images", "ls", "-q").stdout.split()
    assert set(want) <= set(listed)


def test_lens_ebpf_help_runs_in_the_agent_image(containerd: tuple[Containerd, list[str]]) -> None:
    c, _ = containerd
    r = k8s(
        c, "run", "--rm", images.containerd_name(images.AGENT), "help-agent", "lens-ebpf", "--help"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: lens-ebpf COMMAND")
    assert re.search(r"^  run\s", r.stdout, re.MULTILINE)
    assert re.search(r"^  recorder\s", r.stdout, re.MULTILINE)


def test_recorder_image_process_is_user_65534(containerd: tuple[Containerd, list[str]]) -> None:
    c, _ = containerd
    r = k8s(
        c,
        "run",
        "--rm",
        images.containerd_name(images.RECORDER),
        "uid-recorder",
        "sh",
        "-c",
        "id -u; lens-ebpf recorder --help >/dev/null && echo help-ok",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["65534", "help-ok"]


def test_busybox_image_runs_client_tools(containerd: tuple[Containerd, list[str]]) -> None:
    c, _ = containerd
    r = k8s(
        c,
        "run",
        "--rm",
        images.BUSYBOX,
        "bb",
        "sh",
        "-c",
        "echo $((6 * 7)); readlink /usr/bin/wget; readlink /usr/bin/nc",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["42", "/bin/busybox", "/bin/busybox"]


def test_pause_holds_until_sigterm_then_exits_0(containerd: tuple[Containerd, list[str]]) -> None:
    c, _ = containerd
    run = subprocess.Popen(
        [
            "ctr",
            "--address",
            str(c.sock),
            "--namespace",
            "k8s.io",
            "run",
            "--rm",
            images.PAUSE,
            "pause-1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: "RUNNING" in k8s(c, "task", "ls").stdout, "pause running")
        time.sleep(0.5)
        assert run.poll() is None  # still holding
        assert k8s(c, "task", "kill", "--signal", "SIGTERM", "pause-1").returncode == 0
        _, err = run.communicate(timeout=hang_guard(10))
    finally:
        if run.poll() is None:
            run.kill()
            c.remove("pause-1")
    assert run.returncode == 0
    assert "pause: stopping" in err
    assert "not PID 1" not in err


def test_a_build_when_cached_does_nothing(built: dict[str, Any]) -> None:
    if (before := images.cached()) is None:
        pytest.skip("the checkout changed since the build: the project's images are stale")
    t = time.monotonic()
    said = images.build()
    assert said.startswith("images: cached")
    assert time.monotonic() - t < hang_guard(10)
    assert images.read_stamp() == before  # nothing built again
