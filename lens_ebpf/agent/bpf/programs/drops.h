/* drops.h: the records drops.c shares with user space, in the kernel's fixed-width types:
 * the one source of their layout. lens_ebpf/agent/bpf/layouts.py mirrors it, checked
 * against this header by tests/unit/test_layouts.py and field by field (names, offsets,
 * sizes) against BCC's layout at load. */
#ifndef LENS_DROPS_H
#define LENS_DROPS_H

#include <linux/types.h>

/* One aggregate: packets the kernel dropped, by the network namespace they were dropped
 * in and the address of the end on this node (the destination of a packet it received,
 * the source of one it sent), the policy class of the other end, the protocol and why. */
struct drop_key {
    __u8 addr[16];   /* the local end, IPv4 as ::ffff:a.b.c.d */
    __u64 location;  /* the kernel code that dropped it, where no reason names it; else 0 */
    __u32 reason;    /* enum skb_drop_reason as the running kernel numbers it; 0: none */
    __u8 direction;  /* LENS_DIR_INGRESS: received (skb_iif set); LENS_DIR_EGRESS: sent */
    __u8 cls;        /* the other end's policy class */
    __u8 family;
    __u8 l4proto;    /* IPPROTO_* of the IP header (IPv6: its first next header) */
    __u8 overflow;   /* 1: the map was full; this is the per-(direction, class) slot */
    __u8 pad[3];
    __u32 netns;     /* the network namespace (its inode) of the packet's socket, else of
                      * its device; 0: neither known (no -DLENS_DROP_NETNS, or neither) */
};

/* One drop, for trace mode only (records_on): never written otherwise. */
struct drop_event {
    __u64 ts_ns;
    __u64 location;
    __u8 saddr[16];
    __u8 daddr[16];
    __u32 reason;
    __u32 pid;
    __u16 sport;
    __u16 dport;
    __u8 direction;
    __u8 cls;
    __u8 family;
    __u8 l4proto;
    char comm[16];
};

#endif
