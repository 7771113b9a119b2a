"""The compiled event path (lens_ebpf/agent/native/_native.c) as an optional extension:
a wheel or `pip install .` builds it where a compiler and Python's headers are; where
they are not, the install goes on without it and the agent takes the Python path, saying
why (lens_ebpf.agent.native.load). Everything else is in pyproject.toml.

Its flags, include dirs and SOURCE_HASH (the digest load() compares with its sources')
are the native module's own, the ones `python -m lens_ebpf.agent.native` builds with."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from setuptools import Extension, setup

ROOT = Path(__file__).resolve().parent
NATIVE = Path("lens_ebpf", "agent", "native")
PROGRAMS = Path("lens_ebpf", "agent", "bpf", "programs")


def native_module() -> ModuleType:
    """lens_ebpf/agent/native/__init__.py loaded from its file: it imports only the
    standard library, so the build needs none of lens_ebpf's dependencies."""
    spec = importlib.util.spec_from_file_location(
        "_lens_native_build", ROOT / NATIVE / "__init__.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def extension() -> Extension:
    native = native_module()
    dirs = (NATIVE, PROGRAMS)
    return Extension(
        "lens_ebpf.agent.native._native",
        sources=[str(NATIVE / "_native.c")],
        include_dirs=[str(d) for d in dirs],
        define_macros=[("SOURCE_HASH", f'"{native.source_hash([ROOT / d for d in dirs])}"')],
        extra_compile_args=list(native.COMPILE_FLAGS),
        optional=True,
    )


if __name__ == "__main__":  # setuptools' build backend runs this file as __main__
    setup(ext_modules=[extension()])
