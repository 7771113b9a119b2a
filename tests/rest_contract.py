"""A consumer of the node exporter's REST routes, written from its documented examples
(Primus-Lens node-exporter README, "API Reference"): strict about required keys and their
types, lenient about keys it does not know, as a Go client decoding into structs is.

decode() returns the documented part of a value, so a test can compare it with what the
node exporter would report and list what lens-ebpf adds beside it.
"""

from __future__ import annotations

from typing import Any

# the documented shapes: a dict is an object with those keys, [x] a list of x,
# {str: x} (key type str) a map, a type a leaf
GPU = {
    "gpu": int,
    "asic": {"market_name": str, "device_id": str, "asic_serial": str},
    "bus": {"bdf": str},
    "dri_device": {"card": str, "render": str, "pci_addr": str},
}
CARD = {"gpu": int, "gpu_use_percent": float, "memory_use_percent": float}
DRI = {"card": str, "render": str, "pci_addr": str, "card_id": int}
RDMA = {
    "if_index": int,
    "if_name": str,
    "node_guid": str,
    "sys_image_guid": str,
    "port_guid": str,
    "link_layer": str,
}
POD_GPU = {
    "name": str,
    "id": int,
    "path": str,
    "kind": str,
    "uuid": str,
    "serial": str,
    "slot": str,
}
POD_IB = {"name": str, "id": int, "path": str, "kind": str, "uuid": str}
POD = {
    "id": str,
    "pod_name": str,
    "pod_namespace": str,
    "pod_uuid": str,
    "devices": {"gpu": [POD_GPU], "infiniband": [POD_IB]},
}
# route -> (shape of data, wrapped in {code, data, message})
ROUTES: dict[str, tuple[Any, bool]] = {
    "/gpus": ([GPU], True),
    "/gpuDriverVersion": (str, True),
    "/cardMetrics": ([CARD], True),
    "/driMapping": ({str: DRI}, True),
    "/rdma": ([RDMA], True),
    "/pods": ([POD], False),
}


class ContractError(Exception):
    pass


def decode(value: Any, shape: Any, where: str = "$") -> Any:
    if isinstance(shape, list):
        if not isinstance(value, list):
            raise ContractError(f"{where}: want a list, got {type(value).__name__}")
        return [decode(v, shape[0], f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(shape, dict) and set(shape) == {str}:
        if not isinstance(value, dict):
            raise ContractError(f"{where}: want a map, got {type(value).__name__}")
        return {k: decode(v, shape[str], f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            raise ContractError(f"{where}: want an object, got {type(value).__name__}")
        missing = [k for k in shape if k not in value]
        if missing:
            raise ContractError(f"{where}: missing {', '.join(missing)}")
        return {k: decode(value[k], t, f"{where}.{k}") for k, t in shape.items()}
    if shape is float:  # a JSON number; Go decodes an int into a float64 too
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif shape is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, shape)
    if not ok:
        raise ContractError(f"{where}: want {shape.__name__}, got {value!r}")
    return value


def route(path: str, body: Any) -> Any:
    """A route's body as the consumer reads it: the documented part of its data."""
    shape, wrapped = ROUTES[path]
    if wrapped:
        envelope = decode(body, {"code": int, "message": str}, path)
        if envelope["code"] != 0 or "data" not in body:
            raise ContractError(f"{path}: code {envelope['code']}")
        body = body["data"]
    return decode(body, shape, path)


def extras(value: Any, shape: Any) -> set[str]:
    """Keys lens-ebpf adds beside the documented ones, as dotted paths (lists as [])."""
    out: set[str] = set()
    if isinstance(shape, list) and isinstance(value, list):
        for v in value:
            out |= {f"[]{k}" for k in extras(v, shape[0])}
    elif isinstance(shape, dict) and set(shape) == {str} and isinstance(value, dict):
        for v in value.values():
            out |= {f"{{}}{k}" for k in extras(v, shape[str])}
    elif isinstance(shape, dict) and isinstance(value, dict):
        for k, v in value.items():
            if k not in shape:
                out.add(f".{k}")
            else:
                out |= {f".{k}{e}" for e in extras(v, shape[k])}
    return out
