/* proc_events.c: process exec, whole-process exit (exit code or fatal signal), OOM kills.
 *
 * Tracepoints (arguments and helpers only; docs/design.md rule 1). Each optional need has
 * its switch, set by the program's spec (lens_ebpf/agent/processes/proc_events.py SPEC):
 *   sched:sched_process_fork     parent of each new task            (Linux 2.6.28+)
 *   sched:sched_process_exec     filename, pid                      (Linux 3.4+)
 *   sched:sched_process_exit     one thread ends; its group_dead field says the whole
 *                                process ends (-DLENS_TP_EXIT_GROUP_DEAD: 6.18 has it, 6.12 not);
 *                                without it, the thread-group leader's exit stands for
 *                                the process's
 *   the exit code and killing signal, one of:
 *   -DLENS_EXIT_CODE_BTF         the exiting task's exit_code, read in sched_process_exit
 *                                where the running kernel's BTF places it
 *                                (-DLENS_TASK_EXIT_CODE_OFF; lens_ebpf/agent/bpf/btf.py):
 *                                the status wait() reports, at no cost to anything else
 *   -DLENS_EXIT_CODES syscalls:sys_enter_exit_group, syscalls:sys_enter_exit
 *                                the exit code a process asks for   (CONFIG_FTRACE_SYSCALLS;
 *                                a kernel without BTF: an enabled syscall tracepoint sends
 *                                every syscall of every process through the slow path,
 *                                12-113 ns each on the development machine)
 *   -DLENS_SIGNALS signal:signal_deliver  a fatal signal taken with SIG_DFL (Linux 3.3+)
 *   -DLENS_OOM oom:mark_victim   the OOM killer's victim            (Linux 4.19+ for pid;
 *                                its comm, -DLENS_TP_OOM_COMM, where the kernel has it)
 *   -DLENS_CGROUP_PATHS          the path of a cgroup user space has not named yet, read
 *                                from the current task's cgroup where the running kernel's
 *                                BTF places the members (LENS_*_OFF below): a container
 *                                gone before user space looks is still named
 *
 * sched_process_exit carries no exit code. Where the kernel describes itself in BTF the
 * task's exit_code is read at that offset; elsewhere the code comes from the exit
 * syscalls' argument and the killing signal from signal_deliver, kept per process until
 * it exits (reading task->exit_code through a header tree would be rule 1's wrong number).
 */
#include "lens_common.h"
#include "proc_events.h"

/* Sizes come from the agent's config (bpf.max_processes, bpf.ringbuf_pages,
 * bpf.max_known_cgroups). */
#if !defined(MAX_PROCS) || !defined(RINGBUF_PAGES) || !defined(KNOWN_CGROUPS)
#error "MAX_PROCS, RINGBUF_PAGES and KNOWN_CGROUPS come as -D flags"
#endif

/* the record's kinds and flags (EV_*, PF_*, REC_NEW_CGROUP) are in proc_events.h */

/* Index of the pstats array; mirrored in lens_ebpf/agent/processes/proc_events.py. */
#define PS_RINGBUF_FULL 0
#define PS_EVENTS 1
#define PS_COUNT 2

#define SIG_DFL_HANDLER 0

struct proc_state {
    u64 cgroup_id;
    u32 ppid;
    s32 exit_code;
    s32 signal;
    u32 flags;
};

BPF_TABLE("lru_hash", u32, struct proc_state, procs, MAX_PROCS);
BPF_RINGBUF_OUTPUT(proc_events, RINGBUF_PAGES);
BPF_PERCPU_ARRAY(pstats, u64, PS_COUNT);
/* Cgroups user space has named for good, container and pod (it adds them when a record
 * flagged REC_NEW_CGROUP resolves; lens_ebpf/agent/processes/proc_events.py). Their
 * records wake the reader once per WAKEUP_EVERY on a CPU, or at its poll timer: a wake-up
 * costs the traced process ~20 us where the kernel sends an interrupt for it. A record of
 * any other cgroup wakes it at once, while that cgroup and its container still exist to
 * be looked up. */
