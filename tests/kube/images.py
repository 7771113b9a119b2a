"""The container images a real Kubernetes node in the lab runs, made without a registry
and cached between runs.

No registry this machine reaches serves container images, so every image is made here
with buildah, in a private store (vfs driver, no registries configured, nothing in the
system's container storage), and archived for `ctr images import`:

    localhost/lens-lab/pause:1         the pod sandbox: tests/kube/pause.c, gcc -static
    localhost/lens-lab/busybox:1       Debian's busybox-static and its applet links: client
                                       workloads (sh, wget, nc, sleep)
    debian:bookworm-20241111-slim      the Dockerfile's FROM, made with debootstrap
                                       --variant=minbase from the machine's own mirror
                                       (the name is read from the Dockerfile)
    lens-ebpf:0.1.0                    the Dockerfile's agent and recorder targets, built
    lens-ebpf-recorder:0.1.0           as users build them (the tags deploy/ names)

Each is tagged, archived and imported under the name containerd and the kubelet give it
(docker.io/library/lens-ebpf:0.1.0 for `image: lens-ebpf:0.1.0`: containerd_name()).

The project's images are built again when what the Dockerfile copies changes (the
checkout's files under those paths, hashed); the others once. pip inside the build uses
this machine's pip configuration (index, find-links, constraints, CA bundle), mounted
read-only for the build only: the Dockerfile is used unchanged.

    python -m tests.kube.images            build what the cache lacks or what changed
    python -m tests.kube.images --force    build everything again
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from tests.vm import kernels

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
PAUSE_SOURCE = Path(__file__).with_name("pause.c")

CACHE = Path(os.environ.get("IMAGES_CACHE", "/var/cache/lens-ebpf/images"))
STORAGE = CACHE / "storage"  # buildah's --root (vfs)
RUNROOT = CACHE / "run"
STAMP = CACHE / "images.json"  # per image: the key it was built from, how long, how big
ERROR = CACHE / "build-error"  # the last failure, for the skip reason

SUITE = "bookworm"
BUSYBOX_BINARY = Path("/bin/busybox")  # busybox-static's
RUNTIME_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What the Dockerfile's COPY lines take from the build context (and the files that
# decide how: the Dockerfile itself and .dockerignore).
CONTEXT = (
    "Dockerfile",
    ".dockerignore",
    "pyproject.toml",
    "README.md",
    "scripts/setup.sh",
    "lens_ebpf",
)
# In the build, pip's site-wide configuration directory is a read-only mount holding the
# pip.conf made from this machine's, and under host/ the host's files it names (never
# over a path the image's packages write, such as /etc/ssl/certs/ca-certificates.crt).
# A bind mount leaves its mount point behind in the image: this directory, empty.
PIP_DIR = "/etc/xdg/pip"
PIP_MOUNTS = f"{PIP_DIR}/host"


def _base_image() -> str:
    """The name the Dockerfile's first FROM line names."""
    for line in DOCKERFILE.read_text().splitlines():
        if m := re.match(r"\s*FROM\s+(?:--\S+\s+)*(\S+)", line, re.IGNORECASE):
            return m.group(1)
    raise ValueError(f"{DOCKERFILE} has no FROM line")


def _deployed_image(manifest: Path) -> str:
    """The first container's image in a deploy/ manifest."""
    for doc in yaml.safe_load_all(manifest.read_text()):
        if isinstance(doc, dict) and doc.get("kind") in ("DaemonSet", "Deployment"):
            return str(doc["spec"]["template"]["spec"]["containers"][0]["image"])
    raise ValueError(f"{manifest} has no DaemonSet or Deployment")


