"""The real Kubernetes binaries for the tests, built once per machine and cached:
kube-apiserver (tests/kube/apiserver.py's lab) and the node's kubelet,
kube-controller-manager, kube-scheduler and kube-proxy (tests/kube/node.py's), plus kubectl.

No registry this machine reaches ships them, but Debian's archive has the source:
bookworm's `kubernetes` source package (v1.20.2, the full tree with vendor/) builds
offline with Debian's Go 1.19, every binary with CGO_ENABLED=0 in one make run (about
9 min on 2 cores). kubectl comes ready-made in bookworm's
`kubernetes-client` .deb, unpacked into the cache (/usr/bin/kubectl may belong to another
package, so nothing is installed system-wide). The source and the .deb come through a
private apt state (deb-src lines on the machine's own mirrors); the machine's apt sources
are left as they are. The Go toolchain and the other build packages are installed from
the machine's sources only when a build runs.

One fix to the tree before it builds: the vendored modern-go/reflect2 1.0.1 panics
decoding JSON under Go >= 1.18 (every create fails with a stream error), so Debian's
1.0.2 replaces it. The build tree, its Go build cache (_output/local/go/cache) and Go's
work dirs (kept under the tree's work/ dir, not /tmp), 2.9 GB at the peak, are deleted
once the binaries are in the cache.

    python -m tests.kube.build            build and unpack what the cache lacks (a second
                                          run does nothing and returns at once)
    python -m tests.kube.build --force    build again
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests.vm import kernels

CACHE = Path(os.environ.get("KUBE_CACHE", "/var/cache/lens-ebpf/kube"))
APISERVER = CACHE / "bin" / "kube-apiserver"
KUBECTL = CACHE / "bin" / "kubectl"
# The node's binaries (tests/kube/node.py): built in the same make run as the API server.
KUBELET = CACHE / "bin" / "kubelet"
CONTROLLER_MANAGER = CACHE / "bin" / "kube-controller-manager"
SCHEDULER = CACHE / "bin" / "kube-scheduler"
PROXY = CACHE / "bin" / "kube-proxy"
SERVERS = (APISERVER, KUBELET, CONTROLLER_MANAGER, SCHEDULER, PROXY)
STAMP = CACHE / "build.json"  # written last: what was built, from which source, how long
ERROR = CACHE / "build-error"  # the last failure, for the lab's skip reason

SUITE = "bookworm"  # the last Debian suite with a `kubernetes` source package
SOURCE = "kubernetes"
CLIENT = "kubernetes-client"
# Installed from the machine's own sources only when a build runs; etcd-server and
# openssl are what the lab needs at run time (scripts/setup.sh test installs those too).
BUILD_PACKAGES = (
    "golang-go",
    "golang-github-modern-go-reflect2-dev",
    "dpkg-dev",
    "make",
    "rsync",
    "etcd-server",
    "openssl",
)
REFLECT2 = Path("/usr/share/gocode/src/github.com/modern-go/reflect2")


class BuildError(Exception):
    """The build or the unpack failed, with the reason."""


def cached() -> dict[str, str] | None:
    """What the cache holds (build.json), or None when the build has not completed."""
    if not (all(b.is_file() for b in (*SERVERS, KUBECTL)) and STAMP.is_file()):
        return None
    try:
        got: dict[str, str] = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return None
    return got


def _run(
    cmd: list[str],
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    log: Path | None = None,
) -> str:
    """stdout; a BuildError with the end of stderr (or of the log) when it fails."""
    if log is None:
        r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
        out, err = r.stdout, r.stderr
    else:
        with log.open("w") as f:
            r = subprocess.run(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT, text=True)
        out, err = "", log.read_text(errors="replace")
    if r.returncode != 0:
        tail = " | ".join(err.strip().splitlines()[-6:])[-800:]
        said = " ".join(a for a in cmd if not a.startswith("-o"))  # not the apt options
        raise BuildError(f"{said[:120]} exited {r.returncode}: {tail}")
    return out


def _install(packages: tuple[str, ...]) -> list[str]:
    """Install what of `packages` is missing, from the machine's own apt sources."""
    missing = []
    for p in packages:
        r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", p], capture_output=True, text=True)
        if "install ok installed" not in r.stdout:
            missing.append(p)
    if not missing:
        return []
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    try:
        _run(install, env=env)
    except BuildError:  # stale package lists: update once and try again
        _run(["apt-get", "update", "-q"], env=env)
        _run(install, env=env)
    return missing


