/* tcp_flows.c: TCP connection lifecycle, bytes each way, retransmits, resets and RTT.
 *
 * Arguments, return values, tracepoint fields and helpers only, never kernel structs
 * (docs/design.md rule 1). Each need has its switch, set by the program's spec
 * (lens_ebpf/agent/tcp/tcp_flows.py SPEC) from what the running kernel describes:
 *   sock:inet_sock_set_state   lifecycle, addresses, ports, one of:
 *     -DLENS_LIFECYCLE_BTF     attached BTF-typed (tp_btf, Linux 5.9+ with BTF): the
 *                              kernel passes (struct sock *, oldstate, newstate) and builds
 *                              no trace record; addresses, ports and counters are plain
 *                              loads from the socket the verifier checks against the
 *                              kernel's BTF (-DLENS_INET_*_OFF, -DLENS_SK_*_OFF). The kernel
 *                              skips a run only while this program is already running on
 *                              the CPU, not whenever another tracing program is (kernels
 *                              without that check run it nested: it keeps no per-CPU
 *                              scratch that a nested run could overwrite)
 *     (neither)                the classic tracepoint and its record (Linux 4.16+)
 *   bytes an application sent and received, one of:
 *     -DLENS_BYTES_RAW         the same two tracepoints attached raw (Linux 6.3+ with BTF):
 *                              their arguments (struct sock *, int ret, int flags) as the
 *                              kernel passes them, checked against its BTF, no record
 *                              built (half the cost per message); an untracked socket's
 *                              family and protocol read where the running kernel's BTF
 *                              places them (-DLENS_SK_FAMILY_OFF, -DLENS_SK_PROTOCOL_OFF)
 *     -DLENS_BYTES_TRACEPOINT  sock:sock_send_length, sock:sock_recv_length (Linux 6.3+)
 *     -DLENS_BYTES_COUNTERS    no program per message: the socket's own counters, read
 *                              where the running kernel's BTF places them (-DLENS_TCP_*_OFF,
 *                              -DLENS_SK_*_OFF), folded into the flow at the socket's
 *                              close transitions and, for open sockets, by the TCP socket
 *                              iterator (bpf_iter__tcp) that Python runs every read cycle
 *                              (Linux 5.15+: the iterator holds each socket's lock, as
 *                              every state change does, so two folds never interleave)
 *     -DLENS_BYTES_KPROBE      tcp_sendmsg() and tcp_recvmsg() entry (socket) and return
 *                              (bytes sent, bytes copied to the reader);
 *                              inet_recvmsg()/inet6_recvmsg() flags (MSG_PEEK reads
 *                              nothing out)
 *   -DLENS_RETRANS   tcp:tcp_retransmit_skb  retransmitted segments  (Linux 4.15+;
 *                    its err field, -DLENS_TP_RETRANSMIT_ERR: 6.18 has it, 6.12 not)
 *   -DLENS_RESETS    tcp:tcp_send_reset, tcp:tcp_receive_reset       (Linux 4.15+)
 *   the smoothed RTT, one of:
 *     -DLENS_RTT_SAMPLED  read from the socket where the running kernel's BTF places
 *                         tcp_sock.srtt_us (-DLENS_TCP_SRTT_OFF), by whichever bytes
 *                         path runs, once per socket per sampling period in which it
 *                         moves bytes (rtt_period): no program per received segment
 *     -DLENS_RTT       tcp:tcp_probe  per received segment (Linux 4.16+); the socket
 *                      comes from its skaddr field (-DLENS_TP_TCP_PROBE_SKADDR: 6.12
 *                      has it, 6.1 not), else from its 4-tuple, indexed when a socket is keyed
 *
 * Per socket (keyed by the socket's address, used only as an opaque key) the program
 * keeps who opened it and how many bytes went each way (on the counters path: how many
 * it has folded into the flow so far). Per flow key (direction,
 * remote class, remote address, service port) it aggregates counters that user space
 * reads each cycle, so a long-lived flow's bytes show before it closes. Each closed
 * flow also goes to the ring buffer as one record. Direction comes from the socket's
 * role: an active open (SYN_SENT) is egress, an accepted socket (SYN_RECV) ingress.
 *
 * Connect latency: an active open's time from its SYN_SENT transition (connect(), just
 * before the SYN leaves) to ESTABLISHED, binned in the kernel into the RTT's bounds per
 * (direction, class, remote) in the connects map, whichever paths the needs took.
 *
 * With either RTT path the program also bins each RTT sample in the kernel into fixed
 * bucket boundaries (-DLENS_RTT_BOUNDS, microseconds) per (direction, class, remote).
 * It lives here because it needs each socket's direction and class from socks.
 */
#include "lens_common.h"
#include "tcp_flows.h"
/* struct sockaddr_in6: 5.10's tcp_probe record sizes its address fields with it */
#include <linux/in6.h>

/* tcp:tcp_send_reset names enum sk_rst_reason (Linux 6.10+), which older header trees
 * lack. Give the generated argument struct a 4-byte enum of our own either way. */
#define sk_rst_reason lens_sk_rst_reason
enum lens_sk_rst_reason { LENS_RST_REASON_UNSPEC };

/* Map sizes come from the agent's config (bpf.* in lens_ebpf/agent/config.py), never from
 * here. */
#if !defined(MAX_SOCKETS) || !defined(MAX_FLOW_KEYS) || !defined(MAX_POLICY_PREFIXES) || \
    !defined(RINGBUF_PAGES)
#error "MAX_SOCKETS, MAX_FLOW_KEYS, MAX_POLICY_PREFIXES and RINGBUF_PAGES come as -D flags"
#endif
#if !defined(MAX_RTT_KEYS) || !defined(LENS_RTT_BOUNDS)
#error "MAX_RTT_KEYS and LENS_RTT_BOUNDS come as -D flags (bpf.max_rtt_keys, tcp_rtt.py)"
#endif

/* TCP states as the tracepoint reports them. */
#define S_ESTABLISHED 1
#define S_SYN_SENT 2
#define S_SYN_RECV 3
#define S_FIN_WAIT1 4
#define S_FIN_WAIT2 5
#define S_TIME_WAIT 6
#define S_CLOSE 7
#define S_CLOSE_WAIT 8
#define S_LAST_ACK 9
#define S_LISTEN 10
#define S_CLOSING 11
#define S_NEW_SYN_RECV 12

#define MSG_PEEK_FLAG 2

