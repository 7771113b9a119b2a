"""Golden exposition files under tests/golden/, compared byte for byte.

Regenerate with: LENS_UPDATE_GOLDEN=1 make test   (then review the diff)
"""

from __future__ import annotations

import os
from pathlib import Path

GOLDEN = Path(__file__).parent / "golden"


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("LENS_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"{path} missing: run with LENS_UPDATE_GOLDEN=1 to create it"
    want = path.read_text()
    assert text == want, f"exposition differs from {path}; LENS_UPDATE_GOLDEN=1 regenerates it"
