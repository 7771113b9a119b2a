/* pb_fields.h: the lens.v1 field numbers _native.c writes (protos/lens/v1/lens.proto), one
 * name each: PB_<MESSAGE>_<FIELD>, the message's and the field's names in capitals.
 * tests/unit/test_native.py checks every one against the generated lens_pb2 descriptor,
 * and that _native.c writes no field by a bare number. */
#ifndef LENS_PB_FIELDS_H
#define LENS_PB_FIELDS_H

/* Event: the envelope, and the payloads the compiled path makes (its oneof) */
#define PB_EVENT_SEQ 1
#define PB_EVENT_TS_UNIX_NANO 2
#define PB_EVENT_FLOW_CLOSED 10
#define PB_EVENT_PROCESS_EXEC 11
#define PB_EVENT_PROCESS_EXIT 12
#define PB_EVENT_OOM_KILL 13
#define PB_EVENT_ABNORMAL_FLOW 16

/* FlowClosed; enrichment's fields follow class in number order, from remote_namespace to
 * workload (_native.c's extra_keys: the test checks the run) */
#define PB_FLOW_CLOSED_PID 1
#define PB_FLOW_CLOSED_COMM 2
#define PB_FLOW_CLOSED_CGROUP_ID 3
#define PB_FLOW_CLOSED_LADDR 4
#define PB_FLOW_CLOSED_LPORT 5
#define PB_FLOW_CLOSED_RADDR 6
#define PB_FLOW_CLOSED_RPORT 7
#define PB_FLOW_CLOSED_DIRECTION 8
#define PB_FLOW_CLOSED_CLASS 9
#define PB_FLOW_CLOSED_SENT_BYTES 10
#define PB_FLOW_CLOSED_RECEIVED_BYTES 11
#define PB_FLOW_CLOSED_RETRANSMITS 12
#define PB_FLOW_CLOSED_DURATION_NS 13
#define PB_FLOW_CLOSED_REASON 14
#define PB_FLOW_CLOSED_REMOTE_NAMESPACE 15

/* ProcessExec */
#define PB_PROCESS_EXEC_PID 1
#define PB_PROCESS_EXEC_PPID 2
#define PB_PROCESS_EXEC_COMM 3
#define PB_PROCESS_EXEC_FILENAME 4
#define PB_PROCESS_EXEC_CGROUP_ID 5
#define PB_PROCESS_EXEC_IDENTITY 6

/* ProcessExit */
#define PB_PROCESS_EXIT_PID 1
#define PB_PROCESS_EXIT_PPID 2
#define PB_PROCESS_EXIT_COMM 3
#define PB_PROCESS_EXIT_EXIT_CODE 4
#define PB_PROCESS_EXIT_SIGNAL 5
#define PB_PROCESS_EXIT_OOM_KILLED 6
#define PB_PROCESS_EXIT_IDENTITY 7

/* OomKill */
#define PB_OOM_KILL_PID 1
#define PB_OOM_KILL_COMM 2
#define PB_OOM_KILL_IDENTITY 3

/* Identity: its fields in number order from container_id to workload (_native.c's
 * identity_keys: the test checks the run) */
#define PB_IDENTITY_CONTAINER_ID 1

#endif