PAUSE = "localhost/lens-lab/pause:1"
BUSYBOX = "localhost/lens-lab/busybox:1"
BASE = _base_image()
AGENT = _deployed_image(REPO / "deploy" / "daemonset.yaml")
RECORDER = _deployed_image(REPO / "deploy" / "recorder" / "deployment.yaml")
TARGETS = {AGENT: "agent", RECORDER: "recorder"}  # the Dockerfile's stage for each
IMAGES = (BASE, PAUSE, BUSYBOX, RECORDER, AGENT)  # in build order
POD_IMAGES = (PAUSE, BUSYBOX, AGENT, RECORDER)  # what a node's containerd imports


class BuildError(Exception):
    """A build step failed, with the reason."""


def containerd_name(ref: str) -> str:
    """The name the kubelet asks containerd for, given a pod spec's `image:`
    (lens-ebpf:0.1.0 -> docker.io/library/lens-ebpf:0.1.0; localhost/x:1 stays)."""
    name, _, digest = ref.partition("@")
    first, _, rest = name.partition("/")
    if not rest or ("." not in first and ":" not in first and first != "localhost"):
        name = f"docker.io/{name}"
        first, _, rest = name.partition("/")
    if first == "docker.io" and "/" not in rest:
        name = f"docker.io/library/{rest}"
    if not digest and ":" not in name.rsplit("/", 1)[-1]:
        name += ":latest"
    return f"{name}@{digest}" if digest else name


def archive(ref: str) -> Path:
    """Where the image's docker-archive lies."""
    stem = containerd_name(ref).split("/", 1)[1].replace("/", "_").replace(":", "_")
    return CACHE / f"{stem}.tar"


def read_stamp() -> dict[str, Any]:
    """What the cache's images.json says was built (current or not); {} when none."""
    try:
        got: dict[str, Any] = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return {}
    return got


def _context_files() -> list[str]:
    """The files of the build context the Dockerfile copies: the checkout's tracked and
    untracked-but-not-ignored ones (no __pycache__, no build output)."""
    r = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *CONTEXT],
        cwd=REPO,
        capture_output=True,
    )
    if r.returncode == 0:
        names = {n for n in r.stdout.decode().split("\0") if n}
    else:  # not a git checkout: every file but Python's caches
        names = set()
        for top in CONTEXT:
            p = REPO / top
            found = [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file()]
            names |= {str(f.relative_to(REPO)) for f in found if "__pycache__" not in f.parts}
    return sorted(n for n in names if (REPO / n).is_file())


def source_key() -> str:
    """A hash of the context files' names, contents and executable bits."""
    h = hashlib.sha256()
    for name in _context_files():
        p = REPO / name
        h.update(name.encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
        h.update(b"x" if os.access(p, os.X_OK) else b"-")
    return h.hexdigest()


def _pip_settings() -> dict[str, dict[str, str]]:
    """This machine's pip configuration as pip itself merges it (its files and PIP_*
    variables, the variables winning), by section."""
    r = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True
    )
    sections: dict[str, dict[str, str]] = {}
    env: dict[str, str] = {}
    for line in r.stdout.splitlines():
        m = re.match(r"(:env:|[\w-]+)\.([\w-]+)=(.*)$", line.strip())
        if not m:
            continue
        try:
            value = str(ast.literal_eval(m.group(3)))
        except (ValueError, SyntaxError):
            continue
        if m.group(1) == ":env:":
            env[m.group(2)] = value
        else:
            sections.setdefault(m.group(1), {})[m.group(2)] = value
    for key, value in env.items():
        for section in sections.values():
            section.pop(key, None)
        sections.setdefault("global", {})[key] = value
    return sections


