/* The compiled event path (lens_ebpf/agent/native/__init__.py says why and how it is
 * built): ring records straight to the serialized lens.v1 Event each subscriber and the
 * reporter send, with no Python event made on the way.
 *
 * Packed: one published event as the bus holds it: its kind, seq, wall time, its wire
 * bytes, the ring record it came from (inline) and what enrichment added. Its Python
 * event is made only when a consumer asks for it (event(): the materializer registered
 * for its kind, from the record).
 *
 * flows() (closed flows) and procs() (exec, exit, OOM kill): a batch of records,
 * numbered from seq0, each encoded as protobuf writes a pb.Event (fields in number
 * order, zero values left out, a nested Identity always): the bytes the Python path
 * (stream/convert.encode) makes; tests/unit/test_native.py compares them record by
 * record.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <arpa/inet.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <linux/types.h>

/* The records, from the programs' own headers (bpf/programs/, on the include path
 * native/__init__.py's build gives): struct flow_event (tcp_flows.h), struct proc_event
 * and its kinds and flags (proc_events.h). layouts.FlowEvent and layouts.ProcEvent mirror
 * them; flow_event_layout() and proc_event_layout() are checked against those mirrors at
 * import (native.layout_differs) and by the tests. */
#include "tcp_flows.h"
#include "proc_events.h"
/* the lens.v1 field numbers written below, by name */
#include "pb_fields.h"

#define AF_INET_ 2
#ifndef SOURCE_HASH
#define SOURCE_HASH ""
#endif

/* names the flow record's small numbers stand for, set once by configure_flows() */
typedef struct {
    const char *p;
    Py_ssize_t n;
} text;

static PyObject *names_holder; /* keeps the configured strings alive */
static text class_names[256], direction_names[256], reason_names[256];
static PyObject *class_strs[256]; /* the same as str, for enrichment's calls */
static int configured;

static PyObject *materializers; /* kind -> function(Packed) -> its Python event */
static PyObject *kind_flow, *kind_abnormal, *kind_exec, *kind_exit, *kind_oom;

/* enrichment's fields after class, in the payload's number order (from
 * PB_FLOW_CLOSED_REMOTE_NAMESPACE on) */
static const char *const extra_keys[] = {
    "remote_namespace", "remote_pod", "remote_workload_kind", "remote_workload",
    "remote_service", "namespace", "pod", "workload_kind", "workload",
};
#define N_EXTRA 9
static PyObject *extra_key_strs[N_EXTRA];
static PyObject *cls_key;

/* ---------------------------------------------------------------- Packed */

typedef struct {
    PyObject_VAR_HEAD /* ob_size: the record's length */
    PyObject *kind;   /* str */
    PyObject *wire;   /* bytes: the serialized pb.Event */
    PyObject *extra;  /* what enrichment added (flows: a dict or None; procs: a tuple) */
    long long seq;
    long long ts;
    char rec[1];      /* the ring record, ob_size bytes */
} Packed;

static void packed_dealloc(Packed *self) {
    Py_XDECREF(self->kind);
    Py_XDECREF(self->wire);
    Py_XDECREF(self->extra);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *packed_event(Packed *self, PyObject *Py_UNUSED(ignored)) {
    PyObject *make = materializers ? PyDict_GetItemWithError(materializers, self->kind) : NULL;
    if (make == NULL) {
        if (!PyErr_Occurred())
            PyErr_Format(PyExc_RuntimeError, "no materializer for %R", self->kind);
        return NULL;
    }
    Py_INCREF(make); /* the dict's may go while it runs */
    PyObject *ev = PyObject_CallOneArg(make, (PyObject *)self);
    Py_DECREF(make);
    return ev;
}

/* get(name, default=None): the event's field by its wire name, as Event.get answers;
 * the kind at once, anything else from the Python event */
static PyObject *packed_get(Packed *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "get(name, default=None)");
        return NULL;
    }
    if (PyUnicode_Check(args[0]) && PyUnicode_CompareWithASCIIString(args[0], "kind") == 0)
        return Py_NewRef(self->kind);
    PyObject *ev = packed_event(self, NULL);
    if (ev == NULL)
        return NULL;
    PyObject *out = PyObject_CallMethod(ev, "get", "OO", args[0], nargs > 1 ? args[1] : Py_None);
    Py_DECREF(ev);
    return out;
}

static PyObject *packed_record(Packed *self, void *Py_UNUSED(closure)) {
    return PyBytes_FromStringAndSize(self->rec, Py_SIZE(self));
}

static PyObject *packed_repr(Packed *self) {
    return PyUnicode_FromFormat("Packed(kind=%R, seq=%lld, %zd wire bytes)", self->kind,
                                self->seq, PyBytes_GET_SIZE(self->wire));
}

static PyMemberDef packed_members[] = {
    {"kind", T_OBJECT_EX, offsetof(Packed, kind), READONLY, "the event's kind"},
    {"_wire", T_OBJECT_EX, offsetof(Packed, wire), READONLY, "its serialized pb.Event"},
    {"extra", T_OBJECT_EX, offsetof(Packed, extra), READONLY, "enrichment's fields, or None"},
    {"seq", T_LONGLONG, offsetof(Packed, seq), READONLY, "the bus's sequence number"},
    {"ts_unix_nano", T_LONGLONG, offsetof(Packed, ts), READONLY, "published at (wall)"},
    {NULL},
};

static PyGetSetDef packed_getset[] = {
    {"record", (getter)packed_record, NULL, "the ring record's bytes", NULL},
    {NULL},
};

static PyMethodDef packed_methods[] = {
    {"event", (PyCFunction)packed_event, METH_NOARGS, "the event as the Python path has it"},
    {"get", (PyCFunction)(void (*)(void))packed_get, METH_FASTCALL, "a field by its wire name"},
    {NULL},
};

