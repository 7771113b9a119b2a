"""agent/memory.py's choice of what to let go, from smaps text shaped like the kernel's."""

from __future__ import annotations

from lens_ebpf.agent.memory import clean_compiler_mappings


def test_only_mappings_without_pages_of_their_own_are_let_go() -> None:
    smaps = """\
7f0000000000-7f0000400000 r-xp 00000000 08:01 42 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
Size:               4096 kB
Rss:                2048 kB
Private_Dirty:         0 kB
Anonymous:             0 kB
7f0000400000-7f0000500000 r--p 00400000 08:01 42 /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
Size:               1024 kB
Rss:                1024 kB
Private_Dirty:       512 kB
Anonymous:           512 kB
7f0000600000-7f0000700000 r-xp 00000000 08:01 43 /usr/lib/llvm-14/lib/libclang-cpp.so.14
Rss:                 100 kB
Private_Dirty:         0 kB
Anonymous:             0 kB
7f0000800000-7f0000900000 r-xp 00000000 08:01 44 /usr/lib/x86_64-linux-gnu/libc.so.6
Rss:                 900 kB
Private_Dirty:         0 kB
Anonymous:             0 kB
7f0000a00000-7f0000b00000 rw-p 00000000 00:00 0
Rss:                 900 kB
Anonymous:           900 kB
"""
    assert clean_compiler_mappings(smaps) == [
        (0x7F0000000000, 0x7F0000400000, 2048 * 1024),  # LLVM's text: clean
        (0x7F0000600000, 0x7F0000700000, 100 * 1024),  # clang's
    ]  # relocated data (its own pages), libc and anonymous memory stay