#define WAKEUP_EVERY 64
BPF_TABLE("lru_hash", u64, u8, known_cgroups, KNOWN_CGROUPS);
/* Never written: declares the record type so Python can check its size. */
BPF_ARRAY(layout_proc_event, struct proc_event, 1);
BPF_ARRAY(trace_filter, struct lens_trace_filter, 1);

static __always_inline void pstat_add(u32 idx)
{
    u64 *v = pstats.lookup(&idx);
    if (v)
        *v += 1;
}

static __always_inline struct proc_state *state_of(u32 tgid)
{
    struct proc_state *ps = procs.lookup(&tgid);
    if (ps)
        return ps;
    struct proc_state fresh = {.exit_code = -1};
    procs.update(&tgid, &fresh);
    return procs.lookup(&tgid);
}

static __always_inline int event_wanted(u32 pid, u32 ppid)
{
    u32 zero = 0;
    struct lens_trace_filter *f = trace_filter.lookup(&zero);
    if (!f || !f->enabled || !f->pid)
        return 1;
    return pid == f->pid || ppid == f->pid;
}

static __always_inline struct proc_event *reserve(u32 kind, u32 pid, u32 ppid)
{
    if (!event_wanted(pid, ppid))
        return 0;
    struct proc_event *e = proc_events.ringbuf_reserve(sizeof(struct proc_event));
    if (!e) {
        pstat_add(PS_RINGBUF_FULL);
        return 0;
    }
    e->ts_ns = bpf_ktime_get_ns();
    e->kind = kind;
    e->pid = pid;
    e->ppid = 0;
    e->exit_code = -1;
    e->signal = 0;
    e->flags = 0;
    e->cgroup_id = 0;
    e->filename[0] = 0;
    return e;
}

#ifdef LENS_CGROUP_PATHS
/* The names from a cgroup up to its hierarchy's root, leaf first (the root's is empty),
 * of each cgroup a record names before user space has named it: its records are read
 * after the fact, and a container of a few milliseconds, its cgroup with it, may be gone
 * by then (runc removes the cgroup with the container). Written once per cgroup, by the
 * first such record of a task in it; user space reads it where its own index of the
 * hierarchy has no such id. levels: the names written; complete: the root was reached. */
#define CGROUP_PATH_DEPTH 8
#define CGROUP_NAME_LEN 128
#define CGROUP_PATHS 512
struct cgroup_path {
    u8 names[CGROUP_PATH_DEPTH * CGROUP_NAME_LEN]; /* flat: BCC's Python type is 1-D */
    u32 name_len;                                  /* CGROUP_NAME_LEN: each name's slot */
    u32 levels;
    u32 complete;
    u32 pad;
};
BPF_TABLE("lru_hash", u64, struct cgroup_path, cgroup_paths, CGROUP_PATHS);
BPF_PERCPU_ARRAY(cgroup_path_scratch, struct cgroup_path, 1); /* too big for the stack */

/* the current task's cgroup of the default hierarchy (bpf_get_current_cgroup_id's):
 * task->cgroups->dfl_cgrp->kn, then each kernfs node's name and parent */
