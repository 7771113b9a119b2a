/* The compiled event path (lens_ebpf/agent/tcp/native/__init__.py says why and how it is
 * built): closed-flow ring records straight to the serialized lens.v1 Event each
 * subscriber and the reporter send, with no Python event made on the way.
 *
 * Packed: one published event as the bus holds it: its kind, seq, wall time, its wire
 * bytes, the ring record it came from (inline) and what enrichment added (a dict, or
 * None). Its Python event (events.FlowClosed) is made only when a consumer asks for it
 * (event(): the Python decoder, from the record; the materializer is set from Python).
 *
 * flows(): a batch of records, numbered from seq0, each encoded as protobuf writes a
 * pb.Event (fields in number order, zero values left out): the bytes the Python path
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

/* bpf_programs/tcp_flows.c's struct flow_event; layouts.FlowEvent mirrors it, and
 * FLOW_EVENT (the offsets below) is checked against that mirror by the tests and at
 * import (native/__init__.py). */
struct flow_event {
    uint64_t ts_ns;
    uint64_t duration_ns;
    uint64_t sent;
    uint64_t recv;
    uint64_t cgroup_id;
    uint8_t laddr[16];
    uint8_t raddr[16];
    uint32_t pid;
    uint32_t retrans;
    uint16_t lport;
    uint16_t rport;
    uint8_t family;
    uint8_t direction;
    uint8_t cls;
    uint8_t reason;
    char comm[16];
};

#define AF_INET_ 2
#ifndef SOURCE_HASH
#define SOURCE_HASH ""
#endif

/* names the record's small numbers stand for, set once by configure() */
typedef struct {
    const char *p;
    Py_ssize_t n;
} text;

static PyObject *names_holder; /* keeps the configured strings alive */
static text class_names[256], direction_names[256], reason_names[256];
static PyObject *class_strs[256]; /* the same as str, for enrichment's calls */
static int configured;

static PyObject *materializer; /* Packed -> events.FlowClosed */
static PyObject *kind_flow, *kind_abnormal;

/* enrichment's fields after class, in the payload's number order (15..23) */
static const char *const extra_keys[] = {
    "remote_namespace", "remote_pod", "remote_workload_kind", "remote_workload",
    "remote_service", "namespace", "pod", "workload_kind", "workload",
};
#define N_EXTRA 9
static PyObject *extra_key_strs[N_EXTRA];
static PyObject *cls_key;

/* ---------------------------------------------------------------- Packed */

typedef struct {
    PyObject_HEAD
    PyObject *kind;  /* str */
    PyObject *wire;  /* bytes: the serialized pb.Event */
    PyObject *extra; /* dict of enrichment's fields, or None */
    long long seq;
    long long ts;
    struct flow_event rec;
} Packed;

static void packed_dealloc(Packed *self) {
    Py_XDECREF(self->kind);
    Py_XDECREF(self->wire);
    Py_XDECREF(self->extra);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *packed_event(Packed *self, PyObject *Py_UNUSED(ignored)) {
    if (materializer == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "no materializer set");
        return NULL;
    }
    return PyObject_CallOneArg(materializer, (PyObject *)self);
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
    return PyBytes_FromStringAndSize((const char *)&self->rec, sizeof self->rec);
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
    {"event", (PyCFunction)packed_event, METH_NOARGS, "the event as events.FlowClosed"},
    {"get", (PyCFunction)(void (*)(void))packed_get, METH_FASTCALL, "a field by its wire name"},
    {NULL},
};

static PyTypeObject PackedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "lens_ebpf.agent.tcp.native._native.Packed",
    .tp_basicsize = sizeof(Packed),
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

static Py_ssize_t addr_text(char *out, const struct flow_event *r, const uint8_t *addr16) {
    const char *got = r->family == AF_INET_
                          ? inet_ntop(AF_INET, addr16 + 12, out, INET6_ADDRSTRLEN)
                          : inet_ntop(AF_INET6, addr16, out, INET6_ADDRSTRLEN);
    return got ? (Py_ssize_t)strlen(out) : 0;
}

/* the comm's text as UTF-8: up to its NUL; bytes that are not UTF-8 replaced as Python's
 * decode(errors="replace") does (through it) */
static PyObject *comm_utf8(const struct flow_event *r, const char **p, Py_ssize_t *n) {
    size_t len = strnlen(r->comm, sizeof r->comm);
    int ascii = 1;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)r->comm[i] >= 0x80)
            ascii = 0;
    if (ascii) {
        *p = r->comm;
        *n = (Py_ssize_t)len;
        return Py_NewRef(Py_None);
    }
    PyObject *s = PyUnicode_DecodeUTF8(r->comm, (Py_ssize_t)len, "replace");
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
    PyObject *comm_owner = comm_utf8(r, &comm, &comm_n);
    if (comm_owner == NULL)
        return -1;
    put_uint(b, 1, r->pid);
    int rc = put_str(b, 2, comm, comm_n);
    Py_DECREF(comm_owner);
    if (rc < 0 || reserve(b, 24) < 0)
        return -1;
    put_uint(b, 3, r->cgroup_id);
    if (put_str(b, 4, laddr, llen) < 0 || reserve(b, 12) < 0)
        return -1;
    put_uint(b, 5, r->lport);
    if (put_str(b, 6, raddr, rlen) < 0 || reserve(b, 12) < 0)
        return -1;
    put_uint(b, 7, r->rport);
    text d = direction_names[r->direction].p ? direction_names[r->direction]
                                             : number_text(dscratch, r->direction);
    if (put_str(b, 8, d.p, d.n) < 0)
        return -1;
    PyObject *cls = extra != Py_None ? PyDict_GetItemWithError(extra, cls_key) : NULL;
    if (cls != NULL) {
        if (put_pystr(b, 9, cls) < 0)
            return -1;
    } else if (PyErr_Occurred()) {
        return -1;
    } else if (put_str(b, 9, class_names[r->cls].p, class_names[r->cls].n) < 0) {
        return -1;
    }
    if (reserve(b, 48) < 0)
        return -1;
    put_uint(b, 10, r->sent);
    put_uint(b, 11, r->recv);
    put_uint(b, 12, r->retrans);
    put_uint(b, 13, r->duration_ns);
    text why = reason_names[r->reason].p ? reason_names[r->reason]
                                         : number_text(rscratch, r->reason);
    if (put_str(b, 14, why.p, why.n) < 0)
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
            if (put_pystr(b, 15 + i, v) < 0)
                return -1;
        }
    }
    return 0;
}