static PyTypeObject PackedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lens_ebpf.agent.native._native.Packed",
    .tp_basicsize = offsetof(Packed, rec),
    .tp_itemsize = 1,
    .tp_dealloc = (destructor)packed_dealloc,
    .tp_repr = (reprfunc)packed_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A published event held as its wire bytes and ring record.",
    .tp_members = packed_members,
    .tp_getset = packed_getset,
    .tp_methods = packed_methods,
};

/* ---------------------------------------------------------------- encoding */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} buf;

static int reserve(buf *b, size_t more) {
    if (b->n + more <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 512;
    while (cap < b->n + more)
        cap *= 2;
    uint8_t *p = PyMem_Realloc(b->p, cap);
    if (p == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline size_t varint_to(uint8_t *out, uint64_t v) {
    size_t i = 0;
    while (v >= 0x80) {
        out[i++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    out[i++] = (uint8_t)v;
    return i;
}

/* callers reserve room first: a field is at most its tag (2), a varint (10) and data */
static inline void put_varint(buf *b, uint64_t v) { b->n += varint_to(b->p + b->n, v); }

static inline void put_uint(buf *b, uint32_t field, uint64_t v) {
    if (v == 0)
        return;
    put_varint(b, (uint64_t)field << 3);
    put_varint(b, v);
}

static inline int put_str(buf *b, uint32_t field, const char *s, Py_ssize_t n) {
    if (n <= 0)
        return 0;
    if (reserve(b, (size_t)n + 12) < 0)
        return -1;
    put_varint(b, ((uint64_t)field << 3) | 2);
    put_varint(b, (uint64_t)n);
    memcpy(b->p + b->n, s, (size_t)n);
    b->n += (size_t)n;
    return 0;
}

static int put_pystr(buf *b, uint32_t field, PyObject *s) {
    if (s == NULL || s == Py_None)
        return 0;
    Py_ssize_t n;
    const char *p = PyUnicode_AsUTF8AndSize(s, &n);
    if (p == NULL)
        return -1;
    return put_str(b, field, p, n);
}

/* a number's decimal text, for the small numbers no name stands for (str(n) in Python) */
static text number_text(char *scratch, unsigned v) {
    int n = snprintf(scratch, 8, "%u", v);
    return (text){scratch, n};
}

/* an address's text as tcp/decode.py's format_addr spells it: an IPv4 peer of a
 * dual-stack IPv6 socket (::ffff:a.b.c.d) as a.b.c.d, as on an IPv4 socket */
static Py_ssize_t addr_text(char *out, const struct flow_event *r, const uint8_t *addr16) {
    static const uint8_t v4_mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    int v4 = r->family == AF_INET_ || memcmp(addr16, v4_mapped, sizeof v4_mapped) == 0;
    const char *got = v4 ? inet_ntop(AF_INET, addr16 + 12, out, INET6_ADDRSTRLEN)
                         : inet_ntop(AF_INET6, addr16, out, INET6_ADDRSTRLEN);
    return got ? (Py_ssize_t)strlen(out) : 0;
}

/* a char array's text up to its NUL as UTF-8 (decode(errors="replace") where it is not);
 * owner: None, or the str whose UTF-8 *p points into */
static PyObject *c_text(const char *raw, size_t size, const char **p, Py_ssize_t *n) {
    size_t len = strnlen(raw, size);
    int ascii = 1;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)raw[i] >= 0x80)
            ascii = 0;
    if (ascii) {
        *p = raw;
        *n = (Py_ssize_t)len;
        return Py_NewRef(Py_None);
    }
    PyObject *s = PyUnicode_DecodeUTF8(raw, (Py_ssize_t)len, "replace");
    if (s == NULL)
        return NULL;
    *p = PyUnicode_AsUTF8AndSize(s, n);
    if (*p == NULL) {
        Py_DECREF(s);
        return NULL;
    }
    return s;
}

/* the FlowClosed payload's bytes into b (emptied first) */
static int flow_payload(buf *b, const struct flow_event *r, const char *laddr, Py_ssize_t llen,
                        const char *raddr, Py_ssize_t rlen, PyObject *extra) {
    char dscratch[8], rscratch[8];
    const char *comm;
    Py_ssize_t comm_n;
    b->n = 0;
    if (reserve(b, 256) < 0)
        return -1;
    PyObject *comm_owner = c_text(r->comm, sizeof r->comm, &comm, &comm_n);
    if (comm_owner == NULL)
        return -1;
    put_uint(b, PB_FLOW_CLOSED_PID, r->pid);
    int rc = put_str(b, PB_FLOW_CLOSED_COMM, comm, comm_n);
    Py_DECREF(comm_owner);
    if (rc < 0 || reserve(b, 24) < 0)
        return -1;
    put_uint(b, PB_FLOW_CLOSED_CGROUP_ID, r->cgroup_id);
    if (put_str(b, PB_FLOW_CLOSED_LADDR, laddr, llen) < 0 || reserve(b, 12) < 0)
        return -1;
    put_uint(b, PB_FLOW_CLOSED_LPORT, r->lport);
    if (put_str(b, PB_FLOW_CLOSED_RADDR, raddr, rlen) < 0 || reserve(b, 12) < 0)
        return -1;
    put_uint(b, PB_FLOW_CLOSED_RPORT, r->rport);
    text d = direction_names[r->direction].p ? direction_names[r->direction]
                                             : number_text(dscratch, r->direction);
    if (put_str(b, PB_FLOW_CLOSED_DIRECTION, d.p, d.n) < 0)
        return -1;
    PyObject *cls = extra != Py_None ? PyDict_GetItemWithError(extra, cls_key) : NULL;
    if (cls != NULL) {
        if (put_pystr(b, PB_FLOW_CLOSED_CLASS, cls) < 0)
            return -1;
    } else if (PyErr_Occurred()) {
        return -1;
    } else if (put_str(b, PB_FLOW_CLOSED_CLASS, class_names[r->cls].p,
                       class_names[r->cls].n) < 0) {
        return -1;
    }
    if (reserve(b, 48) < 0)
        return -1;
    put_uint(b, PB_FLOW_CLOSED_SENT_BYTES, r->sent);
    put_uint(b, PB_FLOW_CLOSED_RECEIVED_BYTES, r->recv);
    put_uint(b, PB_FLOW_CLOSED_RETRANSMITS, r->retrans);
    put_uint(b, PB_FLOW_CLOSED_DURATION_NS, r->duration_ns);
    text why = reason_names[r->reason].p ? reason_names[r->reason]
                                         : number_text(rscratch, r->reason);
    if (put_str(b, PB_FLOW_CLOSED_REASON, why.p, why.n) < 0)
        return -1;
    if (extra != Py_None) {
        for (int i = 0; i < N_EXTRA; i++) {
            PyObject *v = PyDict_GetItemWithError(extra, extra_key_strs[i]);
            if (v == NULL && PyErr_Occurred())
                return -1;
            if (v != NULL && !PyUnicode_Check(v) && v != Py_None) {
                PyErr_Format(PyExc_TypeError, "enrichment's %s is %.50s, not str",
                             extra_keys[i], Py_TYPE(v)->tp_name);
                return -1;
            }
            if (put_pystr(b, PB_FLOW_CLOSED_REMOTE_NAMESPACE + i, v) < 0)
                return -1;
        }
    }
    return 0;
}

/* one Packed: the Event's seq, wall time, node fields (head), then the payload as its
 * oneof field (tag: PB_EVENT_FLOW_CLOSED, PB_EVENT_PROCESS_EXEC, ...) */
static Packed *pack(PyObject *kind, uint32_t tag, long long seq, long long ts,
                    const char *head, Py_ssize_t head_n, const buf *payload,
                    const void *rec, Py_ssize_t rec_n, PyObject *extra) {
    uint8_t front[32];
    size_t fn = 0;
    if (seq) {
        front[fn++] = PB_EVENT_SEQ << 3;
        fn += varint_to(front + fn, (uint64_t)seq);
    }
    if (ts) {
        front[fn++] = PB_EVENT_TS_UNIX_NANO << 3;
        fn += varint_to(front + fn, (uint64_t)ts);
    }
    uint8_t mid[16];
    size_t mn = varint_to(mid, ((uint64_t)tag << 3) | 2);
    mn += varint_to(mid + mn, payload->n);
    Py_ssize_t total = (Py_ssize_t)(fn + (size_t)head_n + mn + payload->n);
    PyObject *wire = PyBytes_FromStringAndSize(NULL, total);
    if (wire == NULL)
        return NULL;
    char *w = PyBytes_AS_STRING(wire);
    memcpy(w, front, fn);
    memcpy(w + fn, head, (size_t)head_n);
    memcpy(w + fn + head_n, mid, mn);
    memcpy(w + fn + head_n + mn, payload->p, payload->n);
    Packed *p = PyObject_NewVar(Packed, &PackedType, rec_n);
    if (p == NULL) {
        Py_DECREF(wire);
        return NULL;
    }
    p->kind = Py_NewRef(kind);
    p->wire = wire;
    p->extra = Py_NewRef(extra);
    p->seq = seq;
    p->ts = ts;
    memcpy(p->rec, rec, (size_t)rec_n);
    return p;
}

/* ---------------------------------------------------------------- record batches */

/* A batch of records: a sequence of bytes-likes (one record each), or one bytes object of
 * records of one size back to back (what ring_take returns). */
typedef struct {
    PyObject *seqf; /* the sequence's items, or NULL for a blob */
    const char *blob;
    Py_ssize_t count, size;
} records_t;

static int records_open(records_t *r, PyObject *obj, Py_ssize_t size) {
    r->size = size;
    if (PyBytes_Check(obj)) {
        r->seqf = NULL;
        r->blob = PyBytes_AS_STRING(obj);
        if (PyBytes_GET_SIZE(obj) % size) {
            PyErr_Format(PyExc_ValueError, "a batch of %zd bytes is not whole %zd-byte records",
                         PyBytes_GET_SIZE(obj), size);
            return -1;
        }
        r->count = PyBytes_GET_SIZE(obj) / size;
        return 0;
    }
    /* a tuple of its own: enrich and abnormal run Python, which could change a list */
    r->seqf = PySequence_Tuple(obj);
    if (r->seqf == NULL)
        return -1;
    r->count = PyTuple_GET_SIZE(r->seqf);
    return 0;
}

static void records_close(records_t *r) { Py_CLEAR(r->seqf); }

/* record i into out (size bytes); -1 with ValueError when it is shorter. what: its name */
static int records_get(records_t *r, Py_ssize_t i, void *out, const char *what) {
    if (r->seqf == NULL) {
        memcpy(out, r->blob + i * r->size, (size_t)r->size);
        return 0;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(PyTuple_GET_ITEM(r->seqf, i), &view, PyBUF_SIMPLE) < 0)
        return -1;
    int rc = 0;
    if (view.len < r->size) {
        PyErr_Format(PyExc_ValueError, "%s record of %zd bytes, %zd expected", what, view.len,
                     r->size);
        rc = -1;
    } else {
        memcpy(out, view.buf, (size_t)r->size);
    }
    PyBuffer_Release(&view);
    return rc;
}

/* p into out, the list's reference in place of the caller's */
static int append(PyObject *out, Packed *p) {
    int rc = PyList_Append(out, (PyObject *)p);
    Py_DECREF(p);
    return rc;
}

/* A record failed: the exception raised for it kept if it is the batch's first (with its
 * traceback), else cleared */
static void keep_first_error(PyObject **first) {
    if (*first != NULL) {
        PyErr_Clear();
        return;
    }
    PyObject *type, *tb;
    PyErr_Fetch(&type, first, &tb);
    PyErr_NormalizeException(&type, first, &tb);
    if (*first != NULL && tb != NULL)
        PyException_SetTraceback(*first, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
}

/* ring_take(consumer, producer, mask, page, size) -> (records, other): every record
 * committed now in a BPF ring buffer's mapping (ringbuf.MappedRing's: the consumer page,
 * the producer page and the data area mapped twice), those of size bytes back to back
 * in one bytes object, oldest first, and how many of another size were passed over. Their
 * space goes back to the kernel (the consumer position, one release store) before they
 * are returned. The positions and headers are read with acquire loads: the kernel writes
 * a record's data before it clears its BUSY bit. */
#define RB_BUSY (1U << 31)
#define RB_DISCARD (1U << 30)
#define RB_HEADER 8
static PyObject *ring_take(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *consumer, *producer;
    unsigned long long mask;
    Py_ssize_t page, size;
    if (!PyArg_ParseTuple(args, "OOKnn", &consumer, &producer, &mask, &page, &size))
        return NULL;
    Py_buffer cv, pv;
    if (PyObject_GetBuffer(consumer, &cv, PyBUF_WRITABLE) < 0)
        return NULL;
    if (PyObject_GetBuffer(producer, &pv, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&cv);
        return NULL;
    }
    PyObject *out = NULL;
    if (cv.len < 8 || size <= 0 || page < 8 || page % 8 || (mask + 1) & mask ||
        pv.len < page + 2 * (Py_ssize_t)(mask + 1) || (uintptr_t)cv.buf % 8 ||
        (uintptr_t)pv.buf % 8) {
        PyErr_SetString(PyExc_ValueError, "not a ring buffer's mapping");
        goto done;
    }
    uint64_t *cons_at = (uint64_t *)cv.buf;
    const uint64_t *prod_at = (const uint64_t *)pv.buf;
    const char *data = (const char *)pv.buf + page;
    uint64_t start = __atomic_load_n(cons_at, __ATOMIC_RELAXED);
    uint64_t prod = __atomic_load_n(prod_at, __ATOMIC_ACQUIRE);
    /* first the headers: how far, and how many of the size */
    Py_ssize_t whole = 0, other = 0;
    uint64_t cons = start;
    while (cons < prod) {
        uint32_t hdr = __atomic_load_n((const uint32_t *)(data + (cons & mask)), __ATOMIC_ACQUIRE);
        if (hdr & RB_BUSY)
            break;
        uint32_t len = hdr & ~(RB_BUSY | RB_DISCARD);
        if (!(hdr & RB_DISCARD)) {
            if ((Py_ssize_t)len == size)
                whole++;
            else
                other++;
        }
        cons += (len + RB_HEADER + 7) & ~7ULL;
    }
    uint64_t end = cons;
    out = PyBytes_FromStringAndSize(NULL, whole * size);
    if (out == NULL)
        goto done;
    char *w = PyBytes_AS_STRING(out);
    for (cons = start; cons < end;) {
        uint32_t hdr = *(const uint32_t *)(data + (cons & mask));
        uint32_t len = hdr & ~(RB_BUSY | RB_DISCARD);
        if (!(hdr & RB_DISCARD) && (Py_ssize_t)len == size) {
            memcpy(w, data + (cons & mask) + RB_HEADER, (size_t)size);
            w += size;
        }
        cons += (len + RB_HEADER + 7) & ~7ULL;
    }
    /* the result made before the space goes back: a failure leaves the records there */
    out = Py_BuildValue("(Nn)", out, other); /* N: the tuple takes the bytes over */
    if (out != NULL && end != start)
        __atomic_store_n(cons_at, end, __ATOMIC_RELEASE);
done:
    PyBuffer_Release(&pv);
    PyBuffer_Release(&cv);
    return out;
}

/* flows(records, seq0, ts, head, enrich, abnormal) -> (list of Packed, bad, first error)
 *
 * records: ring records (bytes-like), each a struct flow_event. seq0: the first one's
 * number (each event the next). ts: their wall time. head: the serialized node_name and
 * node_ip fields. enrich: None, or enrich(class, raddr, laddr) -> dict of FlowClosed
 * fields (identity.flow_fields). abnormal: None, or abnormal(raddr) -> bool: an
 * abnormal_flow event after its flow_closed. A record that is short, or whose enrich or
 * abnormal call raises, is counted in bad (its events, or the abnormal one, not made);
 * the first such exception is returned. */
static PyObject *flows(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *records, *enrich, *abnormal;
    long long seq, ts;
    const char *head;
    Py_ssize_t head_n;
    if (!PyArg_ParseTuple(args, "OLLy#OO", &records, &seq, &ts, &head, &head_n, &enrich,
                          &abnormal))
        return NULL;
    if (!configured) {
        PyErr_SetString(PyExc_RuntimeError, "configure_flows() first");
        return NULL;
    }
    /* the name tables point into these strings: kept while enrich and abnormal run */
    PyObject *names = Py_NewRef(names_holder);
    records_t recs;
    if (records_open(&recs, records, sizeof(struct flow_event)) < 0) {
        Py_DECREF(names);
        return NULL;
    }
    Py_ssize_t count = recs.count;
    PyObject *out = PyList_New(0);
    PyObject *first_error = NULL;
    long long bad = 0;
    buf b = {0};
    if (out == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < count; i++) {
        struct flow_event r;
        if (records_get(&recs, i, &r, "flow") < 0)
            goto record_failed;

        char laddr[INET6_ADDRSTRLEN], raddr[INET6_ADDRSTRLEN];
        Py_ssize_t llen = addr_text(laddr, &r, r.laddr), rlen = addr_text(raddr, &r, r.raddr);
        PyObject *extra = Py_NewRef(Py_None);
        PyObject *raddr_s = NULL;
        if (enrich != Py_None || abnormal != Py_None) {
            raddr_s = PyUnicode_FromStringAndSize(raddr, rlen);
            if (raddr_s == NULL) {
                Py_DECREF(extra);
                goto record_failed;
            }
        }
        if (enrich != Py_None) {
            PyObject *laddr_s = PyUnicode_FromStringAndSize(laddr, llen);
            PyObject *got = laddr_s ? PyObject_CallFunctionObjArgs(enrich, class_strs[r.cls],
                                                                   raddr_s, laddr_s, NULL)
                                    : NULL;
            Py_XDECREF(laddr_s);
            if (got != NULL && !PyDict_Check(got)) {
                PyErr_Format(PyExc_TypeError, "enrich returned %.50s, not dict",
                             Py_TYPE(got)->tp_name);
                Py_CLEAR(got);
            }
            if (got == NULL) {
                Py_DECREF(extra);
                Py_DECREF(raddr_s);
                goto record_failed;
            }
            Py_SETREF(extra, got);
        }
        /* failed: this record's events (or its abnormal one) not made; fatal: the list */
        int failed = 0, fatal = 0;
        Packed *p = NULL;
        if (flow_payload(&b, &r, laddr, llen, raddr, rlen, extra) < 0 ||
            (p = pack(kind_flow, PB_EVENT_FLOW_CLOSED, seq, ts, head, head_n, &b, &r,
                      sizeof r, extra)) == NULL) {
            failed = 1;
        } else if (append(out, p) < 0) {
            fatal = 1;
        } else {
            seq++;
            if (abnormal != Py_None) {
                PyObject *got = PyObject_CallOneArg(abnormal, raddr_s);
                int yes = got ? PyObject_IsTrue(got) : -1;
                Py_XDECREF(got);
                if (yes < 0 || (yes && (p = pack(kind_abnormal, PB_EVENT_ABNORMAL_FLOW, seq, ts,
                                                 head, head_n, &b, &r, sizeof r, extra)) == NULL))
                    failed = 1;
                else if (yes && append(out, p) < 0)
                    fatal = 1;
                else if (yes)
                    seq++;
            }
        }
        Py_DECREF(extra);
        Py_XDECREF(raddr_s);
        if (fatal)
            goto fail;
        if (failed)
            goto record_failed;
        continue;
    record_failed:
        bad++;
        keep_first_error(&first_error);
    }
    PyMem_Free(b.p);
    records_close(&recs);
    Py_DECREF(names);
    PyObject *result = Py_BuildValue("(NLO)", out, bad, first_error ? first_error : Py_None);
    Py_XDECREF(first_error);
    return result;
fail:
    PyMem_Free(b.p);
    records_close(&recs);
    Py_DECREF(names);
    Py_XDECREF(out);
    Py_XDECREF(first_error);
    return NULL;
}

/* configure_flows(classes, directions, reasons): the names of a flow record's numbers
 * (decode.py's: every class number's, the directions and reasons that have one) */
static int fill(text *table, PyObject *strs[], PyObject *holder, PyObject *seq) {
    PyObject *f = PySequence_Fast(seq, "a sequence of names");
    if (f == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(f);
    for (Py_ssize_t i = 0; i < n && i < 256; i++) {
        PyObject *s = PySequence_Fast_GET_ITEM(f, i);
        if (!PyUnicode_Check(s)) {
            Py_DECREF(f);
            PyErr_SetString(PyExc_TypeError, "names must be str");
            return -1;
        }
        table[i].p = PyUnicode_AsUTF8AndSize(s, &table[i].n);
        if (table[i].p == NULL || PyList_Append(holder, s) < 0) {
            Py_DECREF(f);
            return -1;
        }
        if (strs)
            strs[i] = s;
    }
    Py_DECREF(f);
    return 0;
}

static PyObject *configure_flows(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *classes, *directions, *reasons;
    if (!PyArg_ParseTuple(args, "OOO", &classes, &directions, &reasons))
        return NULL;
    if (PySequence_Size(classes) != 256) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "classes: the names of all 256 class numbers");
        return NULL;
    }
    PyObject *holder = PyList_New(0);
    if (holder == NULL)
        return NULL;
    text c[256] = {0}, d[256] = {0}, r[256] = {0};
    PyObject *cs[256] = {0};
    if (fill(c, cs, holder, classes) < 0 || fill(d, NULL, holder, directions) < 0 ||
        fill(r, NULL, holder, reasons) < 0) {
        Py_DECREF(holder);
        return NULL;
    }
    memcpy(class_names, c, sizeof c);
    memcpy(direction_names, d, sizeof d);
    memcpy(reason_names, r, sizeof r);
    memcpy(class_strs, cs, sizeof cs);
    Py_XSETREF(names_holder, holder);
    configured = 1;
    Py_RETURN_NONE;
}

/* set_materializer(kind, function): what makes a Packed of that kind its Python event */
static PyObject *set_materializer(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *kind, *fn;
    if (!PyArg_ParseTuple(args, "UO", &kind, &fn))
        return NULL;
    if (materializers == NULL && (materializers = PyDict_New()) == NULL)
        return NULL;
    if (PyDict_SetItem(materializers, kind, fn) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *layout(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored)) {
#define F(name) #name, (Py_ssize_t)offsetof(struct flow_event, name)
    return Py_BuildValue(
        "{sn sn sn sn sn sn sn sn sn sn sn sn sn sn sn sn sn}", "size",
        (Py_ssize_t)sizeof(struct flow_event), F(ts_ns), F(duration_ns), F(sent), F(recv),
        F(cgroup_id), F(laddr), F(raddr), F(pid), F(retrans), F(lport), F(rport), F(family),
        F(direction), F(cls), F(reason), F(comm));
#undef F
}


/* ---------------------------------------------------------------- process records */

/* Identity's fields in number order (events.Owner's names) */
static const char *const identity_keys[] = {
    "container_id", "container", "pod", "namespace", "pod_uid", "workload_kind", "workload",
};
#define N_IDENTITY 7
static PyObject *identity_key_strs[N_IDENTITY];
/* proc_events.exit_class's answers */
static const char *const exit_classes[] = {"success", "error", "signal", "unknown"};
#define N_CLASSES 4
static PyObject *exit_class_strs[N_CLASSES];

static int exit_class(int32_t exit_code, int32_t sig) {
    if (sig)
        return 2;
    if (exit_code < 0)
        return 3;
    return exit_code == 0 ? 0 : 1;
}

/* a signed field (int32): negative values take ten bytes, as protobuf writes them */
static inline void put_int(buf *b, uint32_t field, int64_t v) {
    if (v == 0)
        return;
    put_varint(b, (uint64_t)field << 3);
    put_varint(b, (uint64_t)v);
}

/* the nested Identity (always written, empty or not) from an identity dict */
static int put_identity(buf *b, uint32_t field, PyObject *who) {
    buf id = {0};
    int rc = -1;
    for (int i = 0; i < N_IDENTITY; i++) {
        PyObject *v = PyDict_GetItemWithError(who, identity_key_strs[i]);
        if (v == NULL && PyErr_Occurred())
            goto out;
        if (v != NULL && !PyUnicode_Check(v) && v != Py_None) {
            PyErr_Format(PyExc_TypeError, "identity's %s is %.50s, not str", identity_keys[i],
                         Py_TYPE(v)->tp_name);
            goto out;
        }
        if (put_pystr(&id, PB_IDENTITY_CONTAINER_ID + i, v) < 0)
            goto out;
    }
    if (reserve(b, id.n + 12) < 0)
        goto out;
    put_varint(b, ((uint64_t)field << 3) | 2);
    put_varint(b, id.n);
    if (id.n)
        memcpy(b->p + b->n, id.p, id.n);
    b->n += id.n;
    rc = 0;
out:
    PyMem_Free(id.p);
    return rc;
}

/* what one batch learned of a cgroup: its identity, and its records' counts by metric */
typedef struct {
    uint64_t cgroup_id;
    PyObject *path, *who;
    long long execs, ooms, exits[N_CLASSES];
} seen_cgroup;

static void forget(seen_cgroup *seen, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_XDECREF(seen[i].path);
        Py_XDECREF(seen[i].who);
    }
    PyMem_Free(seen);
}

/* the counts as {(metric, namespace, pod, container, exit class or ""): n}; metric 0
 * execs, 1 exits, 2 OOM kills */
static int add_count(PyObject *counts, int metric, PyObject *who, PyObject *cls, long long n) {
    if (n == 0)
        return 0;
    PyObject *labels[3];
    static const char *const names[3] = {"namespace", "pod", "container"};
    for (int i = 0; i < 3; i++) {
        PyObject *k = PyUnicode_FromString(names[i]);
        PyObject *v = k ? PyDict_GetItemWithError(who, k) : NULL;
        Py_XDECREF(k);
        if (v == NULL && PyErr_Occurred()) {
            while (i--)
                Py_DECREF(labels[i]);
            return -1;
        }
        labels[i] = v != NULL ? Py_NewRef(v) : PyUnicode_FromString("");
        if (labels[i] == NULL) {
            while (i--)
                Py_DECREF(labels[i]);
            return -1;
        }
    }
    PyObject *key = Py_BuildValue("(iNNNO)", metric, labels[0], labels[1], labels[2], cls);
    if (key == NULL)
        return -1;
    PyObject *had = PyDict_GetItemWithError(counts, key);
    long long before = had ? PyLong_AsLongLong(had) : 0;
    PyObject *now = PyErr_Occurred() ? NULL : PyLong_FromLongLong(before + n);
    int rc = now ? PyDict_SetItem(counts, key, now) : -1;
    Py_XDECREF(now);
    Py_DECREF(key);
    return rc;
}

/* comms: pid -> its comm at exec, at most max entries, the oldest going first (what an OOM
 * kill names the process by when the kernel's record has no comm) */
static int remember_comm(PyObject *comms, PyObject *pid, PyObject *comm, Py_ssize_t max) {
    if (PyDict_DelItem(comms, pid) < 0) {
        if (!PyErr_ExceptionMatches(PyExc_KeyError))
            return -1;
        PyErr_Clear();
    }
    if (PyDict_SetItem(comms, pid, comm) < 0)
        return -1;
    if (PyDict_GET_SIZE(comms) > max) {
        Py_ssize_t pos = 0;
        PyObject *k, *v;
        if (PyDict_Next(comms, &pos, &k, &v)) {
            Py_INCREF(k);
            int rc = PyDict_DelItem(comms, k);
            Py_DECREF(k);
            return rc;
        }
    }
    return 0;
}

/* procs(records, seq0, ts, head, idents, comms, max_comms)
 *   -> (list of Packed, counts, bad, first error)
 *
 * records: struct proc_event each; a kind other than exec, exit or OOM is passed over.
 * idents: cgroup id -> (path, identity dict) for each cgroup the records name (found
 * before the bus's lock is taken: proc_cgroups). comms: the pid -> comm dict the Python
 * path keeps (exec remembers, exit forgets, an OOM kill without a comm takes it). counts:
 * the metric increments (add_count). A record that is short or whose cgroup idents lacks
 * is counted in bad. Each Packed's extra is (path, identity, comm). */
static PyObject *procs(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *records, *idents, *comms;
    long long seq, ts;
    const char *head;
    Py_ssize_t head_n, max_comms;
    if (!PyArg_ParseTuple(args, "OLLy#O!O!n", &records, &seq, &ts, &head, &head_n,
                          &PyDict_Type, &idents, &PyDict_Type, &comms, &max_comms))
        return NULL;
    records_t recs;
    if (records_open(&recs, records, sizeof(struct proc_event)) < 0)
        return NULL;
    Py_ssize_t count = recs.count, nseen = 0, capseen = 0;
    seen_cgroup *seen = NULL;
    PyObject *out = PyList_New(0), *counts = PyDict_New(), *first_error = NULL;
    long long bad = 0;
    buf b = {0};
    if (out == NULL || counts == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < count; i++) {
        struct proc_event r;
        PyObject *comm_s = NULL, *extra = NULL, *kind;
        uint32_t tag;
        seen_cgroup *sc = NULL;
        if (records_get(&recs, i, &r, "process") < 0)
            goto record_failed;
        switch (r.kind) {
        case EV_EXEC: kind = kind_exec; tag = PB_EVENT_PROCESS_EXEC; break;
        case EV_EXIT: kind = kind_exit; tag = PB_EVENT_PROCESS_EXIT; break;
        case EV_OOM: kind = kind_oom; tag = PB_EVENT_OOM_KILL; break;
        default: continue;
        }
        for (Py_ssize_t j = 0; j < nseen; j++)
            if (seen[j].cgroup_id == r.cgroup_id) {
                sc = &seen[j];
                break;
            }
        if (sc == NULL) {
            PyObject *key = PyLong_FromUnsignedLongLong(r.cgroup_id);
            PyObject *got = key ? PyDict_GetItemWithError(idents, key) : NULL;
            PyObject *path, *who;
            if (got == NULL && key != NULL && !PyErr_Occurred())
                PyErr_SetObject(PyExc_KeyError, key);
            Py_XDECREF(key);
            if (got == NULL)
                goto record_failed;
            if (!PyArg_ParseTuple(got, "UO!", &path, &PyDict_Type, &who))
                goto record_failed;
            if (nseen == capseen) {
                Py_ssize_t cap = capseen ? capseen * 2 : 16;
                seen_cgroup *grown = PyMem_Realloc(seen, (size_t)cap * sizeof *seen);
                if (grown == NULL) {
                    PyErr_NoMemory();
                    goto fail;
                }
                seen = grown;
                capseen = cap;
            }
            sc = &seen[nseen++];
            memset(sc, 0, sizeof *sc);
            sc->cgroup_id = r.cgroup_id;
            sc->path = Py_NewRef(path);
            sc->who = Py_NewRef(who);
        }
        /* the comm: the record's; an OOM kill's without one, the one its exec had */
        const char *comm;
        Py_ssize_t comm_n;
        PyObject *owner = c_text(r.comm, sizeof r.comm, &comm, &comm_n);
        if (owner == NULL)
            goto record_failed;
        comm_s = owner != Py_None ? Py_NewRef(owner) : PyUnicode_FromStringAndSize(comm, comm_n);
        Py_DECREF(owner);
        if (comm_s == NULL)
            goto record_failed;
        PyObject *pid = PyLong_FromUnsignedLong(r.pid);
        int rc = pid ? 0 : -1;
        if (rc == 0 && r.kind == EV_EXEC) {
            rc = remember_comm(comms, pid, comm_s, max_comms);
        } else if (rc == 0 && r.kind == EV_EXIT) {
            if (PyDict_DelItem(comms, pid) < 0) {
                if (PyErr_ExceptionMatches(PyExc_KeyError))
                    PyErr_Clear();
                else
                    rc = -1;
            }
        } else if (rc == 0 && comm_n == 0) {
            PyObject *had = PyDict_GetItemWithError(comms, pid);
            if (had != NULL)
                Py_SETREF(comm_s, Py_NewRef(had));
            else if (PyErr_Occurred())
                rc = -1;
        }
        Py_XDECREF(pid);
        if (rc < 0) {
            Py_DECREF(comm_s);
            goto record_failed;
        }
        /* the payload, in number order */
        b.n = 0;
        const char *cp;
        Py_ssize_t cn;
        if (reserve(&b, 64) < 0 || (cp = PyUnicode_AsUTF8AndSize(comm_s, &cn)) == NULL) {
            Py_DECREF(comm_s);
            goto record_failed;
        }
        put_uint(&b,
                 r.kind == EV_EXEC   ? PB_PROCESS_EXEC_PID
                 : r.kind == EV_EXIT ? PB_PROCESS_EXIT_PID
                                     : PB_OOM_KILL_PID,
                 r.pid);
        if (r.kind == EV_EXEC) {
            const char *fp;
            Py_ssize_t fn;
            put_uint(&b, PB_PROCESS_EXEC_PPID, r.ppid);
            PyObject *fowner = c_text(r.filename, sizeof r.filename, &fp, &fn);
            rc = fowner == NULL || put_str(&b, PB_PROCESS_EXEC_COMM, cp, cn) < 0 ||
                         put_str(&b, PB_PROCESS_EXEC_FILENAME, fp, fn) < 0 ||
                         reserve(&b, 12) < 0
                     ? -1
                     : 0;
            Py_XDECREF(fowner);
            if (rc == 0) {
                put_uint(&b, PB_PROCESS_EXEC_CGROUP_ID, r.cgroup_id);
                rc = put_identity(&b, PB_PROCESS_EXEC_IDENTITY, sc->who);
            }
            sc->execs++;
        } else if (r.kind == EV_EXIT) {
            put_uint(&b, PB_PROCESS_EXIT_PPID, r.ppid);
            rc = put_str(&b, PB_PROCESS_EXIT_COMM, cp, cn) < 0 || reserve(&b, 24) < 0 ? -1 : 0;
            if (rc == 0) {
                put_int(&b, PB_PROCESS_EXIT_EXIT_CODE, r.exit_code);
                put_int(&b, PB_PROCESS_EXIT_SIGNAL, r.signal);
                put_uint(&b, PB_PROCESS_EXIT_OOM_KILLED, (r.flags & PF_OOM_VICTIM) ? 1 : 0);
                rc = put_identity(&b, PB_PROCESS_EXIT_IDENTITY, sc->who);
            }
            sc->exits[exit_class(r.exit_code, r.signal)]++;
        } else {
            rc = put_str(&b, PB_OOM_KILL_COMM, cp, cn) < 0
                     ? -1
                     : put_identity(&b, PB_OOM_KILL_IDENTITY, sc->who);
            sc->ooms++;
        }
        if (rc == 0)
            extra = PyTuple_Pack(3, sc->path, sc->who, comm_s);
        Py_DECREF(comm_s);
        if (extra == NULL)
            goto record_failed;
        /* the record kept up to its filename's end: the history holds 100,000 events, and
         * a filename is seldom near 256 bytes (materialize pads it again) */
        Py_ssize_t kept = offsetof(struct proc_event, filename) +
                          strnlen(r.filename, sizeof r.filename);
        Packed *p = pack(kind, tag, seq, ts, head, head_n, &b, &r, kept, extra);
        Py_DECREF(extra);
        if (p == NULL)
            goto record_failed;
        if (append(out, p) < 0)
            goto fail;
        seq++;
        continue;
    record_failed:
        bad++;
        keep_first_error(&first_error);
    }
    for (Py_ssize_t j = 0; j < nseen; j++) {
        PyObject *none = PyUnicode_FromString("");
        int rc = none == NULL || add_count(counts, 0, seen[j].who, none, seen[j].execs) < 0 ||
                 add_count(counts, 2, seen[j].who, none, seen[j].ooms) < 0;
        for (int c = 0; !rc && c < N_CLASSES; c++)
            rc = add_count(counts, 1, seen[j].who, exit_class_strs[c], seen[j].exits[c]) < 0;
        Py_XDECREF(none);
        if (rc)
            goto fail;
    }
    forget(seen, nseen);
    PyMem_Free(b.p);
    records_close(&recs);
    PyObject *result = Py_BuildValue("(NNLO)", out, counts, bad, first_error ? first_error : Py_None);
    Py_XDECREF(first_error);
    return result;
fail:
    forget(seen, nseen);
    PyMem_Free(b.p);
    records_close(&recs);
    Py_XDECREF(out);
    Py_XDECREF(counts);
    Py_XDECREF(first_error);
    return NULL;
}

/* proc_cgroups(records) -> [(cgroup id, new)]: each cgroup the exec, exit and OOM records
 * name, once, in order of first sight; new: one of its records is flagged REC_NEW_CGROUP */
static PyObject *proc_cgroups(PyObject *Py_UNUSED(module), PyObject *records) {
    records_t recs;
    if (records_open(&recs, records, sizeof(struct proc_event)) < 0)
        return NULL;
    PyObject *out = PyList_New(0), *where = PyDict_New();
    if (out == NULL || where == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < recs.count; i++) {
        struct proc_event r;
        if (records_get(&recs, i, &r, "process") < 0) {
            PyErr_Clear(); /* procs() counts the short one */
            continue;
        }
        if (r.kind < EV_EXEC || r.kind > EV_OOM)
            continue;
        PyObject *key = PyLong_FromUnsignedLongLong(r.cgroup_id);
        if (key == NULL)
            goto fail;
        PyObject *at = PyDict_GetItemWithError(where, key);
        if (at == NULL) {
            PyObject *idx = PyErr_Occurred() ? NULL : PyLong_FromSsize_t(PyList_GET_SIZE(out));
            PyObject *pair = idx ? Py_BuildValue("(OO)", key,
                                                 (r.flags & REC_NEW_CGROUP) ? Py_True : Py_False)
                                 : NULL;
            int rc = pair == NULL || PyDict_SetItem(where, key, idx) < 0 ||
                     PyList_Append(out, pair) < 0;
            Py_XDECREF(idx);
            Py_XDECREF(pair);
            Py_DECREF(key);
            if (rc)
                goto fail;
        } else {
            Py_DECREF(key);
            if (r.flags & REC_NEW_CGROUP) {
                PyObject *pair = PyList_GET_ITEM(out, PyLong_AsSsize_t(at));
                PyObject *now = PyTuple_Pack(2, PyTuple_GET_ITEM(pair, 0), Py_True);
                if (now == NULL)
                    goto fail;
                PyList_SetItem(out, PyLong_AsSsize_t(at), now);
            }
        }
    }
    Py_DECREF(where);
    records_close(&recs);
    return out;
fail:
    Py_XDECREF(out);
    Py_XDECREF(where);
    records_close(&recs);
    return NULL;
}

static PyObject *proc_layout(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored)) {
#define F(name) #name, (Py_ssize_t)offsetof(struct proc_event, name)
    return Py_BuildValue("{sn sn sn sn sn sn sn sn sn sn sn}", "size",
                         (Py_ssize_t)sizeof(struct proc_event), F(ts_ns), F(cgroup_id), F(kind),
                         F(pid), F(ppid), F(exit_code), F(signal), F(flags), F(comm),
                         F(filename));
#undef F
}

static PyMethodDef methods[] = {
    {"flows", flows, METH_VARARGS, "closed-flow records to Packed events"},
    {"configure_flows", configure_flows, METH_VARARGS, "the names of a flow record's numbers"},
    {"set_materializer", set_materializer, METH_VARARGS, "a kind's Python event maker"},
    {"procs", procs, METH_VARARGS, "exec, exit and OOM records to Packed events"},
    {"proc_cgroups", proc_cgroups, METH_O, "the cgroups a batch of process records name"},
    {"ring_take", ring_take, METH_VARARGS, "a ring buffer's committed records, in one bytes"},
    {"proc_event_layout", proc_layout, METH_NOARGS, "struct proc_event's size and offsets"},
    {"flow_event_layout", layout, METH_NOARGS, "struct flow_event's size and offsets"},
    {NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_native",
    .m_doc = "The compiled event path.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    if (PyType_Ready(&PackedType) < 0)
        return NULL;
    kind_flow = PyUnicode_InternFromString("flow_closed");
    kind_abnormal = PyUnicode_InternFromString("abnormal_flow");
    kind_exec = PyUnicode_InternFromString("process_exec");
    kind_exit = PyUnicode_InternFromString("process_exit");
    kind_oom = PyUnicode_InternFromString("oom_kill");
    for (int i = 0; i < N_IDENTITY; i++)
        if ((identity_key_strs[i] = PyUnicode_InternFromString(identity_keys[i])) == NULL)
            return NULL;
    for (int i = 0; i < N_CLASSES; i++)
        if ((exit_class_strs[i] = PyUnicode_InternFromString(exit_classes[i])) == NULL)
            return NULL;
    cls_key = PyUnicode_InternFromString("cls");
    if (!kind_flow || !kind_abnormal || !kind_exec || !kind_exit || !kind_oom || !cls_key)
        return NULL;
    for (int i = 0; i < N_EXTRA; i++)
        if ((extra_key_strs[i] = PyUnicode_InternFromString(extra_keys[i])) == NULL)
            return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "Packed", (PyObject *)&PackedType) < 0 ||
        PyModule_AddStringConstant(m, "SOURCE_HASH", SOURCE_HASH) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
