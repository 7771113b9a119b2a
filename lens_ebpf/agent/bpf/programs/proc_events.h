/* proc_events.h: the record proc_events.c shares with user space, its kinds and flags, in
 * the kernel's fixed-width types: the one source of its layout. The compiled event path
 * includes it (lens_ebpf/agent/native/_native.c); lens_ebpf/agent/bpf/layouts.py mirrors
 * it and lens_ebpf/agent/processes/proc_events.py its numbers, checked against this
 * header by tests/unit/test_layouts.py, and the layout field by field (names, offsets,
 * sizes) against BCC's at load. */
#ifndef LENS_PROC_EVENTS_H
#define LENS_PROC_EVENTS_H

#include <linux/types.h>

#define FILENAME_LEN 256

/* struct proc_event's kind */
#define EV_EXEC 1
#define EV_EXIT 2
#define EV_OOM 3

/* struct proc_event's flags: the process's (proc_state.flags) and the record's own */
#define PF_EXIT_CALLED 1
#define PF_SIGNALED 2
#define PF_OOM_VICTIM 4
#define REC_NEW_CGROUP 8 /* its cgroup is not in known_cgroups */

struct proc_event {
    __u64 ts_ns;
    __u64 cgroup_id;
    __u32 kind;
    __u32 pid;
    __u32 ppid;
    __s32 exit_code; /* -1: unknown */
    __s32 signal;    /* the fatal signal, or 0 */
    __u32 flags;
    char comm[16];
    char filename[FILENAME_LEN];
};

#endif