def _apt_opts(state: Path) -> list[str]:
    return [
        f"-oDir::Etc::SourceList={state / 'sources.list'}",
        "-oDir::Etc::SourceParts=/dev/null",
        f"-oDir::State::Lists={state / 'lists'}",
        f"-oDir::Cache={state / 'cache'}",
        "-oAPT::Architecture=amd64",
        "-oAPT::Architectures=amd64",
        "-oAcquire::Languages=none",
        "-oDebug::NoLocking=1",
        "-q",
    ]


def _apt_state(work: Path) -> Path:
    """A private apt state with bookworm's deb and deb-src lines on the machine's mirrors
    (the machine's own sources usually carry no deb-src line)."""
    state = work / "apt"
    (state / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (state / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    try:
        main, security = kernels._mirrors()
    except kernels.FetchError as exc:
        raise BuildError(str(exc)) from exc
    lines = []
    for kind in ("deb", "deb-src"):
        lines.append(f"{kind} {main} {SUITE} main")
        lines.append(f"{kind} {main} {SUITE}-updates main")
        lines.append(f"{kind} {security} {SUITE}-security main")
    (state / "sources.list").write_text("\n".join(lines) + "\n")
    return state


def _replace_reflect2(tree: Path) -> None:
    """vendor/github.com/modern-go/reflect2 1.0.1 -> Debian's 1.0.2 (the Go >= 1.18 fix);
    the package's Go and assembly files only, as `go mod vendor` would copy them."""
    if not (REFLECT2 / "reflect2.go").is_file():
        raise BuildError(f"{REFLECT2} is missing (golang-github-modern-go-reflect2-dev)")
    dest = tree / "vendor" / "github.com" / "modern-go" / "reflect2"
    shutil.rmtree(dest)
    dest.mkdir()
    for f in REFLECT2.iterdir():
        code = f.suffix in (".go", ".s") and not f.name.endswith("_test.go")
        if f.is_file() and (code or f.name == "LICENSE"):
            shutil.copy2(f, dest / f.name)


def _version(binary: Path, *args: str) -> str:
    """What the binary says it is ("Kubernetes v1.20.2", "Client Version: v1.20.2"), as
    "<name> v1.20.2": proof that the copy runs."""
    out = _run([str(binary), *args]).split()
    version = next((w for w in out if w.startswith("v1.")), None)
    if version is None:
        raise BuildError(f"{binary} {' '.join(args)} printed {' '.join(out)!r}")
    return f"{binary.name.removesuffix('.tmp')} {version}"


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One build at a time per cache (setup.sh and a hand-run build may overlap)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / ".lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def build(force: bool = False) -> str:
    """Build kube-apiserver and unpack kubectl into the cache unless it holds them; a
    line saying what was done and how long it took."""
    t0 = time.monotonic()
    if not force and (got := cached()) is not None:
        return f"kube: cached in {CACHE} ({got['apiserver']}, {got['kubectl']})"
    with _locked():
        if not force and (got := cached()) is not None:  # another run built it meanwhile
            return f"kube: cached in {CACHE} ({got['apiserver']}, {got['kubectl']})"
        STAMP.unlink(missing_ok=True)
        work = CACHE / "work"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        phases: dict[str, float] = {}
        try:
            t = time.monotonic()
            installed = _install(BUILD_PACKAGES)
            phases["packages"] = time.monotonic() - t

            t = time.monotonic()
            state = _apt_state(work)
            opts = _apt_opts(state)
            _run(["apt-get", *opts, "update"])
            src = work / "src"
            src.mkdir()
            _run(["apt-get", *opts, "source", SOURCE], cwd=src)
            dsc = sorted(src.glob(f"{SOURCE}_*.dsc"))
            trees = sorted(p for p in src.glob(f"{SOURCE}-*") if p.is_dir())
            if not dsc or not trees:
                raise BuildError(f"apt-get source {SOURCE} gave no unpacked tree")
            source_version = dsc[-1].stem.split("_", 1)[1]
            tree = trees[-1]
            _replace_reflect2(tree)
            phases["source"] = time.monotonic() - t

            print(
                f"kube: building kube-apiserver, kubelet, kube-controller-manager, "
                f"kube-scheduler and kube-proxy from {SOURCE} {source_version} "
                f"(about 9 min on 2 cores)",
                flush=True,
            )
            t = time.monotonic()
            home, gotmp = work / "home", work / "tmp"
            home.mkdir()
            gotmp.mkdir()
            # GOPATH and GOCACHE are set by hack/lib/golang.sh inside _output/; Go's own
            # work dirs (over 1 GB at the peak, /tmp/go-build* otherwise) and HOME go
            # under work/ too: the rmtree below takes all of it (the next run's, after a
            # kill -9). GOPROXY=off keeps the build offline.
            env = {
                **os.environ,
                "CGO_ENABLED": "0",
                "HOME": str(home),
                "GOFLAGS": "",
                "GOPROXY": "off",
                "GOTOOLCHAIN": "local",
                "GOTMPDIR": str(gotmp),
                "TMPDIR": str(gotmp),
            }
            log = CACHE / "build.log"
            what = " ".join(f"cmd/{b.name}" for b in SERVERS)
            _run(["make", f"WHAT={what}"], cwd=tree, env=env, log=log)
            APISERVER.parent.mkdir(parents=True, exist_ok=True)
            versions = []
            for binary in SERVERS:
                built = tree / "_output" / "bin" / binary.name
                if not built.is_file():
                    raise BuildError(f"make gave no {built.relative_to(tree)}; see {log}")
                tmp = binary.with_name(f"{binary.name}.tmp")
                shutil.copy2(built, tmp)
                versions.append(_version(tmp, "--version"))
                tmp.rename(binary)
            apiserver_version = versions[0]
            phases["build"] = time.monotonic() - t

            t = time.monotonic()
            debs = work / "debs"
            debs.mkdir()
            _run(["apt-get", *opts, "download", CLIENT], cwd=debs)
            deb = sorted(debs.glob(f"{CLIENT}_*.deb"))
            if not deb:
                raise BuildError(f"apt-get download {CLIENT} gave no .deb")
            root = work / "client"
            _run(["dpkg-deb", "-x", str(deb[-1]), str(root)])
            tmp = KUBECTL.with_name("kubectl.tmp")
            shutil.copy2(root / "usr" / "bin" / "kubectl", tmp)
            kubectl_version = _version(tmp, "version", "--client", "--short")
            tmp.rename(KUBECTL)
            phases["kubectl"] = time.monotonic() - t
        finally:
            shutil.rmtree(work, ignore_errors=True)
        total = time.monotonic() - t0
        STAMP.write_text(
            json.dumps(
                {
                    "apiserver": apiserver_version,
                    "kubectl": kubectl_version,
                    "node": ", ".join(versions[1:]),
                    "source": f"{SOURCE} {source_version}",
                    "client": deb[-1].name,
                    "installed": installed,
                    "seconds": round(total, 1),
                    "phases": {k: round(v, 1) for k, v in phases.items()},
                },
                indent=1,
            )
            + "\n"
        )
        ERROR.unlink(missing_ok=True)
    said = ", ".join(f"{k} {v:.0f} s" for k, v in phases.items())
    extra = f"; installed {' '.join(installed)}" if installed else ""
    return (
        f"kube: built {apiserver_version} from {SOURCE} {source_version} and unpacked "
        f"{kubectl_version} into {CACHE} in {total:.0f} s ({said}){extra}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.kube.build",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--force", action="store_true", help="build again even when cached")
    args = ap.parse_args(argv)
    try:
        print(build(force=args.force), flush=True)
    except (BuildError, OSError) as exc:
        print(f"kube: {exc}", file=sys.stderr)
        with contextlib.suppress(OSError):
            CACHE.mkdir(parents=True, exist_ok=True)
            ERROR.write_text(str(exc))  # the lab's skip says why
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
