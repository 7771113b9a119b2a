"""The vendors' real bindings against stand-in libraries: libnvidia-ml.so.1 (pynvml) and
libamd_smi.so (PyPI's amdsmi), built from tests/fixtures, for in-process tests and for an
agent process (the environment that makes its bindings load them)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

FIX = Path(__file__).parent / "fixtures"


def missing_gcc() -> str | None:
    return None if shutil.which("gcc") else "gcc is needed to build the stand-in GPU libraries"


def build_nvml(lib_dir: Path) -> Path:
    """libnvidia-ml.so.1 in lib_dir; LD_LIBRARY_PATH=lib_dir makes pynvml load it."""
    lib_dir.mkdir(parents=True, exist_ok=True)
    out = lib_dir / "libnvidia-ml.so.1"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-pthread", "-o", str(out), str(FIX / "nvml" / "fake_nvml.c")],
        check=True,
    )
    return out


def amdsmi_symbols() -> list[str] | None:
    """Every libamd_smi.so symbol the installed amdsmi binding resolves at import; None
    where the binding is not installed."""
    spec = importlib.util.find_spec("amdsmi")
    if spec is None or spec.origin is None:
        return None
    wrapper = Path(spec.origin).parent / "amdsmi_wrapper.py"
    return sorted(set(re.findall(r"_libraries\['libamd_smi\.so'\]\.(\w+)", wrapper.read_text())))


def build_amdsmi(root: Path, symbols: list[str]) -> Path:
    """<root>/lib/libamd_smi.so: the calls lens-ebpf makes answer from
    tests/fixtures/amdsmi/fake_amdsmi.c, every other symbol answers NOT_SUPPORTED.
    ROCM_PATH=root (and no ROCM_HOME) makes the binding load it."""
    (root / "lib").mkdir(parents=True, exist_ok=True)
    stubs = root / "stubs.c"
    stubs.write_text(
        "".join(f"__attribute__((weak)) int {name}(void) {{ return 2; }}\n" for name in symbols)
    )
    out = root / "lib" / "libamd_smi.so"
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-o",
            str(out),
            str(FIX / "amdsmi" / "fake_amdsmi.c"),
            str(stubs),
        ],
        check=True,
    )
    return out