/* one Packed: the Event's seq, wall time, node fields (head), then the payload as its
 * oneof field (tag: 10 flow_closed, 16 abnormal_flow) */
static Packed *pack(PyObject *kind, uint32_t tag, long long seq, long long ts,
                    const char *head, Py_ssize_t head_n, const buf *payload,
                    const struct flow_event *r, PyObject *extra) {
    uint8_t front[32];
    size_t fn = 0;
    if (seq) {
        front[fn++] = 1 << 3;
        fn += varint_to(front + fn, (uint64_t)seq);
    }
    if (ts) {
        front[fn++] = 2 << 3;
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
    Packed *p = PyObject_New(Packed, &PackedType);
    if (p == NULL) {
        Py_DECREF(wire);
        return NULL;
    }
    p->kind = Py_NewRef(kind);
    p->wire = wire;
    p->extra = Py_NewRef(extra);
    p->seq = seq;
    p->ts = ts;
    p->rec = *r;
    return p;
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
        PyErr_SetString(PyExc_RuntimeError, "configure() first");
        return NULL;
    }
    PyObject *seqf = PySequence_Fast(records, "records: a sequence");
    if (seqf == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seqf);
    PyObject *out = PyList_New(0);
    PyObject *first_error = NULL;
    long long bad = 0;
    buf b = {0};
    if (out == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_buffer view;
        struct flow_event r;
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seqf, i), &view, PyBUF_SIMPLE) < 0)
            goto record_failed;
        if (view.len < (Py_ssize_t)sizeof r) {
            PyErr_Format(PyExc_ValueError, "flow record of %zd bytes, %zu expected", view.len,
                         sizeof r);
            PyBuffer_Release(&view);
            goto record_failed;
        }
        memcpy(&r, view.buf, sizeof r);
        PyBuffer_Release(&view);

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
        Packed *p = NULL;
        if (flow_payload(&b, &r, laddr, llen, raddr, rlen, extra) < 0 ||
            (p = pack(kind_flow, 10, seq, ts, head, head_n, &b, &r, extra)) == NULL) {
            Py_DECREF(extra);
            Py_XDECREF(raddr_s);
            goto record_failed;
        }
        int appended = PyList_Append(out, (PyObject *)p);
        Py_DECREF(p);
        if (appended < 0) {
            Py_DECREF(extra);
            Py_XDECREF(raddr_s);
            goto fail;
        }
        seq++;
        if (abnormal != Py_None) {
            int yes = -1;
            PyObject *got = PyObject_CallOneArg(abnormal, raddr_s);
            if (got != NULL) {
                yes = PyObject_IsTrue(got);
                Py_DECREF(got);
            }
            p = NULL;
            if (yes < 0 || (yes && (p = pack(kind_abnormal, 16, seq, ts, head, head_n, &b, &r,
                                             extra)) == NULL)) {
                Py_DECREF(extra);
                Py_XDECREF(raddr_s);
                goto record_failed;
            }
            if (p != NULL) {
                appended = PyList_Append(out, (PyObject *)p);
                Py_DECREF(p);
                if (appended < 0) {
                    Py_DECREF(extra);
                    Py_XDECREF(raddr_s);
                    goto fail;
                }
                seq++;
            }
        }
        Py_DECREF(extra);
        Py_XDECREF(raddr_s);
        continue;
    record_failed:
        bad++;
        if (first_error == NULL) {
            PyObject *type, *tb;
            PyErr_Fetch(&type, &first_error, &tb);
            PyErr_NormalizeException(&type, &first_error, &tb);
            if (first_error != NULL && tb != NULL)
                PyException_SetTraceback(first_error, tb);
            Py_XDECREF(type);
            Py_XDECREF(tb);
        } else {
            PyErr_Clear();
        }
    }
    PyMem_Free(b.p);
    Py_DECREF(seqf);
    PyObject *result = Py_BuildValue("(NLO)", out, bad, first_error ? first_error : Py_None);
    Py_XDECREF(first_error);
    return result;
fail:
    PyMem_Free(b.p);
    Py_DECREF(seqf);
    Py_XDECREF(out);
    Py_XDECREF(first_error);
    return NULL;
}

/* configure(classes, directions, reasons, materialize): the names of the record's
 * numbers (decode.py's: every class number's, the directions and reasons that have one),
 * and the function that makes a Packed's Python event */
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

static PyObject *configure(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *classes, *directions, *reasons, *materialize;
    if (!PyArg_ParseTuple(args, "OOOO", &classes, &directions, &reasons, &materialize))
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
    Py_XSETREF(materializer, Py_NewRef(materialize));
    configured = 1;
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

static PyMethodDef methods[] = {
    {"flows", flows, METH_VARARGS, "closed-flow records to Packed events"},
    {"configure", configure, METH_VARARGS, "the records' names and the materializer"},
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
    cls_key = PyUnicode_InternFromString("cls");
    if (!kind_flow || !kind_abnormal || !cls_key)
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