/* Index of the stats array; mirrored in lens_ebpf/agent/tcp/tcp_flows.py. */
#define ST_RINGBUF_FULL 0
#define ST_SOCK_MAP_FULL 1
#define ST_FLOW_MAP_FULL 2
#define ST_UNTRACKED_SENT 3
#define ST_UNTRACKED_RECV 4
#define ST_UNTRACKED_RETRANS 5
#define ST_RESET_NO_SOCKET 6
#define ST_EVENTS 7
#define ST_RTT_UNTRACKED 8
#define ST_RTT_MAP_FULL 9
#define ST_CONNECT_MAP_FULL 10
#define ST_COUNT 11


#define REASON_NORMAL 0
#define REASON_RESET_RECEIVED 1
#define REASON_RESET_SENT 2
#define REASON_FAILED_CONNECT 3
#define REASON_ABORTED 4
#define REASON_CLOSE_NOT_SEEN 5  /* finished late: the kernel skipped this CLOSE run */

BPF_HASH(socks, u64, struct sock_info, MAX_SOCKETS);
BPF_HASH(flows, struct flow_key, struct flow_val, MAX_FLOW_KEYS);
/* Sockets closed a moment ago: an abortive close sends its reset after CLOSE. */
BPF_TABLE("lru_hash", u64, struct flow_key, recent, 4096);
BPF_LPM_TRIE(policy, struct lens_lpm_key, u8, MAX_POLICY_PREFIXES);
BPF_PERCPU_ARRAY(stats, u64, ST_COUNT);
BPF_RINGBUF_OUTPUT(flow_events, RINGBUF_PAGES);
/* Never written: declares the record type so Python can check its size. */
BPF_ARRAY(layout_flow_event, struct flow_event, 1);
BPF_ARRAY(trace_filter, struct lens_trace_filter, 1);
/* 1 while some consumer wants closed-flow records (Python sets it as subscribers come and
 * go); at 0 no record enters the ring buffer and the aggregates alone carry the counts. */
BPF_ARRAY(records_on, u32, 1);
/* connect latency: SYN_SENT to ESTABLISHED of active opens, binned as the RTT is */
BPF_HASH(connects, struct rtt_key, struct rtt_val, MAX_RTT_KEYS);

#if defined(LENS_RTT) && !defined(LENS_TP_TCP_PROBE_SKADDR)
/* A keyed socket by its 4-tuple, for a tcp_probe record that names no socket. */
struct tuple_key {
    u8 laddr[16];
    u8 raddr[16];
    u16 lport;
    u16 rport;
    u32 pad;
};
BPF_TABLE("lru_hash", struct tuple_key, u64, tuples, MAX_SOCKETS);

static __always_inline void tuple_of(struct tuple_key *t, struct sock_info *si)
{
    __builtin_memset(t, 0, sizeof(*t));
    __builtin_memcpy(t->laddr, si->laddr, 16);
    __builtin_memcpy(t->raddr, si->key.raddr, 16);
    t->lport = si->lport;
    t->rport = si->rport;
}

static __always_inline void index_tuple(u64 sk, struct sock_info *si)
{
    struct tuple_key t;
    tuple_of(&t, si);
    tuples.update(&t, &sk);
}

static __always_inline void unindex_tuple(struct sock_info *si)
{
    struct tuple_key t;
    tuple_of(&t, si);
    tuples.delete(&t);
}
#else
static __always_inline void index_tuple(u64 sk, struct sock_info *si) {}
static __always_inline void unindex_tuple(struct sock_info *si) {}
#endif

static __always_inline void stat_add(u32 idx, u64 n)
{
    u64 *v = stats.lookup(&idx);
    if (v)
        *v += n;
}

static __always_inline u8 classify(const u8 *addr)
{
    struct lens_lpm_key k = {.prefixlen = 128};
    __builtin_memcpy(k.addr, addr, 16);
    u8 *c = policy.lookup(&k);
    return c ? *c : LENS_CLASS_EXTERNAL;
}

/* A field of the socket (the counters path, the sampled RTT): a plain load where the
 * program holds it as a BTF pointer (direct), else a guarded copy. */
static __always_inline u32 read_u32(u64 sk, const void *direct, u32 off)
{
    if (direct)
        return *(volatile const u32 *)(direct + off);
    u32 v = 0;
    bpf_probe_read_kernel(&v, sizeof(v), (void *)(sk + off));
    return v;
}

static __always_inline u64 read_u64(u64 sk, const void *direct, u32 off)
{
    if (direct)
        return *(volatile const u64 *)(direct + off);
    u64 v = 0;
    bpf_probe_read_kernel(&v, sizeof(v), (void *)(sk + off));
    return v;
}

/* An address as 16 bytes (IPv4 mapped). Tracepoint arrays are copied with a helper: the
 * verifier refuses loads through a context pointer the compiler has offset. direct: v4
 * and v6 point into a socket the program holds as a BTF pointer, read with plain loads. */
static __always_inline void copy_addr(u8 *dst, u16 family, const u8 *v4, const u8 *v6,
                                      int direct)
{
    if (family == AF_INET) {
        u8 a[4] = {};
        if (direct)
            __builtin_memcpy(a, v4, sizeof(a));
        else
            bpf_probe_read_kernel(a, sizeof(a), v4);
        lens_map_v4(dst, a);
    } else if (direct) {
        __builtin_memcpy(dst, v6, 16);
    } else {
        bpf_probe_read_kernel(dst, 16, v6);
    }
}

static __always_inline void make_key(struct flow_key *k, u8 direction, u16 family,
                                     const u8 *raddr, u16 lport, u16 rport)
{
    __builtin_memset(k, 0, sizeof(*k));
    __builtin_memcpy(k->raddr, raddr, 16);
    k->port = direction == LENS_DIR_EGRESS ? rport : lport;
    k->direction = direction;
    k->family = family;
    k->cls = classify(raddr);
}

/* The aggregate for k, created on first use; the overflow slot when the map is full. */
static __always_inline struct flow_val *flow_get(struct flow_key *k)
{
    struct flow_val *v = flows.lookup(k);
    if (v)
        return v;
    struct flow_val zero = {};
    flows.insert(k, &zero);
    v = flows.lookup(k);
    if (v)
        return v;
    stat_add(ST_FLOW_MAP_FULL, 1);
    struct flow_key o = {};
    o.direction = k->direction;
    o.cls = k->cls;
    o.overflow = 1;
    return flows.lookup(&o);
}

static __always_inline void set_owner(struct sock_info *si)
{
    si->pid = bpf_get_current_pid_tgid() >> 32;
    si->cgroup_id = bpf_get_current_cgroup_id();
    bpf_get_current_comm(&si->comm, sizeof(si->comm));
    si->pid_known = 1;
}

static __always_inline int event_wanted(struct sock_info *si)
{
    u32 zero = 0;
    struct lens_trace_filter *f = trace_filter.lookup(&zero);
    if (!f || !f->enabled)
        return 1;
    if (f->pid && si->pid != f->pid)
        return 0;
    if (f->port && si->lport != f->port && si->rport != f->port)
        return 0;
    return 1;
}

