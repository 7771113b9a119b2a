"""Kubernetes resource quantities ("512Gi", "128", "1500m", "1e3") as whole numbers."""

from __future__ import annotations

from typing import Any


def whole(value: Any) -> int:
    """A quantity as a whole number, rounded down ("100Gi" -> bytes, "1500m" -> 1); 0 for
    none or one that does not parse."""
    from kubernetes.utils import parse_quantity

    try:
        return int(parse_quantity(value)) if value not in (None, "") else 0
    except (ValueError, TypeError, ArithmeticError):
        return 0
