"""The least a socket-tracking lifecycle program costs a connection: the reference the
connection-rate goal is read against (issue 60).

It is attached the way the agent's own program is (BTF-typed `inet_sock_set_state`, no
trace record) and does only what any design that keeps a per-socket entry must: the same
filter as tcp_flows.c's set_state(), an entry of the agent's size inserted at the
opening, looked up at each transition the agent's program handles, deleted at CLOSE. No
flow, class, owner, bytes, RTT or record. No agent process runs beside it.

    python -m bench.floor [SECONDS]   # conngen with and without it, interleaved rounds
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

TEXT = r"""
#include "lens_common.h"
#include "tcp_flows.h"
BPF_HASH(socks, u64, struct sock_info, MAX_SOCKETS);

int tp_btf__inet_sock_set_state(u64 *ctx)
{
    const void *tp = (const void *)bpf_skc_to_tcp_sock((void *)ctx[0]);
    if (!tp)
        return 0;
    u16 family = *(volatile const u16 *)(tp + LENS_SK_FAMILY_OFF);
    if (family != AF_INET && family != AF_INET6)
        return 0;
    u64 sk = (u64)tp;
    int os = (int)ctx[1], ns = (int)ctx[2];
    if (ns == 2 || ns == 3) { /* SYN_SENT, SYN_RECV: the opening */
        struct sock_info fresh = {};
        fresh.start_ns = bpf_ktime_get_ns();
        socks.insert(&sk, &fresh);
        return 0;
    }
    /* ESTABLISHED, CLOSE, leaving SYN_RECV, the application's close */
    if (ns != 1 && ns != 7 && os != 3 && !(os == 1 && ns == 4) && !(os == 8 && ns == 9))
        return 0;
    struct sock_info *si = socks.lookup(&sk);
    if (!si)
        return 0;
    si->keyed = 1;
    if (ns == 7)
        socks.delete(&sk);
    return 0;
}
"""


class Floor:
    """The floor program, loaded and attached until close()."""

    def __init__(self, max_sockets: int = 65536) -> None:
        from bcc import BPF

        from lens_ebpf.agent.bpf import btf as btf_mod
        from lens_ebpf.agent.bpf.loader import attach_btf_tracepoint, program_dir

        kernel_btf = btf_mod.running()
        family = kernel_btf.member("sock.__sk_common.skc_family") if kernel_btf else None
        if family is None:
            raise RuntimeError("no kernel BTF: the floor program reads the socket through it")
        self.bpf = BPF(
            text=TEXT,
            cflags=[
                f"-I{program_dir()}",
                f"-DLENS_SK_FAMILY_OFF={family[0]}",
                f"-DMAX_SOCKETS={max_sockets}",
            ],
        )
        try:
            attach_btf_tracepoint(
                self.bpf,
                "sock:inet_sock_set_state",
                kernel_btf.trace_typedef("inet_sock_set_state"),
            )
        except Exception:
            self.bpf.cleanup()
            raise

    def close(self) -> None:
        self.bpf.cleanup()

    def __enter__(self) -> Floor:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def main() -> None:
    from bench.__main__ import build, conn_load

    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
    tools = build(Path(tempfile.mkdtemp(prefix="lens-floor-")))
    ratios = []
    for i in range(5):
        base = conn_load(tools, f"127.0.1.{10 + i}", seconds)["rate"]
        with Floor():
            got = conn_load(tools, f"127.0.1.{20 + i}", seconds)["rate"]
        ratios.append(got / base)
        print(f"round {i}: untraced {base:.0f}/s, floor {got:.0f}/s, {got / base:.1%}")
    print(f"floor: median {statistics.median(ratios):.1%} of untraced")


if __name__ == "__main__":
    main()