/* Wake the reader once per this many records on a CPU; it also polls on a timer, so a
 * record waits at most one poll interval (lens_ebpf/agent/bpf/program.py) */
#define WAKEUP_EVERY 64

static __always_inline void emit_close(struct sock_info *si, u8 reason)
{
    u32 zero = 0;
    u32 *on = records_on.lookup(&zero);
    if (!on || !*on || !event_wanted(si))
        return;
    struct flow_event *e = flow_events.ringbuf_reserve(sizeof(struct flow_event));
    if (!e) {
        stat_add(ST_RINGBUF_FULL, 1);
        return;
    }
    u64 now = bpf_ktime_get_ns();
    e->ts_ns = now;
    e->duration_ns = now - si->start_ns;
    e->sent = si->sent;
    e->recv = si->recv;
    e->cgroup_id = si->cgroup_id;
    __builtin_memcpy(e->laddr, si->laddr, 16);
    __builtin_memcpy(e->raddr, si->key.raddr, 16);
    e->pid = si->pid;
    e->retrans = si->retrans;
    e->lport = si->lport;
    e->rport = si->rport;
    e->family = si->family;
    e->direction = si->direction;
    e->cls = si->key.cls;
    e->reason = reason;
    __builtin_memcpy(e->comm, si->comm, sizeof(e->comm));
    u32 idx = ST_EVENTS;
    u64 *n = stats.lookup(&idx);
    u64 seq = n ? ++*n : 0;
    flow_events.ringbuf_submit(e, seq % WAKEUP_EVERY ? BPF_RB_NO_WAKEUP : BPF_RB_FORCE_WAKEUP);
}

#if !defined(LENS_BYTES_COUNTERS)
/* Bytes a per-message path counted while the socket had no key (si->pre_*), into its
 * flow, and out of pre_* (5.10 has no atomic that returns a value: XADD takes away
 * what was read). account_bytes() on another CPU that read the flags before the key
 * was set adds after this read: its bytes stay in pre_* for the next take, the
 * socket's finish. So a byte reaches the flow exactly once, whichever CPU wins. */
static __always_inline void take_pre(struct sock_info *si, struct flow_val *v)
{
    u64 s = *(volatile u64 *)&si->pre_sent;
    u64 r = *(volatile u64 *)&si->pre_recv;
    if (s) {
        __sync_fetch_and_add(&v->sent, s);
        __sync_fetch_and_add(&si->pre_sent, -s);
    }
    if (r) {
        __sync_fetch_and_add(&v->recv, r);
        __sync_fetch_and_add(&si->pre_recv, -r);
    }
}
#endif

/* Give a socket its flow key once its handshake is over. Normally that is the
 * ESTABLISHED transition; when the kernel skipped that run of this program (a
 * softirq landing while another tracing program ran on the CPU: bpf_prog_active),
 * the application's close() or shutdown(), or the CLOSE, does it instead. */
static __always_inline void key_socket(u64 sk, struct sock_info *si, u16 family,
                                       const u8 *raddr, u16 sport, u16 dport)
{
    si->lport = sport;
    si->rport = dport;
    make_key(&si->key, si->direction, family, raddr, sport, dport);
    si->keyed = 1;
    index_tuple(sk, si);
    struct flow_val *v = flow_get(&si->key);
    if (!v)
        return;
    __sync_fetch_and_add(&v->opened, 1);
#if !defined(LENS_BYTES_COUNTERS)
    /* bytes that came before the key was known (TCP Fast Open, a skipped run); the
     * counters path folds nothing before the key */
    take_pre(si, v);
#endif
}

/* One sample (microseconds) into the bins of v (an RTT or connect-latency histogram). */
static __always_inline void hist_bin(struct rtt_val *v, u32 us)
{
    u32 bounds[LENS_RTT_NBOUNDS] = {LENS_RTT_BOUNDS};
    u32 bin = LENS_RTT_NBOUNDS;
#pragma unroll
    for (int i = LENS_RTT_NBOUNDS - 1; i >= 0; i--) {
        if (us <= bounds[i])
            bin = i;
    }
    __sync_fetch_and_add(&v->count, 1);
    __sync_fetch_and_add(&v->sum_us, us);
    if (bin <= LENS_RTT_NBOUNDS)
        __sync_fetch_and_add(&v->bins[bin], 1);
}

static __always_inline void hist_key(struct rtt_key *k, struct sock_info *si)
{
    __builtin_memset(k, 0, sizeof(*k));
    __builtin_memcpy(k->raddr, si->key.raddr, 16);
    k->direction = si->direction;
    k->cls = si->key.cls;
    k->family = si->family;
}

/* An active open's connect latency (microseconds) into its (class, remote) bins. */
static __always_inline void connect_add(struct sock_info *si, u64 us)
{
    struct rtt_key k;
    hist_key(&k, si);
    struct rtt_val *v = connects.lookup(&k);
    if (!v) {
        struct rtt_val zero = {};
        connects.insert(&k, &zero);
        v = connects.lookup(&k);
        if (!v) {
            stat_add(ST_CONNECT_MAP_FULL, 1);
            struct rtt_key o = {};
            o.direction = k.direction;
            o.cls = k.cls;
            o.overflow = 1;
            v = connects.lookup(&o);
            if (!v)
                return;
        }
    }
    hist_bin(v, us > 0xffffffff ? 0xffffffff : (u32)us);
}

/* Account a socket's end: a closed flow once keyed, else a failed attempt. */
static __always_inline void finish_socket(struct sock_info *si, u8 reason)
{
    struct flow_val *v = flow_get(&si->key);
    if (si->keyed) {
        if (v) {
            __sync_fetch_and_add(&v->closed, 1);
#if !defined(LENS_BYTES_COUNTERS)
            take_pre(si, v); /* what a racing account_bytes() left there */
#endif
        }
    } else {
        if (v)
            __sync_fetch_and_add(&v->failed, 1);
    }
    emit_close(si, reason);
}

/* close() or shutdown() from the application: a process context, for accepted sockets
 * too; the socket's FIN is queued right after this transition. */
static __always_inline int app_closes(int os, int ns)
{
    return (os == S_ESTABLISHED && ns == S_FIN_WAIT1) || (os == S_CLOSE_WAIT && ns == S_LAST_ACK);
}

#ifdef LENS_BYTES_COUNTERS
/* The transitions whose fold matters: the application's close() or shutdown() (the
 * kernel does not skip these runs for another program's), and CLOSE. */
static __always_inline int fold_point(int os, int ns)
{
    return ns == S_CLOSE || app_closes(os, ns);
}

