/* drops.c: packets the kernel dropped, counted in the kernel by where and why.
 *
 * One tracepoint, skb:kfree_skb (every kernel the agent supports; consume_skb, the
 * normal free, has a tracepoint of its own and is not traced). Its fields differ:
 *   skbaddr, location, protocol     every kernel (4.x+)
 *   reason                          Linux 5.17+ (-DLENS_TP_KFREE_SKB_REASON): enum
 *                                   skb_drop_reason, whose numbering changes from kernel
 *                                   to kernel; Python names each value from the running
 *                                   kernel's BTF (lens_ebpf/agent/drops/reasons.py)
 *   rx_sk                           Linux 6.11+ (not read: the addresses attribute)
 * Where no reason names the drop (5.10, or NOT_SPECIFIED: -DLENS_REASON_NOT_SPECIFIED,
 * the value the running kernel's BTF gives it) the key keeps the location, the return
 * address in the code that dropped it, which Python resolves to its kernel function
 * (/proc/kallsyms). Values the kernel's BTF names as normal frees (SKB_CONSUMED,
 * SKB_NOT_DROPPED_YET: -DLENS_REASON_CONSUMED, -DLENS_REASON_NOT_DROPPED) are passed over.
 *
 * Who it was dropped for (-DLENS_DROP_ADDRESSES, where the running kernel's BTF places
 * sk_buff's head, network_header, transport_header and skb_iif: Linux 5.x and 6.x with
 * BTF): the IP header's addresses; a packet that came in on an interface (skb_iif set)
 * counts for its destination, one this node sent for its source. Python turns that
 * address into a pod through the cluster index. Without BTF the drops are counted with
 * no address.
 *
 * Whose namespace it was dropped in (-DLENS_DROP_NETNS, where the running kernel's BTF
 * places sk_buff's sk and dev, the socket's and the device's struct net and its inode:
 * every kernel of the matrix): the network namespace of the packet's socket where it has
 * one (the sender, or the receiver it was queued for), else of its device (the interface
 * it came in on or was going out of). A pod's namespace names the pod even where the
 * packet's addresses are not in the index, on cgroup v1 and v2 alike (Python maps each
 * namespace to the pod that holds its addresses).
 *
 * Nothing per drop leaves the kernel: each increments one key of the drops map (a storm
 * of a million drops a second is a million increments). Only while a trace asks
 * (records_on) does each drop also go to the ring buffer, filtered by trace_filter.
 */
#define skb_drop_reason lens_skb_drop_reason
/* tracepoint records name enum skb_drop_reason, which older header trees lack: a 4-byte
 * enum of our own either way */
enum lens_skb_drop_reason { LENS_DROP_REASON_ANY = 0x7fffffff };
#include "lens_common.h"
#include "drops.h"

#if !defined(MAX_DROP_KEYS) || !defined(MAX_POLICY_PREFIXES) || !defined(RINGBUF_PAGES)
#error "MAX_DROP_KEYS, MAX_POLICY_PREFIXES and RINGBUF_PAGES come as -D flags"
#endif

#define ETH_P_IP_ 0x0800
#define ETH_P_IPV6_ 0x86DD
#define IPPROTO_TCP_ 6
#define IPPROTO_UDP_ 17

/* Index of the stats array; mirrored in lens_ebpf/agent/drops/drops.py. */
#define ST_RINGBUF_FULL 0
#define ST_MAP_FULL 1
#define ST_EVENTS 2
#define ST_NO_HEADER 3 /* an IP packet whose header was not set or not readable */
#define ST_COUNT 4

BPF_HASH(drops, struct drop_key, u64, MAX_DROP_KEYS);
BPF_LPM_TRIE(policy, struct lens_lpm_key, u8, MAX_POLICY_PREFIXES);
BPF_PERCPU_ARRAY(stats, u64, ST_COUNT);
BPF_RINGBUF_OUTPUT(drop_events, RINGBUF_PAGES);
BPF_ARRAY(layout_drop_event, struct drop_event, 1); /* never written: the record's type */
BPF_ARRAY(trace_filter, struct lens_trace_filter, 1);
BPF_ARRAY(records_on, u32, 1); /* 1 while a trace wants each drop */

static __always_inline void stat_add(u32 idx)
{
    u64 *v = stats.lookup(&idx);
    if (v)
        *v += 1;
}

static __always_inline u8 classify(const u8 *addr)
{
    struct lens_lpm_key k = {.prefixlen = 128};
    __builtin_memcpy(k.addr, addr, 16);
    u8 *c = policy.lookup(&k);
    return c ? *c : LENS_CLASS_EXTERNAL;
}

