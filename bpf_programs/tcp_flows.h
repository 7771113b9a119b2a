/* tcp_flows.h: the records tcp_flows.c shares with user space. Mirrored once in
 * lens_ebpf/agent/bpf/layouts.py, checked field by field (names, offsets, sizes) at load. */
#ifndef LENS_TCP_FLOWS_H
#define LENS_TCP_FLOWS_H

#include "lens_common.h"

#ifndef LENS_RTT_NBOUNDS
#define LENS_RTT_NBOUNDS 27
#endif

struct flow_key {
    u8 raddr[16];
    u16 port;      /* remote port for egress, local listening port for ingress */
    u8 direction;
    u8 cls;
    u8 family;
    u8 overflow;   /* 1: the map was full; this is the per-(direction, class) slot */
    u8 pad[2];
};

struct flow_val {
    u64 opened;
    u64 closed;
    u64 failed;
    u64 sent;
    u64 recv;
    u64 retrans;
    u64 resets_sent;
    u64 resets_recv;
};

struct sock_info {
    u64 start_ns;
    u64 sent;
    u64 recv;
    u64 cgroup_id;
    u64 rtt_period; /* the sampling period of its last RTT sample (LENS_RTT_SAMPLED) */
    /* per-message paths: bytes counted while the socket had no key, not yet in its flow */
    u64 pre_sent;
    u64 pre_recv;
    struct flow_key key;
    u8 laddr[16];
    u32 pid;
    u32 retrans;
    u16 lport;
    u16 rport;
    /* one byte a flag, each written whole: a read-modify-write of shared flag bits from
     * two CPUs at once (5.10 has no atomic OR) could lose one */
    u8 keyed;     /* its flow key is known */
    u8 pid_known; /* its owner (pid, cgroup, comm) is known */
    u8 rst_sent;
    u8 rst_recv;
    u8 direction;
    u8 family;
    char comm[16];
};

struct flow_event {
    u64 ts_ns;
    u64 duration_ns;
    u64 sent;
    u64 recv;
    u64 cgroup_id;
    u8 laddr[16];
    u8 raddr[16];
    u32 pid;
    u32 retrans;
    u16 lport;
    u16 rport;
    u8 family;
    u8 direction;
    u8 cls;
    u8 reason;
    char comm[16];
};

struct rtt_key {
    u8 raddr[16];
    u8 direction;
    u8 cls;
    u8 family;
    u8 overflow; /* 1: the map was full; the per-(direction, class) slot */
};

struct rtt_val {
    u64 count;
    u64 sum_us;
    u64 bins[LENS_RTT_NBOUNDS + 1]; /* bins[i]: srtt <= bound[i]; the last: above all */
};

#endif