/* defined with the counters below */
static __always_inline void fold_bytes(u64 sk, const void *direct, struct sock_info *si,
                                       int state, int at_close, u32 slot);
static __always_inline void fold_untracked(u64 sk, const void *direct, int state, int at_close,
                                           int insert, u32 slot);
#endif

/* One state change of a TCP socket (IPv4 or IPv6), from either attachment: sk keys the
 * socket; direct, when not 0, is the socket as a BTF pointer (LENS_LIFECYCLE_BTF), read
 * with plain loads; saddr..daddr_v6 point at the addresses (into the socket, or into the
 * classic tracepoint's record). sport, dport: host order, as the tracepoint reports them. */
static __always_inline int set_state(u64 sk, const void *direct, int os, int ns, u16 family,
                                     u16 sport, u16 dport, const u8 *saddr,
                                     const u8 *saddr_v6, const u8 *daddr, const u8 *daddr_v6)
{
    int dr = direct != 0;
    LENS_PIN(sport);
    LENS_PIN(dport);
    /* Two of a connection's ten transitions (ESTABLISHED -> CLOSE_WAIT, FIN_WAIT1 ->
     * FIN_WAIT2; FIN_WAIT1 -> CLOSING too) neither open, key on their normal path, close
     * by the application nor end the socket: they would only key a socket whose
     * ESTABLISHED run the kernel skipped, which the application's close or the CLOSE
     * does as well. No lookup for them. */
    if (ns != S_ESTABLISHED && ns != S_CLOSE && ns != S_SYN_SENT && ns != S_SYN_RECV &&
        os != S_SYN_RECV && !app_closes(os, ns))
        return 0;

    int opening = (ns == S_SYN_SENT && os == S_CLOSE) || ns == S_SYN_RECV;
    /* an opening inserts first and looks up only when its address is taken */
    struct sock_info *si = opening ? 0 : socks.lookup(&sk);
    /* An accepted socket whose SYN_RECV run was skipped shows up leaving SYN_RECV. */
    int late_accept = !opening && !si && os == S_SYN_RECV && ns != S_CLOSE;
    if (opening || late_accept) {
        struct sock_info fresh = {};
        fresh.start_ns = bpf_ktime_get_ns();
        fresh.family = family;
        copy_addr(fresh.laddr, family, saddr, saddr_v6, dr);
        copy_addr(fresh.key.raddr, family, daddr, daddr_v6, dr);
        fresh.lport = sport;
        fresh.rport = dport;
        if (ns == S_SYN_SENT) {
            fresh.direction = LENS_DIR_EGRESS;
            set_owner(&fresh); /* connect() runs in the caller's context */
        } else {
            fresh.direction = LENS_DIR_INGRESS; /* softirq: the owner shows on first I/O */
        }
        int rc = socks.insert(&sk, &fresh);
        if (rc != 0 && opening && (si = socks.lookup(&sk))) {
            /* The address is reused while the entry lives: this run's CLOSE was skipped. */
            if (!si->keyed) {
                u8 old_raddr[16];
                __builtin_memcpy(old_raddr, si->key.raddr, 16);
                make_key(&si->key, si->direction, si->family, old_raddr, si->lport, si->rport);
            }
            finish_socket(si, REASON_CLOSE_NOT_SEEN);
            rc = socks.update(&sk, &fresh);
        }
        if (rc != 0) {
            stat_add(ST_SOCK_MAP_FULL, 1);
            return 0;
        }
        if (!late_accept)
            return 0;
        si = socks.lookup(&sk);
    }
    if (!si) { /* opened before the agent, or not a connection */
#ifdef LENS_BYTES_COUNTERS
        if (fold_point(os, ns))
            fold_untracked(sk, direct, os, ns == S_CLOSE, 0, 0);
#endif
        return 0;
    }

    if (!si->keyed && ns != S_SYN_SENT && ns != S_SYN_RECV &&
        !(ns == S_CLOSE && (os == S_SYN_SENT || os == S_SYN_RECV))) {
        u8 raddr[16];
        copy_addr(raddr, family, daddr, daddr_v6, dr);
        copy_addr(si->laddr, family, saddr, saddr_v6, dr);
        key_socket(sk, si, family, raddr, sport, dport);
    }

    if (ns == S_ESTABLISHED && os == S_SYN_SENT && si->keyed)
        connect_add(si, (bpf_ktime_get_ns() - si->start_ns) / 1000);

    if (!si->pid_known && app_closes(os, ns))
        set_owner(si);

#ifdef LENS_BYTES_COUNTERS
    if (si->keyed && fold_point(os, ns))
        fold_bytes(sk, direct, si, os, ns == S_CLOSE, 0);
#endif
    if (ns != S_CLOSE)
        return 0;

    u8 reason = REASON_NORMAL;
    if (!si->keyed) {
        u8 raddr[16];
        copy_addr(raddr, family, daddr, daddr_v6, dr);
        copy_addr(si->laddr, family, saddr, saddr_v6, dr);
        si->lport = sport;
        si->rport = dport;
        make_key(&si->key, si->direction, family, raddr, sport, dport);
        reason = os == S_SYN_SENT ? REASON_FAILED_CONNECT : REASON_ABORTED;
    } else if (si->rst_recv) {
        reason = REASON_RESET_RECEIVED;
    } else if (si->rst_sent) {
        reason = REASON_RESET_SENT;
    } else if (os == S_ESTABLISHED || os == S_CLOSE_WAIT) {
        /* no FIN exchange: an abortive close (its reset follows) or a timeout */
        reason = REASON_ABORTED;
    }
    if (si->keyed) {
        /* an abortive close (or disconnect) sends its reset after CLOSE; a socket
         * leaving LAST_ACK has had its close() already and sends none */
        if (os != S_LAST_ACK)
            recent.update(&sk, &si->key);
        unindex_tuple(si);
    }
    finish_socket(si, reason);
    socks.delete(&sk);
    return 0;
}

#ifdef LENS_LIFECYCLE_BTF
/* TP_PROTO(const struct sock *sk, const int oldstate, const int newstate); the loader
 * attaches it BTF-typed (tp_btf) itself. bpf_skc_to_tcp_sock: NULL for any socket but a
 * full TCP one, and a pointer whose BTF type (tcp_sock) holds every field read here. */
