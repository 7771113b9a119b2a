/* proc_events.h: the record proc_events.c shares with user space. Mirrored once in
 * lens_ebpf/agent/bpf/layouts.py, checked field by field (names, offsets, sizes) at load. */
#ifndef LENS_PROC_EVENTS_H
#define LENS_PROC_EVENTS_H

#include "lens_common.h"

#define FILENAME_LEN 256

struct proc_event {
    u64 ts_ns;
    u64 cgroup_id;
    u32 kind;
    u32 pid;
    u32 ppid;
    s32 exit_code; /* -1: unknown */
    s32 signal;    /* the fatal signal, or 0 */
    u32 flags;
    char comm[16];
    char filename[FILENAME_LEN];
};

#endif