static __always_inline void remember_path(u64 cgroup)
{
    if (cgroup_paths.lookup(&cgroup))
        return;
    u32 zero = 0;
    struct cgroup_path *p = cgroup_path_scratch.lookup(&zero);
    if (!p)
        return;
    void *task = (void *)bpf_get_current_task();
    void *set = 0, *cgrp = 0, *kn = 0, *name = 0;
    bpf_probe_read_kernel(&set, sizeof(set), task + LENS_TASK_CGROUPS_OFF);
    if (!set)
        return;
    bpf_probe_read_kernel(&cgrp, sizeof(cgrp), set + LENS_CSS_SET_DFL_CGRP_OFF);
    if (!cgrp)
        return;
    bpf_probe_read_kernel(&kn, sizeof(kn), cgrp + LENS_CGROUP_KN_OFF);
    p->name_len = CGROUP_NAME_LEN;
    p->levels = 0;
#pragma unroll
    for (int i = 0; i < CGROUP_PATH_DEPTH; i++) {
        if (kn) {
            name = 0;
            bpf_probe_read_kernel(&name, sizeof(name), kn + LENS_KERNFS_NAME_OFF);
            p->names[i * CGROUP_NAME_LEN] = 0;
            if (name)
                bpf_probe_read_kernel_str(&p->names[i * CGROUP_NAME_LEN], CGROUP_NAME_LEN,
                                          name);
            p->levels = i + 1;
            bpf_probe_read_kernel(&kn, sizeof(kn), kn + LENS_KERNFS_PARENT_OFF);
        }
    }
    p->complete = kn == 0;
    cgroup_paths.update(&cgroup, p);
}
#endif

/* current: the record is of the task running now (an exec, an exit), whose cgroup's path
 * can be read; an OOM kill's runs in the killer's context */
static __always_inline void submit(struct proc_event *e, int current)
{
    u32 idx = PS_EVENTS;
    u64 *n = pstats.lookup(&idx);
    u64 seq = n ? ++*n : 0;
    u64 cgroup = e->cgroup_id;
    u64 wake = seq % WAKEUP_EVERY ? BPF_RB_NO_WAKEUP : BPF_RB_FORCE_WAKEUP;
    if (!known_cgroups.lookup(&cgroup)) {
        e->flags |= REC_NEW_CGROUP;
        wake = BPF_RB_FORCE_WAKEUP;
#ifdef LENS_CGROUP_PATHS
        if (current)
            remember_path(cgroup);
#endif
    }
    proc_events.ringbuf_submit(e, wake);
}

TRACEPOINT_PROBE(sched, sched_process_fork)
{
    u32 child = args->child_pid;
    struct proc_state ps = {.exit_code = -1};
    ps.ppid = bpf_get_current_pid_tgid() >> 32;
    ps.cgroup_id = bpf_get_current_cgroup_id();
    procs.update(&child, &ps);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exec)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    u64 cgroup = bpf_get_current_cgroup_id();
    struct proc_state *ps = state_of(tgid);
    if (ps)
        ps->cgroup_id = cgroup;
    struct proc_event *e = reserve(EV_EXEC, tgid, ps ? ps->ppid : 0);
    if (!e)
        return 0;
    e->cgroup_id = cgroup;
    e->ppid = ps ? ps->ppid : 0;
    bpf_get_current_comm(&e->comm, sizeof(e->comm));
    unsigned short off = args->data_loc_filename & 0xFFFF;
    bpf_probe_read_kernel_str(e->filename, sizeof(e->filename), (void *)args + off);
    submit(e, 1);
    return 0;
}

static __always_inline void exit_called(long code)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct proc_state *ps = state_of(tgid);
    if (!ps)
        return;
    /* Asking to exit after a signal means the signal did not kill it (an init
     * ignores what it has no handler for): the exit code is what counts. */
    ps->exit_code = code & 0xff;
    ps->flags |= PF_EXIT_CALLED;
    ps->flags &= ~PF_SIGNALED;
}

#ifdef LENS_EXIT_CODES
TRACEPOINT_PROBE(syscalls, sys_enter_exit_group)
{
    exit_called(args->error_code);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_exit)
{
    exit_called(args->error_code);
    return 0;
}

#endif

#ifdef LENS_SIGNALS
/* Signals that end a process when taken with the default action. */
static __always_inline int fatal_by_default(int sig)
{
    switch (sig) {
    case 17: /* SIGCHLD */
    case 18: /* SIGCONT */
    case 19: /* SIGSTOP */
    case 20: /* SIGTSTP */
    case 21: /* SIGTTIN */
    case 22: /* SIGTTOU */
    case 23: /* SIGURG */
    case 28: /* SIGWINCH */
        return 0;
    }
    return sig > 0 && sig < 32;
}

