"""The compiled event path: ring records (closed flows; exec, exit and OOM kill) to the
bytes every stream sends.

Why compiled: each closed flow cost ~6.5 us of Python between the ring buffer and a
SubscribeBatch client (decoded into a FlowClosed, numbered, encoded through protobuf's
classes, BENCHMARKS.md), where the node's budget leaves ~2.5 us. `_native.c` takes a
batch of ring records and makes, for each, the serialized lens.v1 Event (the bytes the
Python path makes: tests/unit/test_native.py compares them for every field) held in a
small `Packed` object with its record; the Python event is made from the record only when
a consumer asks for one (trace, a Subscribe filter on a field other than the kind).

The records' layouts come from the programs' own headers (bpf/programs/tcp_flows.h,
proc_events.h: `#include`d, never declared again) and the protobuf field numbers from
`pb_fields.h`, named and checked against lens.proto by tests/unit/test_native.py.

Built by `scripts/setup.sh` (so by `make run` and `make test`) with Debian's gcc against
the running Python's headers (python3-dev), next to this file; `python -m
lens_ebpf.agent.native` builds it again. A wheel or `pip install .` builds it too, as
setup.py's optional extension, where a compiler and Python's headers are (the same flags,
include dirs and SOURCE_HASH). Where it is missing, was built from another source, or
does not match the records' layout, the agent keeps the Python path and says why
(`events.encoder: python` chooses that path on purpose).
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib
import logging
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "_native.c"
# the compile's flags, here and in setup.py's Extension (which adds -fPIC and -shared itself)
COMPILE_FLAGS = ("-O2", "-Wall", "-Wextra", "-fvisibility=hidden")
CFLAGS = ("-fPIC", "-shared", *COMPILE_FLAGS)


def include_dirs() -> tuple[Path, ...]:
    """Where _native.c's quoted includes are: beside it (pb_fields.h), and the programs'
    headers (bpf/programs/, as the loader finds them)."""
    from lens_ebpf.agent.bpf.loader import program_dir

    return HERE, program_dir()


def sources(dirs: Sequence[Path] | None = None) -> list[Path]:
    """_native.c and each header it includes with quotes, looked for in dirs (default
    include_dirs(); setup.py names the source tree's): what the module is built from."""
    where_from = tuple(dirs) if dirs is not None else include_dirs()
    found = [SOURCE]
    for name in re.findall(r'(?m)^#include "([^"]+)"', SOURCE.read_text()):
        where = [d / name for d in where_from if (d / name).exists()]
        if not where:
            raise RuntimeError(f"_native.c includes {name}, in none of {where_from}")
        found.append(where[0])
    return found


def source_hash(dirs: Sequence[Path] | None = None) -> str:
    """The sources' digest: a module built from other ones (a header changed) is stale."""
    digest = hashlib.sha256()
    for path in sources(dirs):
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def target() -> Path:
    return HERE / f"_native{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"


def build(cc: str = "gcc") -> Path:
    """Compile _native.c next to it for this Python; the path. Raises RuntimeError with
    the compiler's words when it cannot (no gcc, no Python.h: python3-dev)."""
    include = sysconfig.get_paths()["include"]
    if not Path(include, "Python.h").exists():
        raise RuntimeError(f"no {include}/Python.h: install python3-dev (scripts/setup.sh does)")
    out = target()
    # written beside, then renamed: an agent running now keeps the one it loaded
    fd, tmp = tempfile.mkstemp(prefix="._native", suffix=".so", dir=HERE)
    os.close(fd)
    dirs = [f"-I{d}" for d in include_dirs()]
    cmd = [cc, *CFLAGS, f"-I{include}", *dirs, f'-DSOURCE_HASH="{source_hash()}"']
    cmd += [str(SOURCE), "-o", tmp]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        os.unlink(tmp)
        raise RuntimeError(f"no {cc}: install gcc (scripts/setup.sh does)") from None
    if done.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr.strip()}")
    os.chmod(tmp, 0o755)
    os.replace(tmp, out)
    return out


def layout_differs(got: dict[str, int], mirror: Any) -> str:
    """Why a struct's layout in the module (its size and field offsets) differs from its
    ctypes mirror (bpf/layouts.py, itself checked against the program's BTF); empty if
    it does not."""
    want = {"size": ctypes.sizeof(mirror)} | {
        name: getattr(mirror, name).offset for name, *_ in mirror._fields_
    }
    if got != want:
        diff = sorted(k for k in want if got.get(k) != want[k])
        return f"its {mirror.__name__} differs from layouts.{mirror.__name__} at {', '.join(diff)}"
    return ""


E = TypeVar("E")


def stamped(ev: E, p: Any) -> E:
    """A Packed's Python event (made for this call, so set in place) with the bus's
    numbering and the wire bytes the Packed carries: what the Python path publishes."""
    object.__setattr__(ev, "seq", p.seq)
    object.__setattr__(ev, "ts_unix_nano", p.ts_unix_nano)
    object.__setattr__(ev, "_wire", p._wire)
    return ev


_loaded: tuple[ModuleType | None, str] | None = None


def load() -> tuple[ModuleType | None, str]:
    """The compiled module, or None and why not (once per process); each program's
    records check their layout and name their numbers (tcp.decode.compiled_flows,
    processes.proc_events.compiled_procs)."""
    global _loaded
    if _loaded is None:
        _loaded = _load()
        if _loaded[0] is None:
            log.info(
                "compiled event path unavailable (%s): events take the Python path", _loaded[1]
            )
    return _loaded


def _load() -> tuple[ModuleType | None, str]:
    if not target().exists():
        return None, f"{target().name} not built (scripts/setup.sh or pip install builds it)"
    try:
        mod = importlib.import_module("lens_ebpf.agent.native._native")
    except ImportError as exc:
        return None, f"cannot load {target().name}: {exc}"
    if getattr(mod, "SOURCE_HASH", None) != source_hash():
        why = "was built from other sources (_native.c, its headers): run scripts/setup.sh"
        return None, f"{target().name} {why}"
    from lens_ebpf.agent import events

    events.set_packed(mod.Packed)
    return mod, ""


def main() -> int:
    try:
        path = build(os.environ.get("CC", "gcc"))
    except RuntimeError as exc:
        print(f"native: {exc}", file=sys.stderr)
        return 1
    print(f"native: built {path}")
    return 0