int tp_btf__inet_sock_set_state(u64 *ctx)
{
    const void *tp = (const void *)bpf_skc_to_tcp_sock((void *)ctx[0]);
    if (!tp)
        return 0;
    u16 family = *(volatile const u16 *)(tp + LENS_SK_FAMILY_OFF);
    if (family != AF_INET && family != AF_INET6)
        return 0;
    u16 sport = bpf_ntohs(*(volatile const u16 *)(tp + LENS_INET_SPORT_OFF));
    u16 dport = bpf_ntohs(*(volatile const u16 *)(tp + LENS_SK_DPORT_OFF));
    return set_state((u64)tp, tp, (int)ctx[1], (int)ctx[2], family, sport, dport,
                     tp + LENS_INET_SADDR_OFF, tp + LENS_SK_V6_RCV_SADDR_OFF,
                     tp + LENS_SK_DADDR_OFF, tp + LENS_SK_V6_DADDR_OFF);
}
#else
TRACEPOINT_PROBE(sock, inet_sock_set_state)
{
    if (args->protocol != LENS_IPPROTO_TCP)
        return 0;
    u16 family = args->family;
    if (family != AF_INET && family != AF_INET6)
        return 0;
    return set_state((u64)args->skaddr, 0, args->oldstate, args->newstate, family, args->sport,
                     args->dport, args->saddr, args->saddr_v6, args->daddr, args->daddr_v6);
}
#endif

#if defined(LENS_RTT) || defined(LENS_RTT_SAMPLED)
BPF_HASH(rtt, struct rtt_key, struct rtt_val, MAX_RTT_KEYS);

/* One smoothed-RTT sample (microseconds) into its (direction, class, remote) bins. */
static __always_inline void rtt_add(struct sock_info *si, u32 srtt)
{
    struct rtt_key k = {};
    __builtin_memcpy(k.raddr, si->key.raddr, 16);
    k.direction = si->direction;
    k.cls = si->key.cls;
    k.family = si->family;
    struct rtt_val *v = rtt.lookup(&k);
    if (!v) {
        struct rtt_val zero = {};
        rtt.insert(&k, &zero);
        v = rtt.lookup(&k);
        if (!v) {
            stat_add(ST_RTT_MAP_FULL, 1);
            struct rtt_key o = {};
            o.direction = k.direction;
            o.cls = k.cls;
            o.overflow = 1;
            v = rtt.lookup(&o);
            if (!v)
                return;
        }
    }
    hist_bin(v, srtt);
}
#endif

#ifdef LENS_RTT_SAMPLED
/* The current sampling period, which Python advances every collectors.rtt.sample_seconds
 * (from its read loop); 0: sample at every send and receive. A counter, not a clock: a
 * clock read per message cost this probe a third more here. */
BPF_ARRAY(rtt_period, u64, 1);

/* The socket's smoothed RTT, read where the running kernel's BTF places
 * tcp_sock.srtt_us (-DLENS_TCP_SRTT_OFF: microseconds << 3, the value tcp_probe's srtt
 * field and ss -ti show shifted back), when an application moves bytes on it, once per
 * period: no program runs per received segment. */
static __always_inline void sample_rtt(u64 sk, const void *direct, struct sock_info *si)
{
    u32 zero = 0;
    u64 *period = rtt_period.lookup(&zero);
    if (!period || (*period && si->rtt_period == *period))
        return;
    u32 srtt = read_u32(sk, direct, LENS_TCP_SRTT_OFF) >> 3;
    if (!srtt)
        return; /* no RTT measured yet */
    si->rtt_period = *period;
    rtt_add(si, srtt);
}
#endif

/* Bytes a keyed socket moved, into its flow's counters (and the period's RTT sample).
 * direct: the socket as a BTF pointer, or 0 (read with a guarded copy). */
static __always_inline void flow_add(u64 sk, const void *direct, struct sock_info *si, u64 sent,
                                     u64 recv)
{
#ifdef LENS_RTT_SAMPLED
    sample_rtt(sk, direct, si);
#endif
    struct flow_val *v = flow_get(&si->key);
    if (!v)
        return;
    if (sent)
        __sync_fetch_and_add(&v->sent, sent);
    if (recv)
        __sync_fetch_and_add(&v->recv, recv);
}

#ifdef LENS_BYTES_RAW
/* A raw tracepoint fires for every socket: one the program does not track counts as
 * untracked only when it is TCP over IPv4/IPv6, as the classic tracepoint's own family
 * and protocol fields say. The fields are read where the running kernel's BTF puts
 * them (lens_ebpf/agent/bpf/btf.py), never where a header tree would. */
static __always_inline int inet_tcp(u64 sk)
{
    u16 family = 0, protocol = 0;
    bpf_probe_read_kernel(&family, sizeof(family), (void *)(sk + LENS_SK_FAMILY_OFF));
    bpf_probe_read_kernel(&protocol, sizeof(protocol), (void *)(sk + LENS_SK_PROTOCOL_OFF));
    return protocol == LENS_IPPROTO_TCP && (family == AF_INET || family == AF_INET6);
}
#endif

#ifdef LENS_BYTES_COUNTERS
/* enum sock_flags: SOCK_DEAD, SOCK_DONE (a FIN came in: tcp_fin() sets it), ... */
#define SOCK_DONE_BIT 1

/* A socket's application bytes since it was created: what send() accepted and what
 * recv() returned, from the kernel's own counters. */
struct counts {
    u64 sent;
    u64 recv;
    u32 ports; /* skc_portpair: an untracked entry belongs to this socket, not a reused address */
    u32 pad;
};
/* Sockets opened before the agent (no flow key): their counters when first seen by the
 * iterator, so lens_tcp_untracked_bytes counts what moved since. */
BPF_TABLE("lru_hash", u64, struct counts, untracked, MAX_SOCKETS);

/* The six tcp_sock counters lie within a few hundred bytes of each other: one read of
 * the span that holds them costs less than six reads (each read is a guarded copy). */
#define LENS_MIN(a, b) ((a) < (b) ? (a) : (b))
#define LENS_MAX(a, b) ((a) > (b) ? (a) : (b))
#define TCP_BLOCK_OFF                                                                          \
    LENS_MIN(LENS_MIN(LENS_MIN(LENS_TCP_BYTES_ACKED_OFF, LENS_TCP_WRITE_SEQ_OFF),             \
                      LENS_MIN(LENS_TCP_SND_UNA_OFF, LENS_TCP_BYTES_RECEIVED_OFF)),           \
             LENS_MIN(LENS_TCP_RCV_NXT_OFF, LENS_TCP_COPIED_SEQ_OFF))
#define TCP_BLOCK_END                                                                          \
    LENS_MAX(LENS_MAX(LENS_MAX(LENS_TCP_BYTES_ACKED_OFF + 8, LENS_TCP_WRITE_SEQ_OFF + 4),     \
                      LENS_MAX(LENS_TCP_SND_UNA_OFF + 4, LENS_TCP_BYTES_RECEIVED_OFF + 8)),   \
             LENS_MAX(LENS_TCP_RCV_NXT_OFF + 4, LENS_TCP_COPIED_SEQ_OFF + 4))
