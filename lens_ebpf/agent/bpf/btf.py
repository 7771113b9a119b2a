"""The running kernel's own type description (BTF, /sys/kernel/btf/vmlinux): where a
struct member lies, and the prototype a raw tracepoint passes its program.

docs/design.md rule 1 forbids reading kernel structs through a header tree, because the tree
on disk may belong to another kernel. BTF is not a header tree: the running kernel
describes itself, as it does its tracepoint formats, so an offset taken from it is that
kernel's offset. The programs use it where a tracepoint record would cost more than the
one field they need (docs/agent/kernels.md): the exit code of an exiting
task, the family and protocol of a socket a raw tracepoint names. A kernel without BTF,
or whose types differ from what a path expects, takes the path's fallback.

Only what those uses need is read: the type table is walked once, structs, unions and
typedefs are indexed by name, and member lookups follow anonymous members as C does.
"""

from __future__ import annotations

import mmap
import os
import struct
from array import array
from dataclasses import dataclass
from pathlib import Path

VMLINUX = Path("/sys/kernel/btf/vmlinux")
MAGIC = 0xEB9F

# BTF_KIND_* (include/uapi/linux/btf.h)
INT, PTR, ARRAY, STRUCT, UNION, ENUM, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT = range(1, 12)
FUNC, FUNC_PROTO, VAR, DATASEC, FLOAT, DECL_TAG, TYPE_TAG, ENUM64 = range(12, 20)
_MODIFIERS = (TYPEDEF, VOLATILE, CONST, RESTRICT, TYPE_TAG)
# bytes after the 12-byte btf_type, by kind: fixed, and per vlen entry (-1: a kind this
# reader does not know)
_EXTRA = [0] * 32
_PER_ITEM = [-1] * 32
for _k in (PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG):
    _PER_ITEM[_k] = 0
for _k, _n in ((INT, 4), (ARRAY, 12), (VAR, 4), (DECL_TAG, 4)):
    _EXTRA[_k], _PER_ITEM[_k] = _n, 0
for _k, _n in ((STRUCT, 12), (UNION, 12), (ENUM, 8), (FUNC_PROTO, 8), (DATASEC, 12), (ENUM64, 12)):
    _PER_ITEM[_k] = _n


class BtfError(ValueError):
    """The file is not BTF this reader understands (says where it stopped)."""


@dataclass(frozen=True)
class Member:
    name: str
    type_id: int
    bit_offset: int
    bitfield_size: int  # 0: a whole field


@dataclass(frozen=True)
class Type:
    kind: int
    name: str
    size_or_type: int  # size for INT/STRUCT/UNION/ENUM*/FLOAT, else the referenced type
    members: tuple[Member, ...] = ()  # STRUCT/UNION
    params: tuple[int, ...] = ()  # FUNC_PROTO: each parameter's type