def pip_config() -> tuple[str, list[tuple[Path, str]]]:
    """The pip.conf the build's pip reads, and the host paths it names with where each is
    mounted; a path named in the machine's configuration that does not exist is left out
    (pip would only warn about it)."""
    mounts: dict[Path, str] = {}

    def moved(key: str, token: str) -> str | None:
        url = token.startswith("file://")
        path = Path(urlparse(token).path if url else token)
        if not path.is_absolute():
            return token  # a remote URL or a plain value
        if not path.exists():
            return None
        # A local index's pages may link up to its files (../../files/x.whl): mount the
        # directory that holds `simple/`.
        top = path.parent if key.endswith("index-url") and path.name == "simple" else path
        mounts[top] = f"{PIP_MOUNTS}{top}"
        return f"file://{PIP_MOUNTS}{path}" if url else f"{PIP_MOUNTS}{path}"

    lines = [
        "# Made by tests/kube/images.py from this machine's pip configuration;",
        f"# mounted at {PIP_DIR}/pip.conf for the image build only.",
    ]
    for section, settings in sorted(_pip_settings().items()):
        lines.append(f"[{section}]")
        for key, value in sorted(settings.items()):
            tokens = [t for t in (moved(key, t) for t in value.split()) if t is not None]
            if tokens:
                lines.append(f"{key} = {' '.join(tokens)}")
    return "\n".join(lines) + "\n", sorted(mounts.items())


def _keys(stamp: dict[str, Any]) -> dict[str, str]:
    """The key each image is built from now; an image whose stamped key differs is built
    again. The project's images hang on the base image that was built (its id)."""
    base_id = stamp.get("images", {}).get(BASE, {}).get("id", "")
    pip_text, _ = pip_config()
    project = hashlib.sha256(f"{source_key()} {base_id} {pip_text}".encode()).hexdigest()
    busybox = (
        hashlib.sha256(BUSYBOX_BINARY.read_bytes()).hexdigest()
        if (BUSYBOX_BINARY.is_file())
        else ""
    )
    return {
        BASE: f"debootstrap --variant=minbase {SUITE} as {BASE}, "
        + hashlib.sha256((SLIM_DPKG + APT_CLEAN).encode()).hexdigest(),
        PAUSE: hashlib.sha256(PAUSE_SOURCE.read_bytes()).hexdigest(),
        BUSYBOX: busybox,
        RECORDER: f"recorder {project}",
        AGENT: f"agent {project}",
    }


def _stale() -> list[str]:
    """The images not archived, or archived from other sources than the checkout's now."""
    stamp = read_stamp()
    built = stamp.get("images", {})
    try:
        keys = _keys(stamp)
    except OSError:
        return list(IMAGES)
    return [
        ref
        for ref in IMAGES
        if built.get(ref, {}).get("key") != keys[ref] or not archive(ref).is_file()
    ]


def cached() -> dict[str, Any] | None:
    """The stamp (images.json) when every image is archived from what the checkout holds
    now; None when something is missing or out of date."""
    return None if _stale() else read_stamp()


