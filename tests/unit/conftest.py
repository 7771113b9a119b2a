"""Fixtures shared by the unit tests."""

import ctypes
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

FIX = Path(__file__).parent.parent / "fixtures" / "gpu"


@pytest.fixture(scope="session")
def fake_nvml(tmp_path_factory) -> Iterator[object]:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the stand-in libnvidia-ml.so.1")
    out = tmp_path_factory.mktemp("nvml") / "libnvidia-ml.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-pthread", "-o", str(out),
                    str(FIX.parent / "nvml" / "fake_nvml.c")], check=True)  # fmt: skip
    import pynvml

    saved = pynvml.nvmlLib
    pynvml.nvmlLib = ctypes.CDLL(str(out))
    pynvml._nvmlGetFunctionPointer_cache.clear()
    yield pynvml
    pynvml.nvmlLib = saved
    pynvml._nvmlGetFunctionPointer_cache.clear()


def _binding_symbols() -> list[str]:
    """Every libamd_smi.so symbol the installed amdsmi binding resolves at import."""
    import importlib.util
    import re

    spec = importlib.util.find_spec("amdsmi")
    if spec is None or spec.origin is None:
        pytest.skip("the amdsmi binding (PyPI amdsmi) is not installed")
    wrapper = Path(spec.origin).parent / "amdsmi_wrapper.py"
    names = re.findall(r"_libraries\['libamd_smi\.so'\]\.(\w+)", wrapper.read_text())
    return sorted(set(names))


@pytest.fixture(scope="module")
def fake_amdsmi(tmp_path_factory) -> Iterator[object]:
    """The real amdsmi binding loaded against a stand-in libamd_smi.so: the calls
    lens-ebpf makes answer from tests/fixtures/amdsmi/fake_amdsmi.c, every other symbol
    the binding resolves answers AMDSMI_STATUS_NOT_SUPPORTED. The module is unloaded
    afterwards, so no other test sees these GPUs."""
    import os
    import sys

    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the stand-in libamd_smi.so")
    root = tmp_path_factory.mktemp("rocm")
    (root / "lib").mkdir()
    stubs = root / "stubs.c"
    stubs.write_text("".join(f"__attribute__((weak)) int {name}(void) {{ return 2; }}\n"
                             for name in _binding_symbols()))  # fmt: skip
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(root / "lib" / "libamd_smi.so"),
                    str(FIX.parent / "amdsmi" / "fake_amdsmi.c"), str(stubs)],
                   check=True)  # fmt: skip
    saved = {k: os.environ.get(k) for k in ("ROCM_PATH", "ROCM_HOME")}
    os.environ.pop("ROCM_HOME", None)
    os.environ["ROCM_PATH"] = str(root)
    for name in [m for m in sys.modules if m == "amdsmi" or m.startswith("amdsmi.")]:
        del sys.modules[name]
    import amdsmi

    amdsmi.amdsmi_init()
    yield amdsmi
    for name in [m for m in sys.modules if m == "amdsmi" or m.startswith("amdsmi.")]:
        del sys.modules[name]
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
