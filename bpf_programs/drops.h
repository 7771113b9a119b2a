/* drops.h: the records drops.c shares with user space. Mirrored once in
 * lens_ebpf/agent/bpf/layouts.py, checked field by field (names, offsets, sizes) at load. */
#ifndef LENS_DROPS_H
#define LENS_DROPS_H

#include "lens_common.h"

/* One aggregate: packets the kernel dropped, by the address of the end on this node (the
 * destination of a packet it received, the source of one it sent), the policy class of the
 * other end, the protocol and why. */
struct drop_key {
    u8 addr[16];   /* the local end, IPv4 as ::ffff:a.b.c.d */
    u64 location;  /* the kernel code that dropped it, where no reason names it; else 0 */
    u32 reason;    /* enum skb_drop_reason as the running kernel numbers it; 0: none */
    u8 direction;  /* LENS_DIR_INGRESS: received (skb_iif set); LENS_DIR_EGRESS: sent */
    u8 cls;        /* the other end's policy class */
    u8 family;
    u8 l4proto;    /* IPPROTO_* of the IP header (IPv6: its first next header) */
    u8 overflow;   /* 1: the map was full; this is the per-(direction, class) slot */
    u8 pad[7];
};

/* One drop, for trace mode only (records_on): never written otherwise. */
struct drop_event {
    u64 ts_ns;
    u64 location;
    u8 saddr[16];
    u8 daddr[16];
    u32 reason;
    u32 pid;
    u16 sport;
    u16 dport;
    u8 direction;
    u8 cls;
    u8 family;
    u8 l4proto;
    char comm[16];
};

#endif
