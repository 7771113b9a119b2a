/* competitor.c: another tracing program on the same CPUs, for tests only.
 *
 * raw_syscalls:sys_enter (every kernel of the matrix) spins a bounded while on each
 * system call. An interrupt that lands meanwhile runs its softirqs (TCP receive, timers)
 * with a BPF program active on the CPU, so the kernel skips the tracing programs those
 * softirqs would run (recursion misses): the case lens-ebpf's counts must survive.
 */
#ifndef SPIN
#define SPIN 512
#endif

BPF_ARRAY(spins, u64, 1);

TRACEPOINT_PROBE(raw_syscalls, sys_enter)
{
    u32 zero = 0;
    u64 *n = spins.lookup(&zero);
    if (!n)
        return 0;
    for (int i = 0; i < SPIN; i++)
        __sync_fetch_and_add(n, 1);
    return 0;
}