#define TCP_BLOCK_LEN (TCP_BLOCK_END - TCP_BLOCK_OFF)
#if TCP_BLOCK_LEN > 1024
#error "tcp_sock's counters span more than 1 KB on this kernel"
#endif
struct tcp_block {
    u8 b[TCP_BLOCK_LEN];
};
/* scratch for the span: slot 0 for the state-change program, 1 for the iterator (a
 * softirq's state change can land while the iterator runs on the CPU) */
BPF_PERCPU_ARRAY(tcp_blocks, struct tcp_block, 2);
#define BLOCK_U32(blk, off) (*(u32 *)((blk)->b + ((off) - TCP_BLOCK_OFF)))
#define BLOCK_U64(blk, off) (*(u64 *)((blk)->b + ((off) - TCP_BLOCK_OFF)))

/* A FIN is queued (it took one sequence number of write_seq) once the socket has left
 * ESTABLISHED or CLOSE_WAIT by close() or shutdown(): the state is set first, then
 * tcp_send_fin() runs under the same socket lock. */
static __always_inline int fin_queued(int state)
{
    return state == S_FIN_WAIT1 || state == S_FIN_WAIT2 || state == S_CLOSING ||
           state == S_LAST_ACK;
}

/* state: the socket's state before this transition (or now, for the iterator). Sent:
 * the sequence space the socket used, as a u64 (bytes_acked plus what is queued past
 * snd_una; u32 sequences wrap every 4 GB), less its FIN. Read: bytes_received (u64, up to
 * rcv_nxt) less what waits unread, less the EOF when the application read it (recv()
 * moves copied_seq past the FIN). At CLOSE, data still queued for the application (the
 * peer's FIN closed the socket before it read everything: it reads the rest after
 * CLOSE, which no transition sees) counts as read; close() empties the queue of what it
 * throws away before CLOSE, so that never counts. */
static __always_inline int socket_counts(u64 sk, const void *direct, int state, int at_close,
                                         struct counts *c, u32 slot)
{
    u64 acked, received;
    u32 write_seq, snd_una, rcv_nxt, copied;
    if (direct) { /* a BTF pointer to the tcp_sock: six plain loads */
        acked = read_u64(sk, direct, LENS_TCP_BYTES_ACKED_OFF);
        write_seq = read_u32(sk, direct, LENS_TCP_WRITE_SEQ_OFF);
        snd_una = read_u32(sk, direct, LENS_TCP_SND_UNA_OFF);
        received = read_u64(sk, direct, LENS_TCP_BYTES_RECEIVED_OFF);
        rcv_nxt = read_u32(sk, direct, LENS_TCP_RCV_NXT_OFF);
        copied = read_u32(sk, direct, LENS_TCP_COPIED_SEQ_OFF);
    } else {
        struct tcp_block *blk = tcp_blocks.lookup(&slot);
        if (!blk || bpf_probe_read_kernel(blk, sizeof(*blk), (void *)(sk + TCP_BLOCK_OFF)))
            return -1;
        acked = BLOCK_U64(blk, LENS_TCP_BYTES_ACKED_OFF);
        write_seq = BLOCK_U32(blk, LENS_TCP_WRITE_SEQ_OFF);
        snd_una = BLOCK_U32(blk, LENS_TCP_SND_UNA_OFF);
        received = BLOCK_U64(blk, LENS_TCP_BYTES_RECEIVED_OFF);
        rcv_nxt = BLOCK_U32(blk, LENS_TCP_RCV_NXT_OFF);
        copied = BLOCK_U32(blk, LENS_TCP_COPIED_SEQ_OFF);
    }
    u64 sk_flags = read_u64(sk, direct, LENS_SK_FLAGS_OFF);
    c->sent = acked + (u32)(write_seq - snd_una) - fin_queued(state);
    u32 unread = rcv_nxt - copied;
    u32 fin_in = (sk_flags >> SOCK_DONE_BIT) & 1;
    c->recv = received - unread;
    if (fin_in && !unread)
        c->recv -= 1; /* the EOF the application read */
    else if (at_close && unread > fin_in && read_u32(sk, direct, LENS_SK_RCVQ_LEN_OFF))
        c->recv += unread - fin_in;
    return 0;
}

/* Add what a tracked socket moved since its last fold to its flow (si->sent, si->recv:
 * what was folded). Only ever called under the socket's lock (a state change, or the
 * iterator), so the folds of one socket never interleave. */
static __always_inline void fold_bytes(u64 sk, const void *direct, struct sock_info *si,
                                       int state, int at_close, u32 slot)
{
    struct counts c;
    if (socket_counts(sk, direct, state, at_close, &c, slot))
        return;
    /* an active open's SYN took one sequence number: bytes_acked counts its ACK */
    u64 syn = si->direction == LENS_DIR_EGRESS;
    u64 sent = c.sent > syn ? c.sent - syn : 0;
    u64 ds = sent > si->sent ? sent - si->sent : 0;
    u64 dr = c.recv > si->recv ? c.recv - si->recv : 0;
    if (!ds && !dr)
        return;
    si->sent += ds;
    si->recv += dr;
    flow_add(sk, direct, si, ds, dr);
}

/* A socket opened before the agent: what it moved since the iterator first saw it, into
 * the untracked counters. The iterator (insert) takes its first sight; a close forgets it. */
static __always_inline void fold_untracked(u64 sk, const void *direct, int state, int at_close,
                                           int insert, u32 slot)
{
    struct counts c;
    if (socket_counts(sk, direct, state, at_close, &c, slot))
        return;
    c.ports = read_u32(sk, direct, LENS_SK_PORTPAIR_OFF);
    struct counts *was = untracked.lookup(&sk);
    if (!was || was->ports != c.ports || c.sent < was->sent || c.recv < was->recv) {
        if (insert)
            untracked.update(&sk, &c); /* first sight, or another socket at this address */
        else if (was)
            untracked.delete(&sk);
        return;
    }
    if (c.sent > was->sent)
        stat_add(ST_UNTRACKED_SENT, c.sent - was->sent);
    if (c.recv > was->recv)
        stat_add(ST_UNTRACKED_RECV, c.recv - was->recv);
    if (at_close) {
        untracked.delete(&sk);
    } else {
        was->sent = c.sent;
        was->recv = c.recv;
    }
}

/* The context of the TCP socket iterator (net/ipv4/tcp_ipv4.c), as the verifier checks
 * it against the kernel's BTF: each member 8-aligned. */
struct bpf_iter__tcp {
    void *meta;
    void *sk_common;
    u32 uid;
} __attribute__((aligned(8)));