#ifdef LENS_DROP_ADDRESSES
/* sk_buff's four fields lie within a few dozen bytes: one read of their span, from an
 * 8-aligned offset into an 8-aligned buffer, so each field keeps its natural alignment on
 * the stack (the verifier refuses a misaligned stack load: 6.12's span starts at 148) */
#define LENS_MIN(a, b) ((a) < (b) ? (a) : (b))
#define LENS_MAX(a, b) ((a) > (b) ? (a) : (b))
#define SKB_BLOCK_OFF                                                                          \
    (LENS_MIN(LENS_MIN(LENS_SKB_HEAD_OFF, LENS_SKB_NETWORK_HEADER_OFF),                       \
              LENS_MIN(LENS_SKB_TRANSPORT_HEADER_OFF, LENS_SKB_IIF_OFF)) & ~7)
#define SKB_BLOCK_END                                                                          \
    LENS_MAX(LENS_MAX(LENS_SKB_HEAD_OFF + 8, LENS_SKB_NETWORK_HEADER_OFF + 2),                \
             LENS_MAX(LENS_SKB_TRANSPORT_HEADER_OFF + 2, LENS_SKB_IIF_OFF + 4))
#define SKB_BLOCK_WORDS ((SKB_BLOCK_END - SKB_BLOCK_OFF + 7) / 8)
#define SKB_BLOCK_LEN (SKB_BLOCK_WORDS * 8)
#if SKB_BLOCK_LEN > 256
#error "sk_buff's head, headers and skb_iif span more than 256 bytes on this kernel"
#endif
#define BLOCK(type, off) (*(type *)(blk + ((off) - SKB_BLOCK_OFF)))

struct packet {
    u8 saddr[16];
    u8 daddr[16];
    u16 sport;
    u16 dport;
    u8 family;
    u8 l4proto;
    u8 ingress;
};

/* The packet's addresses, protocol and ports from its headers; 0 when it has none. */
static __always_inline int read_packet(u64 skb, struct packet *p)
{
    u64 words[SKB_BLOCK_WORDS];
    u8 *blk = (u8 *)words;
    if (bpf_probe_read_kernel(words, sizeof(words), (void *)(skb + SKB_BLOCK_OFF)))
        return 0;
    u64 head = BLOCK(u64, LENS_SKB_HEAD_OFF);
    u16 nh = BLOCK(u16, LENS_SKB_NETWORK_HEADER_OFF);
    u16 th = BLOCK(u16, LENS_SKB_TRANSPORT_HEADER_OFF);
    p->ingress = BLOCK(u32, LENS_SKB_IIF_OFF) != 0;
    if (!head || nh == 0xffff)
        return 0;
    u8 ip[40];
    if (bpf_probe_read_kernel(ip, sizeof(ip), (void *)(head + nh)))
        return 0;
    u8 version = ip[0] >> 4;
    if (version == 4) {
        p->family = AF_INET;
        p->l4proto = ip[9];
        lens_map_v4(p->saddr, ip + 12);
        lens_map_v4(p->daddr, ip + 16);
        if (th == 0xffff || th == nh) /* not set yet: past the IPv4 header's own length */
            th = nh + (ip[0] & 0xf) * 4;
    } else if (version == 6) {
        p->family = AF_INET6;
        p->l4proto = ip[6];
        __builtin_memcpy(p->saddr, ip + 8, 16);
        __builtin_memcpy(p->daddr, ip + 24, 16);
        if (th == 0xffff || th == nh)
            th = nh + 40;
    } else {
        return 0;
    }
    if (p->l4proto == IPPROTO_TCP_ || p->l4proto == IPPROTO_UDP_) {
        u16 ports[2] = {};
        bpf_probe_read_kernel(ports, sizeof(ports), (void *)(head + th));
        p->sport = bpf_ntohs(ports[0]);
        p->dport = bpf_ntohs(ports[1]);
    }
    return 1;
}
#endif

#ifdef LENS_DROP_NETNS
/* The network namespace's inode of the packet's socket, else of its device; 0: neither.
 * sk shares its place with ip_defrag_offset and dev with dev_scratch (a fragment being
 * reassembled, a UDP datagram queued to its socket): a read that faults gives 0, and a
 * queued datagram has its socket, which is read first. */
static __always_inline u32 drop_netns(u64 skb)
{
    u64 sk = 0, dev = 0, net = 0;
    u32 inum = 0;
    bpf_probe_read_kernel(&sk, sizeof(sk), (void *)(skb + LENS_SKB_SK_OFF));
    if (sk)
        bpf_probe_read_kernel(&net, sizeof(net), (void *)(sk + LENS_SK_NET_OFF));
    if (!net) {
        bpf_probe_read_kernel(&dev, sizeof(dev), (void *)(skb + LENS_SKB_DEV_OFF));
        if (dev)
            bpf_probe_read_kernel(&net, sizeof(net), (void *)(dev + LENS_DEV_NET_OFF));
    }
    if (net)
        bpf_probe_read_kernel(&inum, sizeof(inum), (void *)(net + LENS_NET_INUM_OFF));
    return inum;
}
#endif

