"""bpf/btf.py against the running kernel's own BTF, with pahole (Debian's dwarves) reading
the same file as the reference; and what it says of a file that is not BTF."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from lens_ebpf.agent.bpf import btf

HOST = btf.running()
needs_btf = pytest.mark.skipif(HOST is None, reason="this kernel has no /sys/kernel/btf/vmlinux")
# a whole-byte member as pahole prints it: "type name[N];  /* offset size */"
PAHOLE_MEMBER = re.compile(r"\s\**(\w+)(?:\[\d+\])*;\s+/\*\s+(\d+)\s+(\d+)\s+\*/$")


def pahole_members(struct: str) -> dict[str, tuple[int, int]]:
    """name -> (byte offset, size) of each whole-byte member pahole prints for struct,
    anonymous members expanded (their offsets are the struct's); names seen twice left out."""
    out = subprocess.run(
        ["pahole", "-C", struct, str(btf.VMLINUX)], capture_output=True, text=True, check=True
    ).stdout
    seen: dict[str, list[tuple[int, int]]] = {}
    for line in out.splitlines():
        m = PAHOLE_MEMBER.search(line)
        if m:
            seen.setdefault(m[1], []).append((int(m[2]), int(m[3])))
    return {name: got[0] for name, got in seen.items() if len(got) == 1}


@needs_btf
@pytest.mark.skipif(shutil.which("pahole") is None, reason="pahole (dwarves) not installed")
@pytest.mark.parametrize("struct", ["sock_common", "sock", "task_struct"])
def test_member_offsets_agree_with_pahole(struct: str) -> None:
    assert HOST is not None
    ref = pahole_members(struct)
    compared = 0
    for name, want in ref.items():
        got = HOST.member(f"{struct}.{name}")
        if got is None:
            continue  # inside a named inline struct: a path of its own
        assert got == want, f"{struct}.{name}"
        compared += 1
    assert compared >= 20, (struct, compared)


@needs_btf
def test_what_the_programs_read() -> None:
    assert HOST is not None
    # nested through a named member, through anonymous unions, and the tracepoints' prototypes
    assert HOST.member("sock.__sk_common.skc_family") == HOST.member("sock_common.skc_family")
    assert HOST.member("sock.__sk_common.skc_family") == (16, 2)  # first after the addresses
    assert HOST.member("task_struct.exit_code")[1] == 4  # type: ignore[index]
    assert HOST.raw_tracepoint_args("sock_send_length") == ("struct sock *", "int", "int")
    assert HOST.raw_tracepoint_args("no_such_event") is None
    # a bitfield has no byte offset; a missing struct or member is None
    assert HOST.member("sock_common.skc_reuse") is None
    assert HOST.member("sock.no_such_member") is None
    assert HOST.member("no_such_struct.x") is None


def test_a_file_that_is_not_btf_is_refused_saying_why() -> None:
    with pytest.raises(btf.BtfError, match="shorter than a BTF header"):
        btf.Btf(b"\x9f\xeb")
    with pytest.raises(btf.BtfError, match="magic 0x457f, not 0xeb9f"):
        btf.Btf(b"\x7fELF" + bytes(40))
    header = (0xEB9F).to_bytes(2, "little") + bytes([1, 0]) + (24).to_bytes(4, "little")
    # a type section that claims more bytes than the file has
    sections = b"".join(n.to_bytes(4, "little") for n in (0, 4096, 0, 0))
    with pytest.raises(btf.BtfError, match="past the end"):
        btf.Btf(header + sections)
    # one INT type cut short: 12 of its 16 bytes
    int_type = (
        (0).to_bytes(4, "little") + (1 << 24).to_bytes(4, "little") + (4).to_bytes(4, "little")
    )
    sections = b"".join(n.to_bytes(4, "little") for n in (0, 12, 12, 1))
    with pytest.raises(btf.BtfError, match="ends inside a type"):
        btf.Btf(header + sections + int_type + b"\0")
