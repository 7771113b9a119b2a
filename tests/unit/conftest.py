"""Fixtures shared by the unit tests."""

import ctypes
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gpulab import amdsmi_symbols, build_amdsmi, build_nvml, missing_gcc

FIX = Path(__file__).parent.parent / "fixtures" / "gpu"


@pytest.fixture(scope="session")
def fake_nvml(tmp_path_factory) -> Iterator[object]:
    if missing_gcc():
        pytest.skip(missing_gcc())
    out = build_nvml(tmp_path_factory.mktemp("nvml"))
    import pynvml

    saved = pynvml.nvmlLib
    pynvml.nvmlLib = ctypes.CDLL(str(out))
    pynvml._nvmlGetFunctionPointer_cache.clear()
    yield pynvml
    pynvml.nvmlLib = saved
    pynvml._nvmlGetFunctionPointer_cache.clear()


@pytest.fixture(scope="module")
def fake_amdsmi(tmp_path_factory) -> Iterator[object]:
    """The real amdsmi binding loaded against a stand-in libamd_smi.so: the calls
    lens-ebpf makes answer from tests/fixtures/amdsmi/fake_amdsmi.c, every other symbol
    the binding resolves answers AMDSMI_STATUS_NOT_SUPPORTED. The module is unloaded
    afterwards, so no other test sees these GPUs."""
    import os
    import sys

    if missing_gcc():
        pytest.skip(missing_gcc())
    symbols = amdsmi_symbols()
    if symbols is None:
        pytest.skip("the amdsmi binding (PyPI amdsmi) is not installed")
    root = tmp_path_factory.mktemp("rocm")
    build_amdsmi(root, symbols)
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


@pytest.fixture
def tracefs_readable() -> None:
    """For a test that starts the agent or plans a program on the running kernel: both look
    at tracefs, which only root may read; as another user the test skips and says so."""
    from lens_ebpf.agent import tracefs

    try:
        tracefs.events_dir()
    except PermissionError as e:
        pytest.skip(f"reads tracefs ({e.filename}), which only root may (make test runs it)")