class Btf:
    """One BTF blob. Parsing walks the type table once, noting where each type starts and
    indexing named structs, unions and typedefs; a type's members or parameters are read
    only when a lookup reaches it (the kernel's ~130,000 types cost ~0.1 s, not seconds
    under an emulated CPU). It keeps the blob, a 4-byte position per type and an int per
    named struct: ~7 MB, for as long as the caller holds it (the agent, while it resolves
    its specs)."""

    def __init__(self, data: bytes | mmap.mmap) -> None:
        if len(data) < 24:
            raise BtfError("shorter than a BTF header")
        magic, _version, _flags, hdr_len = struct.unpack_from("<HBBI", data)
        if magic != MAGIC:
            raise BtfError(f"magic {magic:#x}, not {MAGIC:#x} (or not little-endian)")
        type_off, type_len, str_off, str_len = struct.unpack_from("<IIII", data, 8)
        base = hdr_len
        self._data = data
        self._str0, self._str_end = base + str_off, base + str_off + str_len
        if self._str_end > len(data) or base + type_off + type_len > len(data):
            raise BtfError("sections run past the end of the file")
        extra, per_item = _EXTRA, _PER_ITEM
        indexed = (STRUCT, UNION, TYPEDEF, ENUM, ENUM64)
        head = struct.Struct("<III").unpack_from
        starts = array("I", [0])  # id 0 is void
        by_name_off: dict[int, int] = {}  # kind << 32 | name offset -> id
        pos, end = base + type_off, base + type_off + type_len
        while pos < end:
            name_off, info, size_or_type = head(data, pos)
            kind = (info >> 24) & 0x1F
            step = per_item[kind]
            if step < 0:
                raise BtfError(f"type {len(starts)}: unknown kind {kind}")
            starts.append(pos)
            # a struct's full definition wins over a forward one of size 0 (an enum's
            # forward declaration has no values: vlen 0)
            if (
                name_off
                and kind in indexed
                and (kind == TYPEDEF or size_or_type)
                and (kind not in (ENUM, ENUM64) or info & 0xFFFF)
            ):
                by_name_off.setdefault(kind << 32 | name_off, len(starts) - 1)
            pos += 12 + extra[kind] + step * (info & 0xFFFF)
        if pos != end:
            raise BtfError("the type section ends inside a type")
        self._starts = starts
        self._by_name_off = by_name_off

    def __len__(self) -> int:
        return len(self._starts)

    def _name(self, off: int) -> str:
        at = self._str0 + off
        if at >= self._str_end:
            return ""
        end = self._data.find(b"\0", at, self._str_end)
        return self._data[at : end if end >= 0 else self._str_end].decode("ascii", "replace")

    def type(self, type_id: int) -> Type | None:
        """Type type_id decoded (None for void or an id out of range)."""
        if not 0 < type_id < len(self._starts):
            return None
        data, pos = self._data, self._starts[type_id]
        name_off, info, size_or_type = struct.unpack_from("<III", data, pos)
        kind, vlen, kflag = (info >> 24) & 0x1F, info & 0xFFFF, info >> 31
        pos += 12
        members: tuple[Member, ...] = ()
        params: tuple[int, ...] = ()
        if kind in (STRUCT, UNION):
            got = []
            for m_name, m_type, m_off in struct.iter_unpack("<III", data[pos : pos + 12 * vlen]):
                bits, size = (m_off & 0xFFFFFF, m_off >> 24) if kflag else (m_off, 0)
                got.append(Member(self._name(m_name), m_type, bits, size))
            members = tuple(got)
        elif kind == FUNC_PROTO:
            params = tuple(t for _n, t in struct.iter_unpack("<II", data[pos : pos + 8 * vlen]))
        return Type(kind, self._name(name_off), size_or_type, members, params)

    def _named(self, kind: int, name: str) -> int | None:
        """The id of the struct, union or typedef called name (BTF keeps each string
        once, so its offset names it)."""
        at = self._data.find(b"\0" + name.encode() + b"\0", self._str0, self._str_end)
        return None if at < 0 else self._by_name_off.get(kind << 32 | (at + 1 - self._str0))

    def struct_id(self, name: str) -> int | None:
        return self._named(STRUCT, name)

    def enum_values(self, name: str) -> dict[int, str] | None:
        """value -> name of each member of enum name, as the running kernel defines it
        (ENUM, or ENUM64 where it needs 64 bits); None when BTF has no such enum."""
        for kind in (ENUM, ENUM64):
            type_id = self._named(kind, name)
            if type_id is None:
                continue
            pos = self._starts[type_id]
            info = struct.unpack_from("<I", self._data, pos + 4)[0]
            vlen, signed = info & 0xFFFF, info >> 31
            out: dict[int, str] = {}
            if kind == ENUM:
                fmt = "<Ii" if signed else "<II"
                for n_off, val in struct.iter_unpack(
                    fmt, self._data[pos + 12 : pos + 12 + 8 * vlen]
                ):
                    out[val] = self._name(n_off)
            else:
                for n_off, lo, hi in struct.iter_unpack(
                    "<III", self._data[pos + 12 : pos + 12 + 12 * vlen]
                ):
                    out[hi << 32 | lo] = self._name(n_off)
            return out
        return None

    def resolve(self, type_id: int) -> int:
        """type_id with typedefs and qualifiers taken off."""
        for _ in range(64):
            t = self.type(type_id)
            if t is None or t.kind not in _MODIFIERS:
                return type_id
            type_id = t.size_or_type
        raise BtfError(f"type {type_id}: a chain of typedefs that does not end")

    def size(self, type_id: int) -> int | None:
        t = self.type(self.resolve(type_id))
        if t is None:
            return None
        if t.kind in (INT, STRUCT, UNION, ENUM, ENUM64, FLOAT):
            return t.size_or_type
        return 8 if t.kind == PTR else None

    def _find(self, type_id: int, member: str) -> tuple[int, int] | None:
        """(bit offset, member type) of member in the struct or union type_id, looking
        into anonymous structs and unions as C does; None if absent or a bitfield."""
        t = self.type(self.resolve(type_id))
        if t is None or t.kind not in (STRUCT, UNION):
            return None
        for m in t.members:
            if m.name == member:
                return None if m.bitfield_size else (m.bit_offset, m.type_id)
            if not m.name:
                inner = self._find(m.type_id, member)
                if inner is not None:
                    return m.bit_offset + inner[0], inner[1]
        return None

    def member(self, path: str) -> tuple[int, int] | None:
        """(byte offset, size) of "struct.member[.member...]", or None when the struct, a
        member, or a whole-byte placement is missing (a bitfield has no byte offset)."""
        struct_name, *names = path.split(".")
        type_id = self.struct_id(struct_name)
        if type_id is None or not names:
            return None
        bits = 0
        for n in names:
            found = self._find(type_id, n)
            if found is None:
                return None
            bits += found[0]
            type_id = found[1]
        size = self.size(type_id)
        if bits % 8 or size is None:
            return None
        return bits // 8, size

    def trace_typedef(self, event: str) -> int | None:
        """The id of the kernel's btf_trace_<event> typedef: what a BTF-typed tracepoint
        program is loaded against (its attach_btf_id)."""
        return self._named(TYPEDEF, f"btf_trace_{event}")

    def raw_tracepoint_args(self, event: str) -> tuple[str, ...] | None:
        """The C types a raw tracepoint's program gets, from the kernel's btf_trace_<event>
        typedef (a pointer to a prototype whose first parameter is the tracepoint's own
        data pointer, left out here): e.g. ("struct sock *", "int", "int")."""
        tid = self.trace_typedef(event)
        if tid is None:
            return None
        ptr = self.type(self.resolve(tid))
        if ptr is None or ptr.kind != PTR:
            return None
        proto = self.type(ptr.size_or_type)
        if proto is None or proto.kind != FUNC_PROTO or not proto.params:
            return None
        return tuple(self.type_name(p) for p in proto.params[1:])

    def type_name(self, type_id: int) -> str:
        """A short C spelling: "int", "struct sock *", "unsigned short" (typedefs kept)."""
        t = self.type(type_id)
        if t is None:
            return "void"
        if t.kind == PTR:
            return self.type_name(t.size_or_type) + " *"
        if t.kind in (CONST, VOLATILE, RESTRICT, TYPE_TAG):
            return self.type_name(t.size_or_type)
        if t.kind == STRUCT:
            return f"struct {t.name}"
        if t.kind == UNION:
            return f"union {t.name}"
        return t.name or "?"


def running() -> Btf | None:
    """The running kernel's BTF, or None where the kernel has none (CONFIG_DEBUG_INFO_BTF)
    or it does not parse. Read anew each call (~0.06 s here) and kept by nobody here: the
    agent needs it only while it resolves its specs, and ~7 MB held for its lifetime
    showed in its RSS."""
    try:
        return Btf(read_outside_heap(VMLINUX))
    except (OSError, ValueError):  # BtfError is a ValueError, as is an empty mmap
        return None


def read_outside_heap(path: Path) -> mmap.mmap:
    """path's bytes in an anonymous mapping rather than a bytes object: glibc serves a
    5 MB bytes object by mmap and, freeing it, raises its mmap threshold for the rest of
    the process, so later large allocations stay on the heap (the agent's RSS at ~40k
    series was 8 MB higher after the parse until this). The mapping goes back whole."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        buf = mmap.mmap(-1, size)
        got = 0
        while got < size:
            n = f.readinto(memoryview(buf)[got:])
            if not n:
                break
            got += n
    if got != size:
        buf.close()
        raise OSError(f"{path}: read {got} of {size} bytes")
    return buf
