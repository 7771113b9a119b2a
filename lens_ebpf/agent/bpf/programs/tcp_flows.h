/* tcp_flows.h: the records tcp_flows.c shares with user space, in the kernel's fixed-width
 * types: the one source of their layout. The compiled event path includes it
 * (lens_ebpf/agent/native/_native.c: struct flow_event); lens_ebpf/agent/bpf/layouts.py
 * mirrors it, checked against this header by tests/unit/test_layouts.py and field by
 * field (names, offsets, sizes) against BCC's layout at load. */
#ifndef LENS_TCP_FLOWS_H
#define LENS_TCP_FLOWS_H

#include <linux/types.h>

#ifndef LENS_RTT_NBOUNDS
#define LENS_RTT_NBOUNDS 27
#endif

struct flow_key {
    __u8 raddr[16];
    __u16 port;      /* remote port for egress, local listening port for ingress */
    __u8 direction;
    __u8 cls;
    __u8 family;
    __u8 overflow;   /* 1: the map was full; this is the per-(direction, class) slot */
    __u8 pad[2];
};

struct flow_val {
    __u64 opened;
    __u64 closed;
    __u64 failed;
    __u64 sent;
    __u64 recv;
    __u64 retrans;
    __u64 resets_sent;
    __u64 resets_recv;
};

struct sock_info {
    __u64 start_ns;
    __u64 sent;
    __u64 recv;
    __u64 cgroup_id;
    __u64 rtt_period; /* the sampling period of its last RTT sample (LENS_RTT_SAMPLED) */
    /* per-message paths: bytes counted while the socket had no key, not yet in its flow */
    __u64 pre_sent;
    __u64 pre_recv;
    struct flow_key key;
    __u8 laddr[16];
    __u32 pid;
    __u32 retrans;
    __u16 lport;
    __u16 rport;
    /* one byte a flag, each written whole: a read-modify-write of shared flag bits from
     * two CPUs at once (5.10 has no atomic OR) could lose one */
    __u8 keyed;     /* its flow key is known */
    __u8 pid_known; /* its owner (pid, cgroup, comm) is known */
    __u8 rst_sent;
    __u8 rst_recv;
    __u8 direction;
    __u8 family;
    char comm[16];
};

struct flow_event {
    __u64 ts_ns;
    __u64 duration_ns;
    __u64 sent;
    __u64 recv;
    __u64 cgroup_id;
    __u8 laddr[16];
    __u8 raddr[16];
    __u32 pid;
    __u32 retrans;
    __u16 lport;
    __u16 rport;
    __u8 family;
    __u8 direction;
    __u8 cls;
    __u8 reason;
    char comm[16];
};

struct rtt_key {
    __u8 raddr[16];
    __u8 direction;
    __u8 cls;
    __u8 family;
    __u8 overflow; /* 1: the map was full; the per-(direction, class) slot */
};

struct rtt_val {
    __u64 count;
    __u64 sum_us;
    __u64 bins[LENS_RTT_NBOUNDS + 1]; /* bins[i]: srtt <= bound[i]; the last: above all */
};

#endif