/* Wake the trace reader once per this many records on a CPU; it polls on a timer too. */
#define WAKEUP_EVERY 64

static __always_inline void emit(u64 location, u32 reason, u8 direction, u8 cls, u8 family,
                                 u8 l4proto, const u8 *saddr, const u8 *daddr, u16 sport,
                                 u16 dport)
{
    u32 zero = 0;
    struct lens_trace_filter *f = trace_filter.lookup(&zero);
    u32 pid = bpf_get_current_pid_tgid() >> 32;
    if (f && f->enabled) {
        if (f->pid && pid != f->pid)
            return;
        if (f->port && sport != f->port && dport != f->port)
            return;
    }
    struct drop_event *e = drop_events.ringbuf_reserve(sizeof(struct drop_event));
    if (!e) {
        stat_add(ST_RINGBUF_FULL);
        return;
    }
    e->ts_ns = bpf_ktime_get_ns();
    e->location = location;
    __builtin_memcpy(e->saddr, saddr, 16);
    __builtin_memcpy(e->daddr, daddr, 16);
    e->reason = reason;
    e->pid = pid;
    e->sport = sport;
    e->dport = dport;
    e->direction = direction;
    e->cls = cls;
    e->family = family;
    e->l4proto = l4proto;
    bpf_get_current_comm(&e->comm, sizeof(e->comm));
    u32 idx = ST_EVENTS;
    u64 *n = stats.lookup(&idx);
    u64 seq = n ? ++*n : 0;
    drop_events.ringbuf_submit(e, seq % WAKEUP_EVERY ? BPF_RB_NO_WAKEUP : BPF_RB_FORCE_WAKEUP);
}

TRACEPOINT_PROBE(skb, kfree_skb)
{
    u64 location = (u64)args->location;
    u32 reason = 0;
#ifdef LENS_TP_KFREE_SKB_REASON
    reason = args->reason;
#ifdef LENS_REASON_CONSUMED
    if (reason == LENS_REASON_CONSUMED || reason == LENS_REASON_NOT_DROPPED)
        return 0; /* a normal free, not a drop */
#endif
#ifdef LENS_REASON_NOT_SPECIFIED
    if (reason != LENS_REASON_NOT_SPECIFIED)
        location = 0; /* the reason says where: one key for every place it is given */
#endif
#endif
    struct drop_key k = {};
    u8 saddr[16] = {}, daddr[16] = {};
    u16 sport = 0, dport = 0;
#ifdef LENS_DROP_ADDRESSES
    u16 proto = args->protocol; /* host order: the tracepoint stores ntohs(skb->protocol) */
    LENS_PIN(proto);
    struct packet p = {};
    if (proto == ETH_P_IP_ || proto == ETH_P_IPV6_) {
        if (read_packet((u64)args->skbaddr, &p)) {
            k.family = p.family;
            k.l4proto = p.l4proto;
            k.direction = p.ingress ? LENS_DIR_INGRESS : LENS_DIR_EGRESS;
            __builtin_memcpy(k.addr, p.ingress ? p.daddr : p.saddr, 16);
            k.cls = classify(p.ingress ? p.saddr : p.daddr);
            __builtin_memcpy(saddr, p.saddr, 16);
            __builtin_memcpy(daddr, p.daddr, 16);
            sport = p.sport;
            dport = p.dport;
        } else {
            stat_add(ST_NO_HEADER);
        }
    }
#endif
#ifdef LENS_DROP_NETNS
    k.netns = drop_netns((u64)args->skbaddr);
#endif
    k.location = location;
    k.reason = reason;
    u64 *v = drops.lookup(&k);
    if (!v) {
        u64 zero = 0;
        drops.insert(&k, &zero);
        v = drops.lookup(&k);
        if (!v) {
            stat_add(ST_MAP_FULL);
            struct drop_key o = {};
            o.direction = k.direction;
            o.cls = k.cls;
            o.overflow = 1;
            v = drops.lookup(&o);
        }
    }
    if (v)
        __sync_fetch_and_add(v, 1);
    u32 zero = 0;
    u32 *on = records_on.lookup(&zero);
    if (on && *on)
        emit(location, reason, k.direction, k.cls, k.family, k.l4proto, saddr, daddr, sport,
             dport);
    return 0;
}
