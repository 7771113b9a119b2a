/* What every lens-ebpf program shares: the direction and class numbers, the policy trie's
 * key and the trace filter (records Python fills: mirrored in lens_ebpf/agent/bpf/layouts.py,
 * checked against this header by tests/unit/test_layouts.py and against BCC's layout at
 * load), and helpers for BPF code only. A program's own records are in its header
 * (tcp_flows.h, proc_events.h, drops.h); the compiled event path includes the first two. */
#ifndef LENS_COMMON_H
#define LENS_COMMON_H

#include <linux/types.h>

#define LENS_DIR_EGRESS 0
#define LENS_DIR_INGRESS 1

/* Remote classes; a lower id wins when several policy prefixes match
 * (docs/design.md, Classification). 0 is "no match". */
#define LENS_CLASS_EXTERNAL 0
#define LENS_CLASS_K8S_POD 1
#define LENS_CLASS_K8S_SVC 2
#define LENS_CLASS_DNS 3
#define LENS_CLASS_DOCKER 4
#define LENS_CLASS_LOCALHOST 5
#define LENS_CLASS_INTERNAL 6

/* Runtime filter for one-by-one events (trace mode), filled by Python; counters and
 * histograms are never filtered. A zero field matches everything. */
struct lens_trace_filter {
    __u32 pid;  /* the process (or, for process events, its parent) */
    __u16 port; /* local or remote port */
    __u16 enabled;
};

#ifndef AF_INET
#define AF_INET 2
#endif
#ifndef AF_INET6
#define AF_INET6 10
#endif
#define LENS_IPPROTO_TCP 6

/* Pin a value read from the tracepoint context in a register, so the compiler cannot
 * turn a later choice between two fields into a load through an offset context
 * pointer, which the verifier refuses. */
#define LENS_PIN(v) asm volatile("" : "+r"(v))

/* Key of the policy LPM trie: IPv4 as ::ffff:a.b.c.d, prefix length + 96. */
struct lens_lpm_key {
    __u32 prefixlen;
    __u8 addr[16];
};

static __always_inline void lens_map_v4(u8 *dst, const u8 *v4)
{
    __builtin_memset(dst, 0, 10);
    dst[10] = 0xff;
    dst[11] = 0xff;
    dst[12] = v4[0];
    dst[13] = v4[1];
    dst[14] = v4[2];
    dst[15] = v4[3];
}

#endif
