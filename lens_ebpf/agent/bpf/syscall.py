"""The few bpf(2) commands lens-ebpf issues itself (BCC does the rest)."""

from __future__ import annotations

import ctypes
import os
import platform

SYS_BPF = {"x86_64": 321, "aarch64": 280}
BPF_MAP_CREATE = 0
BPF_PROG_LOAD = 5
BPF_RAW_TRACEPOINT_OPEN = 17
BPF_PROG_TYPE_TRACING = 26
BPF_TRACE_RAW_TP = 23  # expected_attach_type of a BTF-typed tracepoint (tp_btf)
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_ENABLE_STATS = 32  # Linux 5.8+
BPF_STATS_RUN_TIME = 0
BPF_MAP_TYPE_RINGBUF = 27
# struct bpf_prog_info: run_time_ns and run_cnt are the u64s at bytes 192 and 200
# (Linux 5.1+, counted while kernel.bpf_stats_enabled=1), recursion_misses at 208 (5.12+)
PROG_INFO_SIZE = 256
RUN_TIME_NS_OFFSET = 192
RUN_CNT_OFFSET = 200
RECURSION_MISSES_OFFSET = 208

_libc = ctypes.CDLL(None, use_errno=True)


def bpf(cmd: int, attr: ctypes.Array[ctypes.c_uint32]) -> int:
    """Issue bpf(cmd, attr); raise OSError with the kernel's reason on failure."""
    nr = SYS_BPF.get(platform.machine())
    if nr is None:
        raise OSError(f"bpf() syscall number unknown on {platform.machine()}")
    rc = int(_libc.syscall(nr, cmd, ctypes.byref(attr), ctypes.sizeof(attr)))
    if rc < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return rc


def ringbuf_supported() -> tuple[bool, str]:
    """Create (and close) a BPF ring buffer map."""
    attr = (ctypes.c_uint32 * 32)()
    attr[0], attr[3] = BPF_MAP_TYPE_RINGBUF, 4096
    try:
        fd = bpf(BPF_MAP_CREATE, attr)
    except OSError as exc:
        return False, str(exc)
    os.close(fd)
    return True, "BPF_MAP_TYPE_RINGBUF created"


def _u64(attr: ctypes.Array[ctypes.c_uint32], at: int, value: int) -> None:
    attr[at], attr[at + 1] = value & 0xFFFFFFFF, value >> 32


def _prog_info_u64(prog_fd: int, offset: int) -> int | None:
    """The u64 at offset of the program's bpf_prog_info; None when the kernel's info
    is shorter (an older kernel) or the call fails."""
    info = (ctypes.c_uint8 * PROG_INFO_SIZE)()
    attr = (ctypes.c_uint32 * 4)()
    attr[0], attr[1] = prog_fd, PROG_INFO_SIZE
    _u64(attr, 2, ctypes.addressof(info))
    try:
        bpf(BPF_OBJ_GET_INFO_BY_FD, attr)
    except OSError:
        return None
    if attr[1] < offset + 8:
        return None
    return int.from_bytes(bytes(info[offset : offset + 8]), "little")


def recursion_misses(prog_fd: int) -> int | None:
    """How often the kernel skipped this program because a BPF program was already
    running on that CPU; None when the kernel does not report it."""
    return _prog_info_u64(prog_fd, RECURSION_MISSES_OFFSET)


def run_stats(prog_fd: int) -> tuple[int, int] | None:
    """(nanoseconds spent, runs) of a program while kernel.bpf_stats_enabled is 1."""
    ns = _prog_info_u64(prog_fd, RUN_TIME_NS_OFFSET)
    cnt = _prog_info_u64(prog_fd, RUN_CNT_OFFSET)
    return None if ns is None or cnt is None else (ns, cnt)


def enable_run_stats() -> int:
    """Turn on run-time statistics for every BPF program for as long as the returned fd
    stays open (BPF_ENABLE_STATS, Linux 5.8+), like kernel.bpf_stats_enabled=1 without
    changing the sysctl; OSError when the kernel cannot."""
    attr = (ctypes.c_uint32 * 2)()
    attr[0] = BPF_STATS_RUN_TIME
    return bpf(BPF_ENABLE_STATS, attr)


def load_btf_tracepoint(insns: bytes, license: bytes, btf_id: int, name: str) -> int:
    """Load instructions (BCC compiled them, its map fds in place) as a BTF-typed
    tracepoint program (BPF_PROG_TYPE_TRACING, BPF_TRACE_RAW_TP) against the kernel type
    btf_id (its btf_trace_<event> typedef); the program's fd. OSError with the verifier's
    last lines when the kernel refuses it."""
    code = ctypes.create_string_buffer(insns, len(insns))
    lic = ctypes.create_string_buffer(license)
    log_buf = ctypes.create_string_buffer(1 << 20)
    raw_name = name.encode()[:15]

    def load(log_level: int) -> int:
        # union bpf_attr's BPF_PROG_LOAD members, by byte: prog_type 0, insn_cnt 4,
        # insns 8, license 16, log_level 24, log_size 28, log_buf 32, prog_name 48,
        # expected_attach_type 68, attach_btf_id 108
        attr = (ctypes.c_uint32 * 30)()
        attr[0], attr[1] = BPF_PROG_TYPE_TRACING, len(insns) // 8
        _u64(attr, 2, ctypes.addressof(code))
        _u64(attr, 4, ctypes.addressof(lic))
        if log_level:
            attr[6], attr[7] = log_level, len(log_buf)
            _u64(attr, 8, ctypes.addressof(log_buf))
        ctypes.memmove(ctypes.addressof(attr) + 48, raw_name, len(raw_name))
        attr[17], attr[27] = BPF_TRACE_RAW_TP, btf_id
        return bpf(BPF_PROG_LOAD, attr)

    try:
        return load(0)
    except OSError as exc:
        first = exc  # the kernel's own errno (a full log would make it ENOSPC)
    try:
        return load(1)  # again, for the verifier's words
    except OSError:
        text = log_buf.value.decode(errors="replace")
    # the refused instruction and the verifier's reason, not its statistics
    said = [
        ln for ln in text.strip().splitlines() if not ln.startswith(("processed ", "verification "))
    ]
    tail = " / ".join(said[-2:])
    if len(text) >= len(log_buf) - 1:
        tail = f"{tail} (the verifier's log was cut at {len(log_buf)} bytes)"
    raise OSError(first.errno, f"{first.strerror}: {tail}") from None


def attach_btf_tracepoint(prog_fd: int) -> int:
    """Attach a loaded BTF-typed tracepoint program to its tracepoint; the link's fd (the
    program runs until it is closed)."""
    attr = (ctypes.c_uint32 * 4)()
    attr[2] = prog_fd  # name 0: the tracepoint the program was loaded against
    return bpf(BPF_RAW_TRACEPOINT_OPEN, attr)
