"""Debian's kernels for the test VMs: resolve the newest image of each series, fetch, cache.

Debian's archive drops superseded kernel ABIs, so nothing here pins an ABI: each run
asks the suite and its -updates and -security suites (a private apt state, the
machine's own sources left as they are) for the newest `linux-image-<series>.*-amd64-
unsigned` and its headers, downloads what the cache lacks and unpacks it.

    python -m tests.vm.kernels fetch      resolve, download and unpack every series
    python -m tests.vm.kernels list       what the cache holds
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

CACHE = Path(os.environ.get("KMATRIX_CACHE", "/var/cache/lens-ebpf/vm"))


@dataclass(frozen=True)
class Series:
    name: str  # what tests call it: "5.10"
    suite: str  # Debian suite that ships it
    prefix: str  # package version prefix inside linux-image-<prefix>...


SERIES = (
    Series("5.10", "bullseye", "5.10.0-"),
    Series("6.1", "bookworm", "6.1.0-"),
    Series("6.12", "trixie", "6.12."),
)


@dataclass
class Kernel:
    series: str
    abi: str  # "6.1.0-41-amd64"
    root: Path  # the unpacked image package (boot/, lib/modules/ or usr/lib/modules/)
    headers: Path  # the unpacked headers (usr/src/linux-headers-<abi>), or missing

    @property
    def vmlinuz(self) -> Path:
        return self.root / "boot" / f"vmlinuz-{self.abi}"

    @property
    def headers_source(self) -> Path | None:
        """Debian's split -common tree (the `source` link beside `build`)."""
        found = sorted(self.headers.parent.glob("linux-headers-*-common*"))
        return found[0] if found else None

    @property
    def modules(self) -> Path:
        for base in ("lib/modules", "usr/lib/modules"):
            d = self.root / base / self.abi
            if d.is_dir():
                return d
        raise FileNotFoundError(f"no modules for {self.abi} under {self.root}")


class FetchError(Exception):
    """A kernel could not be resolved or fetched, with the reason."""