TRACEPOINT_PROBE(signal, signal_deliver)
{
    int sig = args->sig;
    if (args->sa_handler != SIG_DFL_HANDLER || !fatal_by_default(sig))
        return 0;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    struct proc_state *ps = state_of(tgid);
    /* Once exit_group has begun, a later SIGKILL (a namespace's init exiting kills
     * what is left, itself included) does not change the exit code; and the first fatal
     * signal is the one wait() reports: the group exit it starts delivers SIGKILL to the
     * process's threads, the first one included, and this tracepoint sees that too. */
    if (ps && !(ps->flags & (PF_EXIT_CALLED | PF_SIGNALED))) {
        ps->signal = sig;
        ps->flags |= PF_SIGNALED;
    }
    return 0;
}

#endif

#ifdef LENS_OOM
TRACEPOINT_PROBE(oom, mark_victim)
{
    u32 pid = args->pid; /* the victim; this runs in the OOM killer's context */
    struct proc_state *ps = state_of(pid);
    if (ps)
        ps->flags |= PF_OOM_VICTIM;
    struct proc_event *e = reserve(EV_OOM, pid, ps ? ps->ppid : 0);
    if (!e)
        return 0;
    if (ps) {
        e->cgroup_id = ps->cgroup_id;
        e->ppid = ps->ppid;
    }
    e->flags = PF_OOM_VICTIM;
#ifdef LENS_TP_OOM_COMM
    unsigned short off = args->data_loc_comm & 0xFFFF;
    bpf_probe_read_kernel_str(e->comm, sizeof(e->comm), (void *)args + off);
#else
    e->comm[0] = 0; /* user space names it from the exec it saw, when it can */
#endif
    submit(e, 0);
    return 0;
}
#endif

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
#ifdef LENS_TP_EXIT_GROUP_DEAD
    if (!args->group_dead)
        return 0; /* one thread of several: the process lives on */
#else
    if ((u32)id != tgid)
        return 0; /* not the thread-group leader: the process lives on */
#endif
    struct proc_state *ps = procs.lookup(&tgid);
    struct proc_event *e = reserve(EV_EXIT, tgid, ps ? ps->ppid : 0);
    if (e) {
        e->cgroup_id = bpf_get_current_cgroup_id();
        bpf_get_current_comm(&e->comm, sizeof(e->comm));
        if (ps) {
            e->ppid = ps->ppid;
            e->flags = ps->flags;
#ifndef LENS_EXIT_CODE_BTF
            /* the first cause of the exit sticks, as the kernel's group_exit_code does */
            if (ps->flags & PF_EXIT_CALLED)
                e->exit_code = ps->exit_code;
            else if (ps->flags & PF_SIGNALED)
                e->signal = ps->signal;
#endif
        }
#ifdef LENS_EXIT_CODE_BTF
        /* do_exit() stored it before this tracepoint: (code << 8) for exit() and
         * exit_group() (every thread of a group exit gets the group's), the signal's
         * number (| 0x80 with a core dump) for a fatal signal: wait()'s status */
        int code = 0;
        bpf_probe_read_kernel(&code, sizeof(code),
                              (void *)bpf_get_current_task() + LENS_TASK_EXIT_CODE_OFF);
        e->flags &= ~(PF_EXIT_CALLED | PF_SIGNALED);
        if (code & 0x7f) {
            e->signal = code & 0x7f;
            e->flags |= PF_SIGNALED;
        } else {
            e->exit_code = (code >> 8) & 0xff;
            e->flags |= PF_EXIT_CALLED;
        }
#endif
        submit(e, 1);
    }
    procs.delete(&tgid);
    return 0;
}
