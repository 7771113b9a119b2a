"""Find (or make) a kernel header tree that BCC can compile tracepoint programs against.

Search order (docs/agent/kernels.md, "Kernel headers"): /lib/modules/$(uname -r)/build, then
/sys/kernel/kheaders.tar.xz (BCC unpacks it itself), then a fallback tree such as
Debian's linux-headers-amd64, linked in as build/ and source/. A mismatched tree is
safe because the programs read only tracepoint arguments and helpers (rule 1).
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_FALLBACK_GLOB = "/usr/src/linux-headers-*-amd64"
KHEADERS = Path("/sys/kernel/kheaders.tar.xz")


@dataclass(frozen=True)
class HeaderTree:
    """Which header tree BCC will use, and how it was found."""

    source: str  # "modules", "kheaders", "fallback" or "none"
    path: str
    detail: str

    @property
    def found(self) -> bool:
        return self.source != "none"


def _common_tree(build: Path) -> Path | None:
    """Debian splits headers into -amd64 (build) and -common (source) trees."""
    name = build.name
    if name.endswith("-amd64") or name.endswith("-arm64") or name.endswith("-cloud-amd64"):
        base = name.rsplit("-", 2 if name.endswith("-cloud-amd64") else 1)[0]
        candidate = build.parent / f"{base}-common"
        if candidate.is_dir():
            return candidate
    return None


def _tree_usable(moddir: Path) -> bool:
    """BCC needs include/linux/kconfig.h in build/ or in the split source/ tree."""
    return any(
        (moddir / d / "include" / "linux" / "kconfig.h").exists() for d in ("build", "source")
    )


def find_fallback(pattern: str = DEFAULT_FALLBACK_GLOB) -> Path | None:
    """Newest header tree matching pattern that carries its generated headers."""
    trees = sorted(
        (Path(p) for p in glob.glob(pattern) if Path(p, "include").is_dir()),
        key=lambda p: p.name,
    )
    return trees[-1] if trees else None


def host_tree(host_root: Path, release: str) -> tuple[Path, Path | None] | None:
    """The host's build (and source) tree as seen under host_root, when it has one.

    In a container the host's /lib/modules and /usr/src are mounted under host_root;
    the host's build link points at a host path, so it is re-rooted there.
    """
    moddir = host_root / "lib" / "modules" / release
    found: list[Path | None] = []
    for name in ("build", "source"):
        link = moddir / name
        if not link.is_symlink() and not link.is_dir():
            found.append(None)
            continue
        target = Path(os.readlink(link)) if link.is_symlink() else link
        if target.is_absolute() and link.is_symlink():
            target = host_root / target.relative_to("/")
        elif link.is_symlink():
            target = (moddir / target).resolve()
        found.append(target if target.is_dir() else None)
    build, source = found
    if build is None:
        return None
    usable = any((t / "include/linux/kconfig.h").exists() for t in (build, source) if t)
    return (build, source) if usable else None


def resolve(
    release: str | None = None,
    modules_root: Path = Path("/lib/modules"),
    kheaders: Path = KHEADERS,
    fallback_glob: str = DEFAULT_FALLBACK_GLOB,
    link: bool = False,
    host_root: Path | None = None,
) -> HeaderTree:
    """Say which tree BCC will compile against; with link=True, link one in if needed."""
    release = release or os.uname().release
    moddir = modules_root / release
    build = moddir / "build"
    if build.exists() and _tree_usable(moddir):
        return HeaderTree("modules", str(build.resolve()), f"{build} exists")
    host = host_tree(host_root, release) if host_root else None
    if host is not None:
        if not link:
            return HeaderTree("host", str(host[0]), f"would link {build} -> {host[0]}")
        try:
            moddir.mkdir(parents=True, exist_ok=True)
            _relink(build, host[0])
            if host[1] is not None:
                _relink(moddir / "source", host[1])
        except OSError as exc:
            return HeaderTree("none", str(host[0]), f"cannot link {build} -> {host[0]}: {exc}")
        return HeaderTree("host", str(host[0]), f"linked {build} -> the host's {host[0]}")
    if kheaders.exists():
        return HeaderTree("kheaders", str(kheaders), "BCC unpacks the kernel's own headers")
    fallback = find_fallback(fallback_glob)
    if fallback is None:
        return HeaderTree(
            "none",
            "",
            f"no {build}, no {kheaders}, nothing matches {fallback_glob} "
            "(install linux-headers-amd64)",
        )
    if not link:
        return HeaderTree("fallback", str(fallback), f"would link {build} -> {fallback}")
    try:
        moddir.mkdir(parents=True, exist_ok=True)
        _relink(build, fallback)
        common = _common_tree(fallback)
        if common is not None:
            _relink(moddir / "source", common)
    except OSError as exc:
        return HeaderTree("none", str(fallback), f"cannot link {build} -> {fallback}: {exc}")
    return HeaderTree(
        "fallback",
        str(fallback),
        f"linked {build} -> {fallback} (headers of another kernel; tracepoint programs only)",
    )


def _relink(link_path: Path, target: Path) -> None:
    if link_path.is_symlink():
        link_path.unlink()
    link_path.symlink_to(target)


def main(argv: list[str] | None = None) -> int:
    """Prepare the host for BCC: mount tracefs and link a header tree when needed."""
    from lens_ebpf.agent import tracefs

    parser = argparse.ArgumentParser(prog="python -m lens_ebpf.agent.kernel_headers")
    parser.add_argument("--prepare", action="store_true", help="mount tracefs, link headers")
    parser.add_argument("--fallback-glob", default=DEFAULT_FALLBACK_GLOB)
    args = parser.parse_args(argv)
    if args.prepare:
        mounted = tracefs.ensure_mounted()
        print(f"tracefs: {mounted or 'not available'}")
    tree = resolve(fallback_glob=args.fallback_glob, link=args.prepare)
    print(f"kernel headers: {tree.source} {tree.path} ({tree.detail})")
    return 0 if tree.found else 1


if __name__ == "__main__":
    sys.exit(main())


def for_config(k: Any) -> HeaderTree:
    """resolve() with the agent's kernel.* settings; logs which tree it found."""
    tree = resolve(
        fallback_glob=k.headers_fallback_glob,
        link=k.link_headers,
        host_root=Path(k.host_root) if k.host_root else None,
    )
    log.info("kernel headers: %s %s (%s)", tree.source, tree.path, tree.detail)
    return tree