/* Run by Python once per read cycle over every TCP socket: fold what open connections
 * moved since their last fold (the bytes a scrape shows before a flow ends), and take
 * the first sight of sockets opened before the agent. */
int bpf_iter__tcp(struct bpf_iter__tcp *ctx)
{
    void *skc = ctx->sk_common;
    if (!skc)
        return 0;
    u64 sk = (u64)skc;
    u8 state = 0;
    bpf_probe_read_kernel(&state, sizeof(state), (void *)(sk + LENS_SK_STATE_OFF));
    /* not full sockets, or none that moves application bytes */
    if (state == S_TIME_WAIT || state == S_NEW_SYN_RECV || state == S_LISTEN ||
        state == S_CLOSE || state == S_SYN_SENT)
        return 0;
    struct sock_info *si = socks.lookup(&sk);
    if (si) {
        if (si->keyed)
            fold_bytes(sk, 0, si, state, 0, 1);
        return 0;
    }
    u16 family = 0;
    bpf_probe_read_kernel(&family, sizeof(family), (void *)(sk + LENS_SK_FAMILY_OFF));
    if (family == AF_INET || family == AF_INET6)
        fold_untracked(sk, 0, state, 0, 1, 1);
    return 0;
}
#endif

#if !defined(LENS_BYTES_COUNTERS)
/* Bytes an application moved on a socket: into its flow's counters once keyed. */
static __always_inline void account_bytes(u64 sk, int ret, int sending)
{
    struct sock_info *si = socks.lookup(&sk);
    if (!si) {
#ifdef LENS_BYTES_RAW
        if (!inet_tcp(sk))
            return; /* a Unix, UDP or netlink socket: none of ours */
#endif
        stat_add(sending ? ST_UNTRACKED_SENT : ST_UNTRACKED_RECV, ret);
        return;
    }
    if (!si->pid_known)
        set_owner(si); /* send/recv always run in the owner's context */
    /* the socket's totals, for its closed-flow record */
    if (sending)
        __sync_fetch_and_add(&si->sent, ret);
    else
        __sync_fetch_and_add(&si->recv, ret);
    /* the flow's: each byte to the flow or to pre_* (take_pre moves those), never both.
     * Adding to si->sent and testing the key after, as before, counted a message twice
     * when another CPU keyed the socket in between: key_socket() took si->sent, this
     * message in it, and this call then saw the key and added it again. */
    if (si->keyed)
        flow_add(sk, 0, si, sending ? ret : 0, sending ? 0 : ret);
    else if (sending)
        __sync_fetch_and_add(&si->pre_sent, ret);
    else
        __sync_fetch_and_add(&si->pre_recv, ret);
}
#endif

#ifdef LENS_BYTES_TRACEPOINT
static __always_inline void count_bytes(u64 sk, u16 family, u16 protocol, int ret, int flags,
                                        int sending)
{
    if (protocol != LENS_IPPROTO_TCP || ret <= 0 || (flags & MSG_PEEK_FLAG))
        return;
    if (family != AF_INET && family != AF_INET6)
        return;
    account_bytes(sk, ret, sending);
}

TRACEPOINT_PROBE(sock, sock_send_length)
{
    count_bytes((u64)args->sk, args->family, args->protocol, args->ret, args->flags, 1);
    return 0;
}

TRACEPOINT_PROBE(sock, sock_recv_length)
{
    count_bytes((u64)args->sk, args->family, args->protocol, args->ret, args->flags, 0);
    return 0;
}
#endif

#ifdef LENS_BYTES_RAW
/* TP_PROTO(struct sock *sk, int ret, int flags), as the kernel's btf_trace_* typedefs
 * say (the spec checks them): every socket, so tracked ones are found first. */
static __always_inline void raw_bytes(u64 *args, int sending)
{
    int ret = (int)args[1];
    if (ret <= 0 || ((int)args[2] & MSG_PEEK_FLAG))
        return;
    account_bytes(args[0], ret, sending);
}

RAW_TRACEPOINT_PROBE(sock_send_length)
{
    raw_bytes(ctx->args, 1);
    return 0;
}

RAW_TRACEPOINT_PROBE(sock_recv_length)
{
    raw_bytes(ctx->args, 0);
    return 0;
}
#endif

#ifdef LENS_BYTES_KPROBE
#include <uapi/linux/ptrace.h> /* struct pt_regs, for PT_REGS_PARM*() */
#ifndef MAX_INFLIGHT_CALLS
#define MAX_INFLIGHT_CALLS 16384
#endif
/* thread -> the socket its tcp_sendmsg() or tcp_recvmsg() works on, and which of the two,
 * until the call returns (a thread is inside one of them at a time) */
struct inflight {
    u64 sk;
    u32 sending;
    u32 pad;
};
BPF_HASH(calls, u64, struct inflight, MAX_INFLIGHT_CALLS);
/* threads inside a MSG_PEEK recvmsg(): their tcp_recvmsg() moves no data out */
BPF_HASH(peeking, u64, u8, MAX_INFLIGHT_CALLS);

/* Return probes are named kretprobe_<fn>, not kretprobe__<fn>: the loader attaches them
 * itself, with room for as many threads inside the call at once as the kernel allows
 * (a thread blocked in recv holds one instance for as long as it waits). */

static __always_inline void call_entered(u64 sk, u32 sending)
{
    u64 tid = bpf_get_current_pid_tgid();
    struct inflight call = {.sk = sk, .sending = sending};
    calls.update(&tid, &call);
}

/* The call's return value is the bytes it moved, once per call however often it waited. */
static __always_inline int call_returned(struct pt_regs *ctx)
{
    u64 tid = bpf_get_current_pid_tgid();
    struct inflight *found = calls.lookup(&tid);
    if (!found)
        return 0;
    struct inflight call = *found;
    calls.delete(&tid);
    int ret = PT_REGS_RC(ctx);
    if (ret > 0)
        account_bytes(call.sk, ret, call.sending);
    return 0;
}

/* int tcp_sendmsg(struct sock *sk, struct msghdr *msg, size_t size) */
int kprobe__tcp_sendmsg(struct pt_regs *ctx)
{
    call_entered(PT_REGS_PARM1(ctx), 1);
    return 0;
}

int kretprobe_tcp_sendmsg(struct pt_regs *ctx)
{
    return call_returned(ctx);
}

/* int inet_recvmsg(struct socket *sock, struct msghdr *msg, size_t size, int flags), and
 * inet6_recvmsg alike: remember a peek until the same thread's tcp_recvmsg(), whose own
 * flags argument moved when 5.19 dropped its nonblock argument. */
