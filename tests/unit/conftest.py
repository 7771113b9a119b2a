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
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out),
                    str(FIX.parent / "nvml" / "fake_nvml.c")], check=True)  # fmt: skip
    import pynvml

    saved = pynvml.nvmlLib
    pynvml.nvmlLib = ctypes.CDLL(str(out))
    pynvml._nvmlGetFunctionPointer_cache.clear()
    yield pynvml
    pynvml.nvmlLib = saved
    pynvml._nvmlGetFunctionPointer_cache.clear()