def cannot_build() -> str:
    """Why the images cannot be built here; empty when they can."""
    if os.geteuid() != 0:
        return "the lab's images are built as root (buildah, debootstrap)"
    for tool, package in (
        ("buildah", "buildah"),
        ("debootstrap", "debootstrap"),
        ("runc", "runc"),
        ("gcc", "gcc"),
        ("ctr", "containerd"),
    ):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/setup.sh test installs {package})"
    if not BUSYBOX_BINARY.is_file():
        return "busybox-static is not installed (scripts/setup.sh test installs it)"
    if not any(Path(d, "libc.a").is_file() for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib")):
        return "libc6-dev's libc.a is missing (the pause image is linked statically)"
    return ""


def unavailable() -> str:
    """Why a lab cannot use the images now; empty when every archive is cached and current."""
    if why := cannot_build():
        return why
    if stale := _stale():
        why = f"{', '.join(stale)} not built, or built from other sources, in {CACHE}"
        with contextlib.suppress(OSError):
            why += f" (the last build failed: {ERROR.read_text().strip()[:300]})"
        return f"{why}: run python -m tests.kube.images (scripts/setup.sh test does)"
    return ""


def _environ() -> dict[str, str]:
    """buildah's environment: registries, storage and policy files of the cache's own."""
    return {
        **os.environ,
        "CONTAINERS_REGISTRIES_CONF": str(CACHE / "registries.conf"),
        "CONTAINERS_STORAGE_CONF": str(CACHE / "storage.conf"),
        "BUILDAH_ISOLATION": "oci",
    }


def _write_configs() -> None:
    CACHE.mkdir(parents=True, exist_ok=True)
    (CACHE / "registries.conf").write_text("unqualified-search-registries = []\n")
    (CACHE / "storage.conf").write_text(
        f'[storage]\ndriver = "vfs"\ngraphroot = "{STORAGE}"\nrunroot = "{RUNROOT}"\n'
    )
    (CACHE / "policy.json").write_text('{"default": [{"type": "insecureAcceptAnything"}]}\n')


def buildah_cmd(*args: str) -> list[str]:
    """A buildah command line on the cache's private store."""
    return [
        "buildah",
        "--root",
        str(STORAGE),
        "--runroot",
        str(RUNROOT),
        "--storage-driver",
        "vfs",
        *args,
    ]


def _policy() -> list[str]:
    return ["--signature-policy", str(CACHE / "policy.json")]


def _run(cmd: list[str], log: Path | None = None, timeout: float = 1800) -> str:
    """stdout; a BuildError with the end of stderr (or of the log) when it fails."""
    env = _environ() if cmd[0] == "buildah" else None
    if log is None:
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
        out, err = r.stdout, r.stderr
    else:
        with log.open("w") as f:
            r = subprocess.run(
                cmd, stdout=f, stderr=subprocess.STDOUT, text=True, env=env, timeout=timeout
            )
        out, err = "", log.read_text(errors="replace")
    if r.returncode != 0:
        tail = " | ".join(err.strip().splitlines()[-8:])[-900:]
        said = " ".join(a for a in cmd if not a.startswith("--root"))
        raise BuildError(f"{said[:160]} exited {r.returncode}: {tail}")
    return out


def buildah(*args: str, timeout: float = 600) -> str:
    """buildah's stdout on the private store (configuration files written first)."""
    if not (CACHE / "policy.json").is_file():
        _write_configs()
    return _run(buildah_cmd(*args), timeout=timeout)


def image_config(ref: str) -> dict[str, Any]:
    """The image's Docker config (Entrypoint, Cmd, User, Env, ...)."""
    got: dict[str, Any] = json.loads(buildah("inspect", "--type", "image", ref))
    return dict(got["Docker"]["config"])


def run_in(ref: str, *cmd: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `cmd` in a working container of the image (as the image's user), then remove it."""
    name = buildah("from", "--pull=never", *_policy(), ref).strip()
    try:
        return subprocess.run(
            buildah_cmd("run", "--network", "host", name, "--", *cmd),
            capture_output=True,
            text=True,
            env=_environ(),
            timeout=timeout,
        )
    finally:
        subprocess.run(buildah_cmd("rm", name), capture_output=True, env=_environ())


@contextlib.contextmanager
def _scratch() -> Iterator[tuple[str, Path]]:
    """A working container from scratch and its mounted root; removed afterwards."""
    name = buildah("from", *_policy(), "scratch").strip()
    try:
        root = Path(buildah("mount", name).strip())
        if not root.is_dir() or STORAGE not in root.parents:
            raise BuildError(f"buildah mount {name} gave {root}, not a directory in {STORAGE}")
        yield name, root
    finally:
        subprocess.run(buildah_cmd("rm", name), capture_output=True, env=_environ())


def _commit(name: str, ref: str) -> str:
    """Commit the working container as `ref` (the name containerd will know); its id."""
    return buildah(
        "commit", *_policy(), "--format", "docker", "--rm", "-q", name, containerd_name(ref)
    ).strip()


def _make_pause(work: Path) -> str:
    binary = work / "pause"
    _run(["gcc", "-static", "-O2", "-s", "-Wall", "-Werror", "-o", str(binary), str(PAUSE_SOURCE)])
    if _run([str(binary), "-v"]).strip() != "lens-lab pause 1":
        raise BuildError(f"{binary} -v did not say what it is")
    with _scratch() as (name, root):
        shutil.copy2(binary, root / "pause")
        buildah("config", "--entrypoint", '["/pause"]', "--os", "linux", "--arch", "amd64", name)
        return _commit(name, PAUSE)


def _make_busybox() -> str:
    applets = _run([str(BUSYBOX_BINARY), "--list-full"]).split()
    with _scratch() as (name, root):
        for d in ("bin", "sbin", "usr/bin", "usr/sbin", "tmp", "etc", "root"):
            (root / d).mkdir(parents=True, exist_ok=True)
        (root / "tmp").chmod(0o1777)
        shutil.copy2(BUSYBOX_BINARY, root / "bin" / "busybox")
        for applet in applets:
            link = root / applet
            if applet != "bin/busybox" and not link.exists():
                link.symlink_to("/bin/busybox")
        (root / "etc" / "passwd").write_text(
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"
        )
        (root / "etc" / "group").write_text("root:x:0:\nnogroup:x:65534:\n")
        buildah(
            "config",
            "--env",
            f"PATH={RUNTIME_PATH}",
            "--cmd",
            "sh",
            "--os",
            "linux",
            "--arch",
            "amd64",
            name,
        )
        return _commit(name, BUSYBOX)


# What Debian's slim images leave out, and dpkg leaves out of later installs (the
# Dockerfile's apt-get runs): documentation but the licences, manuals, translations.
SLIM_DPKG = """\
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
"""

# apt as in Debian's images: no .deb kept after an install, no binary package caches, no
# translations (without it a RUN's apt-get leaves its downloads in the layer).
APT_CLEAN = """\
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::Languages "none";
"""  # noqa: E501


def _slim(root: Path) -> None:
    """Drop what SLIM_DPKG excludes from a fresh debootstrap tree, and what it took from
    the host (resolv.conf, hostname) and its apt lists and logs."""
    (root / "etc" / "dpkg" / "dpkg.cfg.d" / "lens-lab-slim").write_text(SLIM_DPKG)
    (root / "etc" / "apt" / "apt.conf.d" / "lens-lab-clean").write_text(APT_CLEAN)
    share = root / "usr" / "share"
    for doc in (share / "doc").glob("*"):
        for f in doc.rglob("*") if doc.is_dir() else [doc]:
            if f.name != "copyright" and (f.is_file() or f.is_symlink()):
                f.unlink()
    for d in ("man", "groff", "info", "lintian", "linda"):
        shutil.rmtree(share / d, ignore_errors=True)
    for f in (share / "locale").glob("*"):
        if f.name != "locale.alias":
            shutil.rmtree(f) if f.is_dir() else f.unlink()
    for d in ("var/lib/apt/lists", "var/cache/apt", "var/log"):
        for f in (root / d).rglob("*"):
            if f.is_file() or f.is_symlink():
                f.unlink()
    for name in ("etc/resolv.conf", "etc/hostname"):
        (root / name).unlink(missing_ok=True)


def _make_base(work: Path, phases: dict[str, float]) -> str:
    try:
        main, security = kernels._mirrors()
    except kernels.FetchError as exc:
        raise BuildError(str(exc)) from exc
    with _scratch() as (name, root):
        t = time.monotonic()
        _run(
            ["debootstrap", "--variant=minbase", SUITE, str(root), main],
            log=work / "debootstrap.log",
        )
        phases["debootstrap"] = time.monotonic() - t
        # The official image's sources (main, updates, security), on this machine's mirrors.
        (root / "etc" / "apt" / "sources.list").unlink(missing_ok=True)
        (root / "etc" / "apt" / "sources.list.d" / "debian.sources").write_text(
            f"Types: deb\nURIs: {main}\nSuites: {SUITE} {SUITE}-updates\nComponents: main\n"
            "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
            f"Types: deb\nURIs: {security}\nSuites: {SUITE}-security\nComponents: main\n"
            "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
        )
        _slim(root)
        buildah(
            "config",
            "--env",
            f"PATH={RUNTIME_PATH}",
            "--cmd",
            "bash",
            "--os",
            "linux",
            "--arch",
            "amd64",
            name,
        )
        t = time.monotonic()
        got = _commit(name, BASE)
        phases["commit"] = time.monotonic() - t
        return got


def _make_project(ref: str, work: Path) -> str:
    """`buildah bud` of the Dockerfile's target for `ref`, as a user builds it, with this
    machine's pip configuration mounted for the build."""
    pip_text, mounts = pip_config()
    conf = work / "pip"
    conf.mkdir()
    (conf / "pip.conf").write_text(pip_text)
    volumes = ["-v", f"{conf}:{PIP_DIR}:ro"]
    for host, inside in mounts:
        stub = conf / Path(inside).relative_to(PIP_DIR)  # its mount point, made here
        stub.parent.mkdir(parents=True, exist_ok=True)
        stub.mkdir() if host.is_dir() else stub.touch()
        volumes += ["-v", f"{host}:{inside}:ro"]
    log = CACHE / f"{TARGETS[ref]}.log"
    _run(
        buildah_cmd(
            "bud",
            *_policy(),
            "--pull-never",
            "--network",
            "host",
            "--format",
            "docker",
            "--layers=false",
            "-f",
            str(DOCKERFILE),
            "--target",
            TARGETS[ref],
            "-t",
            containerd_name(ref),
            *volumes,
            str(REPO),
        ),
        log=log,
    )
    return _image_id(ref)


def _image_id(ref: str) -> str:
    return buildah(
        "inspect", "--type", "image", "--format", "{{.FromImageID}}", containerd_name(ref)
    ).strip()


def _present(ref: str) -> bool:
    r = subprocess.run(
        buildah_cmd("inspect", "--type", "image", containerd_name(ref)),
        capture_output=True,
        env=_environ(),
    )
    return r.returncode == 0


def _push(ref: str) -> int:
    """Archive the image (docker-archive, named as containerd will name it); its bytes."""
    dest = archive(ref)
    tmp = dest.with_name(dest.name + ".tmp")
    tmp.unlink(missing_ok=True)
    name = containerd_name(ref)
    buildah("push", *_policy(), "-q", name, f"docker-archive:{tmp}:{name}")
    tmp.rename(dest)
    return dest.stat().st_size


def _clean_up() -> None:
    """What a killed run leaves (under the lock, no other run's): mounts in the store (a
    debootstrap's /proc and /sys), working containers, work dirs; and replaced images."""
    with contextlib.suppress(OSError):
        points = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        for point in sorted(points, reverse=True):  # the deepest first
            if (
                point.startswith(f"{STORAGE}/")
                and "/vfs/dir/" in point
                and (point.endswith(("/proc", "/sys")))
            ):
                subprocess.run(["umount", "-l", point], capture_output=True)
    subprocess.run(buildah_cmd("rm", "--all"), capture_output=True, env=_environ())
    subprocess.run(buildah_cmd("rmi", "--prune", "--force"), capture_output=True, env=_environ())
    for work in CACHE.glob("work-*"):
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One build at a time per cache (setup.sh and a test may overlap)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def build(force: bool = False) -> str:
    """Build and archive what the cache lacks or what changed; a line saying what was done."""
    if why := cannot_build():
        raise BuildError(why)
    if not force and (got := cached()) is not None:
        return f"images: cached in {CACHE} ({_sizes(got)})"
    with _locked():
        _write_configs()
        _clean_up()
        stamp = read_stamp() if not force else {}
        built: dict[str, Any] = stamp.setdefault("images", {})
        done = []
        t0 = time.monotonic()
        for ref in IMAGES:
            key = _keys(stamp)[ref]  # after BASE is built, the project key takes its id
            entry = built.get(ref, {})
            if entry.get("key") == key and archive(ref).is_file():
                continue
            print(f"images: building {ref}", flush=True)
            phases: dict[str, float] = {}
            t = time.monotonic()
            with tempfile.TemporaryDirectory(dir=CACHE, prefix="work-") as tmp:
                work = Path(tmp)
                if ref in TARGETS and not _present(BASE):  # the store was wiped: reload
                    buildah("pull", *_policy(), f"docker-archive:{archive(BASE)}")
                if ref == BASE:
                    image_id = _make_base(work, phases)
                elif ref == PAUSE:
                    image_id = _make_pause(work)
                elif ref == BUSYBOX:
                    image_id = _make_busybox()
                else:
                    image_id = _make_project(ref, work)
            phases["build"] = time.monotonic() - t
            t = time.monotonic()
            size = _push(ref)
            phases["archive"] = time.monotonic() - t
            built[ref] = {
                "key": key,
                "id": image_id,
                "archive": archive(ref).name,
                "bytes": size,
                "seconds": round(phases["build"] + phases["archive"], 1),
                "phases": {k: round(v, 1) for k, v in phases.items()},
                "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            STAMP.write_text(json.dumps(stamp, indent=1) + "\n")
            done.append(f"{ref} {built[ref]['seconds']:.0f} s")
        _clean_up()
        ERROR.unlink(missing_ok=True)
    total = time.monotonic() - t0
    return (
        f"images: built {', '.join(done) or 'nothing'} in {total:.0f} s into {CACHE} "
        f"({_sizes(stamp)})"
    )


def _sizes(stamp: dict[str, Any]) -> str:
    got = stamp.get("images", {})
    return ", ".join(f"{ref} {got[ref]['bytes'] / 1e6:.0f} MB" for ref in IMAGES if ref in got)


def import_into(
    address: str, namespace: str = "k8s.io", refs: tuple[str, ...] = POD_IMAGES
) -> list[str]:
    """Import the archives into the containerd at `address`; the names containerd lists,
    each the one the kubelet asks for given the image's name in a pod spec."""
    ctr = ["ctr", "--address", address, "--namespace", namespace]
    names = []
    for ref in refs:
        name = containerd_name(ref)
        out = _run([*ctr, "images", "import", str(archive(ref))], timeout=600)
        listed = set(_run([*ctr, "images", "ls", "-q"]).split())
        if name not in listed:  # named otherwise in the archive: tag it as the kubelet asks
            m = re.search(r"unpacking (\S+) \(", out)
            if m is None:
                raise BuildError(f"ctr images import {archive(ref)} said {out!r}")
            _run([*ctr, "images", "tag", m.group(1), name])
        names.append(name)
    return names


def import_missing(address: str, record: Path, namespace: str = "k8s.io") -> list[str]:
    """import_into for what containerd at `address` lacks: an archive imported there
    before (its size and mtime, in `record`, kept beside containerd's kept root) and
    still listed is not imported again (the agent's ~1.2 GB take 60-90 s); the names."""
    try:
        done: dict[str, list[int]] = json.loads(record.read_text())
    except (OSError, ValueError):
        done = {}
    ctr = ["ctr", "--address", address, "--namespace", namespace]
    listed = set(_run([*ctr, "images", "ls", "-q"]).split())
    todo = []
    for ref in POD_IMAGES:
        st = archive(ref).stat()
        key = [st.st_size, st.st_mtime_ns]
        if done.get(ref) != key or containerd_name(ref) not in listed:
            todo.append(ref)
            done[ref] = key
    if todo:
        import_into(address, namespace, tuple(todo))
        record.write_text(json.dumps(done, indent=1) + "\n")
    return [containerd_name(ref) for ref in POD_IMAGES]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.kube.images",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--force", action="store_true", help="build everything again")
    args = ap.parse_args(argv)
    try:
        print(build(force=args.force), flush=True)
    except (BuildError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"images: {exc}", file=sys.stderr)
        with contextlib.suppress(OSError):
            CACHE.mkdir(parents=True, exist_ok=True)
            ERROR.write_text(str(exc))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