static __always_inline int recv_flags(int flags)
{
    u64 tid = bpf_get_current_pid_tgid();
    if (flags & MSG_PEEK_FLAG) {
        u8 one = 1;
        peeking.update(&tid, &one);
    } else if (peeking.lookup(&tid)) {
        peeking.delete(&tid); /* a peek that never reached tcp_recvmsg() */
    }
    return 0;
}

int kprobe__inet_recvmsg(struct pt_regs *ctx)
{
    return recv_flags((int)PT_REGS_PARM4(ctx));
}

int kprobe__inet6_recvmsg(struct pt_regs *ctx)
{
    return recv_flags((int)PT_REGS_PARM4(ctx));
}

/* int tcp_recvmsg(struct sock *sk, struct msghdr *msg, size_t len, ...) returns the bytes
 * it copied to the reader, once per call. (tcp_cleanup_rbuf(), which BCC's tcptop
 * probes, is told the bytes copied so far each time the call waits or processes its
 * backlog, and again at the end: a read that spans a wait was counted twice.) */
int kprobe__tcp_recvmsg(struct pt_regs *ctx)
{
    u64 tid = bpf_get_current_pid_tgid();
    if (peeking.lookup(&tid)) {
        peeking.delete(&tid);
        calls.delete(&tid);
        return 0;
    }
    call_entered(PT_REGS_PARM1(ctx), 0);
    return 0;
}

int kretprobe_tcp_recvmsg(struct pt_regs *ctx)
{
    return call_returned(ctx);
}
#endif

#ifdef LENS_RETRANS
TRACEPOINT_PROBE(tcp, tcp_retransmit_skb)
{
#ifdef LENS_TP_RETRANSMIT_ERR
    if (args->err != 0)
        return 0; /* not sent; the kernel's own retransmit counts skip these too */
#endif
    u64 sk = (u64)args->skaddr;
    struct sock_info *si = socks.lookup(&sk);
    if (!si) {
        stat_add(ST_UNTRACKED_RETRANS, 1);
        return 0;
    }
    si->retrans++;
    struct flow_key k;
    if (si->keyed) {
        __builtin_memcpy(&k, &si->key, sizeof(k));
    } else { /* a SYN retransmitted before the handshake finished */
        u8 raddr[16];
        u16 sport = args->sport, dport = args->dport;
        LENS_PIN(sport);
        LENS_PIN(dport);
        /* the socket's family: 5.10's record has no family field */
        copy_addr(raddr, si->family, args->daddr, args->daddr_v6, 0);
        make_key(&k, si->direction, si->family, raddr, sport, dport);
    }
    struct flow_val *v = flow_get(&k);
    if (v)
        __sync_fetch_and_add(&v->retrans, 1);
    return 0;
}
#endif

#ifdef LENS_RESETS
TRACEPOINT_PROBE(tcp, tcp_receive_reset)
{
    u64 sk = (u64)args->skaddr;
    struct sock_info *si = socks.lookup(&sk);
    if (!si)
        return 0;
    si->rst_recv = 1;
    struct flow_key k;
    if (si->keyed) {
        __builtin_memcpy(&k, &si->key, sizeof(k));
    } else { /* a refused connect: the reset answers our SYN */
        u8 raddr[16];
        u16 sport = args->sport, dport = args->dport;
        LENS_PIN(sport);
        LENS_PIN(dport);
        copy_addr(raddr, si->family, args->daddr, args->daddr_v6, 0);
        make_key(&k, si->direction, si->family, raddr, sport, dport);
    }
    struct flow_val *v = flow_get(&k);
    if (v)
        __sync_fetch_and_add(&v->resets_recv, 1);
    return 0;
}

TRACEPOINT_PROBE(tcp, tcp_send_reset)
{
    u64 sk = (u64)args->skaddr;
    struct sock_info *si = sk ? socks.lookup(&sk) : 0;
    if (!si) {
        struct flow_key *closed = sk ? recent.lookup(&sk) : 0;
        struct flow_val *cv = closed ? flow_get(closed) : 0;
        if (cv) /* the reset of an abortive close, sent after CLOSE */
            __sync_fetch_and_add(&cv->resets_sent, 1);
        else /* e.g. a SYN to a port nobody listens on */
            stat_add(ST_RESET_NO_SOCKET, 1);
        return 0;
    }
    si->rst_sent = 1;
    if (!si->keyed)
        return 0;
    struct flow_val *v = flow_get(&si->key);
    if (v)
        __sync_fetch_and_add(&v->resets_sent, 1);
    return 0;
}
#endif

#ifdef LENS_RTT
#ifndef LENS_TP_TCP_PROBE_SKADDR
/* No skaddr in this kernel's tcp_probe: find the socket by its 4-tuple. The record's
 * saddr/daddr are a sockaddr_in or sockaddr_in6 (family first, as the kernel stores
 * them); sport/dport are the same host-order ports inet_sock_set_state reports. */
static __always_inline struct sock_info *socket_by_tuple(const u8 *saddr, const u8 *daddr,
                                                         u16 sport, u16 dport)
{
    u8 sa[28] = {};
    u8 da[28] = {};
    bpf_probe_read_kernel(sa, sizeof(sa), saddr);
    bpf_probe_read_kernel(da, sizeof(da), daddr);
    u16 family = *(u16 *)sa;
    struct tuple_key t = {};
    if (family == AF_INET) {
        lens_map_v4(t.laddr, sa + 4);
        lens_map_v4(t.raddr, da + 4);
    } else if (family == AF_INET6) {
        __builtin_memcpy(t.laddr, sa + 8, 16);
        __builtin_memcpy(t.raddr, da + 8, 16);
    } else {
        return 0;
    }
    t.lport = sport;
    t.rport = dport;
    u64 *sk = tuples.lookup(&t);
    return sk ? socks.lookup(sk) : 0;
}
#endif

TRACEPOINT_PROBE(tcp, tcp_probe)
{
    /* Already microseconds: the tracepoint stores tp->srtt_us >> 3 (checked against
     * ss -ti, which prints the same srtt). Shifting again would divide by 8. */
    u32 srtt = args->srtt;
    if (!srtt)
        return 0;
#ifdef LENS_TP_TCP_PROBE_SKADDR
    u64 sk = (u64)args->skaddr;
    struct sock_info *si = socks.lookup(&sk);
#else
    u16 sport = args->sport, dport = args->dport;
    LENS_PIN(sport);
    LENS_PIN(dport);
    struct sock_info *si = socket_by_tuple(args->saddr, args->daddr, sport, dport);
#endif
    if (!si || !si->keyed) {
        stat_add(ST_RTT_UNTRACKED, 1);
        return 0;
    }
    rtt_add(si, srtt);
    return 0;
}
#endif