def _mirrors() -> tuple[str, str]:
    """The machine's own Debian and Debian-security URIs (from its apt sources)."""
    texts = []
    for p in [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*")]:
        if p.suffix in (".list", ".sources") or p.name == "sources.list":
            try:
                texts.append(p.read_text())
            except OSError:
                continue
    uris = re.findall(
        r"(?:URIs:\s*|deb\s+(?:\[[^\]]*\]\s*)?)(\S+/debian(?:-security)?)\b", "\n".join(texts)
    )
    main = next((u for u in uris if u.endswith("/debian")), None)
    security = next((u for u in uris if u.endswith("/debian-security")), None)
    if main is None:
        raise FetchError("no Debian mirror in /etc/apt sources to fetch kernels from")
    if security is None:
        security = main.rsplit("/", 1)[0] + "/debian-security"
    return main, security


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


def _apt_state() -> Path:
    state = CACHE / "apt"
    (state / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (state / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    main, security = _mirrors()
    lines = []
    for s in SERIES:
        lines.append(f"deb {main} {s.suite} main")
        lines.append(f"deb {main} {s.suite}-updates main")
        lines.append(f"deb {security} {s.suite}-security main")
    (state / "sources.list").write_text("\n".join(lines) + "\n")
    return state


def _run(cmd: list[str], cwd: Path | None = None) -> str:
    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise FetchError(f"{' '.join(cmd[:3])}...: {r.stderr.strip()[-800:]}")
    return r.stdout


def _version_key(abi: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", abi))


def resolve(state: Path) -> dict[str, str]:
    """series -> the newest ABI the suites offer (e.g. "6.1.0-41-amd64")."""
    out = _run(["apt-cache", *_apt_opts(state), "pkgnames", "linux-image-"])
    newest: dict[str, str] = {}
    for name in out.split():
        # the generic flavour only: not -rt-, -cloud-
        m = re.fullmatch(r"linux-image-([\d.]+(?:-\d+|\+deb\d+)-amd64)-unsigned", name)
        if not m:
            continue
        abi = m.group(1)
        for s in SERIES:
            if abi.startswith(s.prefix) and (
                s.name not in newest or _version_key(abi) > _version_key(newest[s.name])
            ):
                newest[s.name] = abi
    missing = [s.name for s in SERIES if s.name not in newest]
    if missing:
        raise FetchError(f"no kernel image found for series {', '.join(missing)}")
    return newest


def _unpack(state: Path, package: str, dest: Path) -> None:
    debs = CACHE / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    have = sorted(debs.glob(f"{package}_*.deb"))
    if not have:
        _run(["apt-get", *_apt_opts(state), "download", package], cwd=debs)
        have = sorted(debs.glob(f"{package}_*.deb"))
    if not have:
        raise FetchError(f"apt-get download {package} gave no .deb")
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _run(["dpkg-deb", "-x", str(have[-1]), str(tmp)])
    tmp.rename(dest)


def _depmod(image: Path, abi: str) -> None:
    """Packages ship no modules.dep (the postinst makes it): make it, for modprobe."""
    if not (image / "lib").exists() and (image / "usr" / "lib" / "modules").is_dir():
        (image / "lib").symlink_to("usr/lib")  # merged-/usr trees (trixie)
    if not (image / "lib" / "modules" / abi / "modules.dep").exists():
        _run(["depmod", "-b", str(image), abi])


def fetch(update: bool = True) -> list[Kernel]:
    """Resolve and fetch every series (cached: a second run downloads nothing new)."""
    state = _apt_state()
    if update:
        _run(["apt-get", *_apt_opts(state), "update"])
    abis = resolve(state)
    kernels = []
    for s in SERIES:
        abi = abis[s.name]
        base = CACHE / "kernels" / abi
        image, headers = base / "image", base / "headers"
        if not image.is_dir():
            _unpack(state, f"linux-image-{abi}-unsigned", image)
        _depmod(image, abi)
        if not headers.is_dir():
            # the arch-specific package symlinks into the common one: unpack both together
            common = _run(["apt-cache", *_apt_opts(state), "depends", f"linux-headers-{abi}"])
            deps = re.findall(r"Depends: (linux-headers-\S+-common\S*)", common)
            _unpack(state, f"linux-headers-{abi}", headers)
            for dep in deps:
                _unpack(state, dep, base / "headers-common")
                _run(["cp", "-a", f"{base / 'headers-common'}/.", str(headers)])
                shutil.rmtree(base / "headers-common")
        kernels.append(Kernel(s.name, abi, image, headers / "usr" / "src" / f"linux-headers-{abi}"))
    (CACHE / "kernels" / "resolved.json").write_text(
        json.dumps([{k: str(v) for k, v in asdict(kern).items()} for kern in kernels], indent=1)
    )
    return kernels


def cached() -> list[Kernel]:
    """What the last fetch resolved (empty when nothing was fetched)."""
    path = CACHE / "kernels" / "resolved.json"
    if not path.exists():
        return []
    return [
        Kernel(d["series"], d["abi"], Path(d["root"]), Path(d["headers"]))
        for d in json.loads(path.read_text())
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.vm.kernels",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("action", choices=("fetch", "list"))
    args = ap.parse_args(argv)
    try:
        kernels = fetch() if args.action == "fetch" else cached()
    except FetchError as exc:
        print(f"kernels: {exc}", file=sys.stderr)
        CACHE.mkdir(parents=True, exist_ok=True)
        (CACHE / "fetch-error").write_text(str(exc))  # the matrix's skip says why
        return 1
    (CACHE / "fetch-error").unlink(missing_ok=True)
    for k in kernels:
        print(f"{k.series:<6} {k.abi:<24} {k.vmlinuz}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
