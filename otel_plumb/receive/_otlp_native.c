/* OTLP ExportTraceServiceRequest bytes -> SpanRecords, walking the wire format directly (and, at
 * the end of this file, the export's requests written around the spans' bytes: encode_spans).
 *
 * The records are the ones otel_plumb.receive.otlp.request_records builds from the protobuf
 * runtime's (upb's) parse, and the bytes it accepts are the ones upb accepts: every field
 * upb parses is checked here too (UTF-8 of every string field, links, scope attributes,
 * entity refs included), with upb's rules for what a wire type mismatch, a duplicate or
 * repeated singular message (merged), a oneof member set twice, an unknown group, or the
 * nesting limit (100 levels below the request, messages and groups alike) means. Errors
 * raise google.protobuf.message.DecodeError with upb's message, and when bytes have two
 * faults, upb's is the one reported: fields are read against the end of the buffer and the
 * end of their message is checked after each one (a string running past its message is
 * checked for UTF-8 first), while a submessage longer than its parent is refused at once.
 *
 * Every read is checked against the end of its message; recursion is bounded by the depth
 * limit; nothing built for a request that turns out malformed is kept.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#define DEPTH_LIMIT 100

enum { OK = 0, E_CORRUPT = 1, E_DEPTH = 2, E_UTF8 = 3, E_PYTHON = 4 };

typedef const uint8_t *ptr;

typedef struct {
    int depth; /* levels left */
    int err;
    ptr end;   /* of the whole buffer */
    /* decode_spans only (NULL for decode_request): each span's bytes, trace id and origin index,
     * and each ScopeSpans' origin (resource and scope bytes with their schema URLs). */
    PyObject *wires;
    PyObject *origins;
    Py_ssize_t origin; /* the index of the ScopeSpans being read */
} Dec;

/* --- state set up at import ------------------------------------------------------------- */

static PyObject *DecodeError;
static PyTypeObject *SpanRecordType;
static PyObject *SpanEventType;
static PyObject *empty_str;
static PyObject *empty_bytes;

/* SpanRecord's slots, in the order the fields are written below. */
static const char *const RECORD_SLOTS[] = {
    "trace_id", "span_id", "parent_span_id", "name", "kind", "start_ns", "end_ns", "status_code",
    "status_message", "attributes", "events", "resource", "scope_name", "dropped",
};
enum {
    S_TRACE_ID, S_SPAN_ID, S_PARENT, S_NAME, S_KIND, S_START, S_END, S_STATUS_CODE, S_STATUS_MESSAGE,
    S_ATTRIBUTES, S_EVENTS, S_RESOURCE, S_SCOPE_NAME, S_DROPPED, N_SLOTS
};
/* How records are made. A SpanRecord of plain Python has slots, filled here by offset. The
 * compiled core's SpanRecord (mypyc) holds its fields in a C struct of its own: it is made by
 * calling the compiled model.span.decoded (positional arguments: no keywords to match), and its
 * resource and scope are set through the setters of its attribute descriptors. */
static Py_ssize_t slot_offset[N_SLOTS];
static PyObject *make_record; /* model.span.decoded when SpanRecord is compiled, else NULL */
static setter set_resource, set_scope_name;
static void *set_resource_closure, *set_scope_name_closure;
static PyObject *empty_resource;

#define SLOT(obj, i) (*(PyObject **)((char *)(obj) + slot_offset[i]))

/* --- wire primitives -------------------------------------------------------------------- */

static inline int fail(Dec *d, int err) {
    if (!d->err) d->err = err;
    return -1;
}

/* A varint of at most 10 bytes; bits past 64 are dropped, as upb does. */
static inline int read_varint(Dec *d, ptr *pp, ptr end, uint64_t *out) {
    ptr p = *pp;
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= end) return fail(d, E_CORRUPT);
        uint64_t b = *p++;
        v |= (b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            *pp = p;
            *out = v;
            return 0;
        }
    }
    return fail(d, E_CORRUPT);
}

/* Tags and lengths: at most 5 bytes and 32 bits. */
static inline int read_varint32(Dec *d, ptr *pp, ptr end, uint64_t *out) {
    ptr p = *pp;
    uint64_t v = 0;
    for (int i = 0; i < 5; i++) {
        if (p >= end) return fail(d, E_CORRUPT);
        uint64_t b = *p++;
        v |= (b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            if (v > 0xffffffffu) return fail(d, E_CORRUPT);
            *pp = p;
            *out = v;
            return 0;
        }
    }
    return fail(d, E_CORRUPT);
}

/* Inside an unknown group upb takes field number 0 too; in a message it is corrupt. */
static inline int read_any_tag(Dec *d, ptr *pp, ptr end, uint32_t *field, int *wt) {
    uint64_t v;
    if (read_varint32(d, pp, end, &v) < 0) return -1;
    *field = (uint32_t)(v >> 3);
    *wt = (int)(v & 7);
    return 0;
}

static inline int read_tag(Dec *d, ptr *pp, ptr end, uint32_t *field, int *wt) {
    if (read_any_tag(d, pp, end, field, wt) < 0) return -1;
    if (*field == 0) return fail(d, E_CORRUPT);
    return 0;
}

static inline int read_len(Dec *d, ptr *pp, ptr end, ptr *start, ptr *stop) {
    uint64_t n;
    if (read_varint32(d, pp, end, &n) < 0) return -1;
    if (n > (uint64_t)(end - *pp)) return fail(d, E_CORRUPT);
    *start = *pp;
    *stop = *pp + n;
    *pp = *stop;
    return 0;
}

static inline int read_fixed64(Dec *d, ptr *pp, ptr end, uint64_t *out) {
    if (end - *pp < 8) return fail(d, E_CORRUPT);
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | (*pp)[i];
    *pp += 8;
    *out = v;
    return 0;
}

static int skip_field(Dec *d, ptr *pp, ptr end, uint32_t field, int wt);

/* The body of an unknown group, up to its end tag (same field number). */
static int skip_group(Dec *d, ptr *pp, ptr end, uint32_t group) {
    if (--d->depth < 0) return fail(d, E_CORRUPT);
    for (;;) {
        uint32_t field;
        int wt;
        if (*pp >= end) return fail(d, E_CORRUPT);
        if (read_any_tag(d, pp, end, &field, &wt) < 0) return -1;
        if (wt == 4) {
            if (field != group) return fail(d, E_CORRUPT);
            d->depth++;
            return 0;
        }
        if (skip_field(d, pp, end, field, wt) < 0) return -1;
    }
}

static int skip_field(Dec *d, ptr *pp, ptr end, uint32_t field, int wt) {
    uint64_t v;
    ptr a, b;
    switch (wt) {
    case 0:
        return read_varint(d, pp, end, &v);
    case 1:
        if (end - *pp < 8) return fail(d, E_CORRUPT);
        *pp += 8;
        return 0;
    case 2:
        return read_len(d, pp, end, &a, &b);
    case 3:
        return skip_group(d, pp, end, field);
    case 5:
        if (end - *pp < 4) return fail(d, E_CORRUPT);
        *pp += 4;
        return 0;
    default: /* an end tag with no group open, or wire types 6 and 7 */
        return fail(d, E_CORRUPT);
    }
}

/* UTF-8 as upb (and CPython's strict codec) define it: no overlong forms, no surrogates,
 * nothing above U+10FFFF. */
static int utf8_valid(ptr p, ptr end) {
    while (p < end) {
        uint8_t c = *p;
        if (c < 0x80) {
            p++;
            continue;
        }
        Py_ssize_t left = end - p;
        if (c >= 0xc2 && c <= 0xdf) {
            if (left < 2 || (p[1] & 0xc0) != 0x80) return 0;
            p += 2;
        } else if (c >= 0xe0 && c <= 0xef) {
            if (left < 3 || (p[1] & 0xc0) != 0x80 || (p[2] & 0xc0) != 0x80) return 0;
            if (c == 0xe0 && p[1] < 0xa0) return 0;
            if (c == 0xed && p[1] > 0x9f) return 0;
            p += 3;
        } else if (c >= 0xf0 && c <= 0xf4) {
            if (left < 4 || (p[1] & 0xc0) != 0x80 || (p[2] & 0xc0) != 0x80 || (p[3] & 0xc0) != 0x80) return 0;
            if (c == 0xf0 && p[1] < 0x90) return 0;
            if (c == 0xf4 && p[1] > 0x8f) return 0;
            p += 4;
        } else {
            return 0;
        }
    }
    return 1;
}

static int read_string_checked(Dec *d, ptr *pp, ptr end) {
    ptr a, b;
    if (read_len(d, pp, end, &a, &b) < 0) return -1;
    if (!utf8_valid(a, b)) return fail(d, E_UTF8);
    return 0;
}

/* A string field as a new str (replacing *slot, which may hold an earlier occurrence). */
static int read_string(Dec *d, ptr *pp, ptr end, PyObject **slot) {
    ptr a, b;
    if (read_len(d, pp, end, &a, &b) < 0) return -1;
    PyObject *s;
    if (a == b) {
        s = Py_NewRef(empty_str);
    } else {
        s = PyUnicode_DecodeUTF8((const char *)a, b - a, NULL);
        if (s == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return fail(d, E_PYTHON);
            PyErr_Clear();
            return fail(d, E_UTF8);
        }
    }
    Py_XSETREF(*slot, s);
    return 0;
}

/* The bytes of a length-delimited field, appended to *slot: a singular message sent twice is
 * merged, which is what the concatenation of its occurrences reads as. */
static int append_bytes(Dec *d, PyObject **slot, ptr a, ptr b) {
    Py_ssize_t had = *slot ? PyBytes_GET_SIZE(*slot) : 0;
    PyObject *out = PyBytes_FromStringAndSize(NULL, had + (b - a));
    if (out == NULL) return fail(d, E_PYTHON);
    if (had) memcpy(PyBytes_AS_STRING(out), PyBytes_AS_STRING(*slot), had);
    memcpy(PyBytes_AS_STRING(out) + had, a, b - a);
    Py_XSETREF(*slot, out);
    return 0;
}

/* model.span.fingerprint of a record: the low 60 bits of the hash of (name, start, end, status
 * code, status message, attribute keys, event count), the same tuple hashed the same way. */
#define FINGERPRINT_MASK ((1ULL << 60) - 1)

/* hash() of a tuple, from the hashes of its items: CPython's tuple hash (xxHash's mixing, the
 * same since Python 3.8), so the hash of a tuple of tuples can be worked out without building
 * them. 32-bit builds mix with other primes: there the extension is not built (setup.py then
 * installs the pure-Python decoder). */
#if SIZEOF_PY_UHASH_T != 8
#error "the fingerprint needs a 64-bit Py_uhash_t"
#endif
#define XXPRIME_1 ((Py_uhash_t)11400714785074694791ULL)
#define XXPRIME_2 ((Py_uhash_t)14029467366897019727ULL)
#define XXPRIME_5 ((Py_uhash_t)2870177450012600261ULL)

static inline Py_uhash_t tuple_hash_add(Py_uhash_t acc, Py_uhash_t lane) {
    acc += lane * XXPRIME_2;
    acc = (acc << 31) | (acc >> 33);
    return acc * XXPRIME_1;
}

static inline Py_hash_t tuple_hash_end(Py_uhash_t acc, Py_ssize_t len) {
    acc += (Py_uhash_t)len ^ (XXPRIME_5 ^ 3527539UL);
    return acc == (Py_uhash_t)-1 ? 1546275796 : (Py_hash_t)acc;
}

/* hash(tuple(d)) for a dict the decoder made (keys are str: their hashes are cached). */
static Py_hash_t keys_hash(PyObject *dict) {
    Py_uhash_t acc = XXPRIME_5;
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(dict, &pos, &key, &value)) {
        Py_hash_t h = PyObject_Hash(key);
        if (h == -1) return -1;
        acc = tuple_hash_add(acc, (Py_uhash_t)h);
    }
    return tuple_hash_end(acc, PyDict_GET_SIZE(dict));
}

/* The hash of (name, start, end, status code, status message, tuple(attributes), len(events)),
 * without building the tuples. */
static PyObject *record_fingerprint(PyObject *const *v) {
    PyObject *const items[] = {v[S_NAME], v[S_START], v[S_END], v[S_STATUS_CODE], v[S_STATUS_MESSAGE]};
    Py_uhash_t acc = XXPRIME_5;
    for (size_t i = 0; i < sizeof items / sizeof items[0]; i++) {
        Py_hash_t h = PyObject_Hash(items[i]);
        if (h == -1) return NULL;
        acc = tuple_hash_add(acc, (Py_uhash_t)h);
    }
    Py_hash_t keys = keys_hash(v[S_ATTRIBUTES]);
    if (keys == -1) return NULL;
    acc = tuple_hash_add(acc, (Py_uhash_t)keys);
    /* hash() of a small non-negative int is the int */
    acc = tuple_hash_add(acc, (Py_uhash_t)PyList_GET_SIZE(v[S_EVENTS]));
    Py_hash_t hash = tuple_hash_end(acc, 7);
    return PyLong_FromUnsignedLongLong((unsigned long long)hash & FINGERPRINT_MASK);
}

/* (span bytes, trace id bytes, origin index, fingerprint) of the span just recorded. */
static int append_wire(Dec *d, PyObject *const *v, ptr span, ptr span_end, ptr trace_id, ptr trace_end) {
    PyObject *w = PyTuple_New(4);
    if (w == NULL) return fail(d, E_PYTHON);
    PyObject *body = PyBytes_FromStringAndSize((const char *)span, span_end - span);
    PyObject *tid = PyBytes_FromStringAndSize((const char *)trace_id, trace_end - trace_id);
    PyObject *origin = PyLong_FromSsize_t(d->origin);
    PyObject *fingerprint = record_fingerprint(v);
    if (body == NULL || tid == NULL || origin == NULL || fingerprint == NULL) {
        Py_XDECREF(body);
        Py_XDECREF(tid);
        Py_XDECREF(origin);
        Py_XDECREF(fingerprint);
        Py_DECREF(w);
        return fail(d, E_PYTHON);
    }
    PyTuple_SET_ITEM(w, 0, body);
    PyTuple_SET_ITEM(w, 1, tid);
    PyTuple_SET_ITEM(w, 2, origin);
    PyTuple_SET_ITEM(w, 3, fingerprint);
    int rc = PyList_Append(d->wires, w);
    Py_DECREF(w);
    return rc < 0 ? fail(d, E_PYTHON) : 0;
}

/* Attribute keys, span and event names and short string values (tool and model names, HTTP
 * methods, database systems) repeat from span to span: the str of a short ASCII one is kept
 * (with its hash computed once) in a direct-mapped cache instead of being built for every span,
 * and a buffered span shares it rather than holding a copy. A value seen once (a call id) only
 * takes the place of another entry: the cache never grows. */
#define STRING_CACHE_SIZE 4096
#define STRING_CACHE_MAX_LEN 64
static PyObject *string_cache[STRING_CACHE_SIZE];

static int read_cached_string(Dec *d, ptr *pp, ptr end, PyObject **slot) {
    ptr a, b;
    ptr start = *pp;
    if (read_len(d, pp, end, &a, &b) < 0) return -1;
    Py_ssize_t n = b - a;
    if (n == 0 || n > STRING_CACHE_MAX_LEN) {
        *pp = start;
        return read_string(d, pp, end, slot);
    }
    /* Eight bytes at a time: whether all are ASCII, and a hash of them for the cache's index. */
    uint64_t h = (uint64_t)n, high = 0, w;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&w, a + i, 8);
        high |= w;
        h = (h ^ w) * 0x9e3779b97f4a7c15ULL;
        h ^= h >> 32;
    }
    if (i < n) {
        w = 0;
        memcpy(&w, a + i, (size_t)(n - i));
        high |= w;
        h = (h ^ w) * 0x9e3779b97f4a7c15ULL;
        h ^= h >> 32;
    }
    if (high & 0x8080808080808080ULL) { /* not ASCII: decoded (and checked) as any string */
        *pp = start;
        return read_string(d, pp, end, slot);
    }
    PyObject **entry = &string_cache[(h ^ (h >> 17)) & (STRING_CACHE_SIZE - 1)];
    PyObject *s = *entry;
    if (s == NULL || PyUnicode_GET_LENGTH(s) != n || memcmp(PyUnicode_1BYTE_DATA(s), a, n) != 0) {
        s = PyUnicode_FromKindAndData(PyUnicode_1BYTE_KIND, a, n);
        if (s == NULL) return fail(d, E_PYTHON);
        if (PyObject_Hash(s) == -1) {
            Py_DECREF(s);
            return fail(d, E_PYTHON);
        }
        Py_XSETREF(*entry, s);
    }
    Py_XSETREF(*slot, Py_NewRef(s));
    return 0;
}

static inline int enter(Dec *d) {
    if (--d->depth < 0) return fail(d, E_DEPTH);
    return 0;
}

/* The end of a message begun with enter(): its last field must not have run past it. */
static inline int leave(Dec *d, ptr p, ptr end) {
    if (p > end) return fail(d, E_CORRUPT);
    d->depth++;
    return 0;
}

/* --- messages only checked (parsed by upb, not used by the records) ------------------- */

enum { K_VARINT, K_FIXED64, K_FIXED32, K_BYTES, K_STRING, K_MSG };
typedef struct {
    uint32_t number;
    uint8_t kind;
    int8_t msg; /* for K_MSG: index into MESSAGES */
} FieldDef;
typedef struct {
    const FieldDef *fields;
    int count;
} MsgDef;

enum { M_KEY_VALUE, M_ANY_VALUE, M_ARRAY_VALUE, M_KEY_VALUE_LIST, M_ENTITY_REF, M_LINK };
static const FieldDef KEY_VALUE_F[] = {{1, K_STRING, 0}, {2, K_MSG, M_ANY_VALUE}, {3, K_VARINT, 0}};
static const FieldDef ANY_VALUE_F[] = {
    {1, K_STRING, 0}, {2, K_VARINT, 0}, {3, K_VARINT, 0}, {4, K_FIXED64, 0},
    {5, K_MSG, M_ARRAY_VALUE}, {6, K_MSG, M_KEY_VALUE_LIST}, {7, K_BYTES, 0}, {8, K_VARINT, 0},
};
static const FieldDef ARRAY_VALUE_F[] = {{1, K_MSG, M_ANY_VALUE}};
static const FieldDef KEY_VALUE_LIST_F[] = {{1, K_MSG, M_KEY_VALUE}};
static const FieldDef ENTITY_REF_F[] = {{1, K_STRING, 0}, {2, K_STRING, 0}, {3, K_STRING, 0}, {4, K_STRING, 0}};
static const FieldDef LINK_F[] = {
    {1, K_BYTES, 0}, {2, K_BYTES, 0}, {3, K_STRING, 0}, {4, K_MSG, M_KEY_VALUE}, {5, K_VARINT, 0}, {6, K_FIXED32, 0},
};
#define MSG(f) {f, (int)(sizeof(f) / sizeof(f[0]))}
static const MsgDef MESSAGES[] = {
    MSG(KEY_VALUE_F), MSG(ANY_VALUE_F), MSG(ARRAY_VALUE_F), MSG(KEY_VALUE_LIST_F), MSG(ENTITY_REF_F), MSG(LINK_F),
};

static const int KIND_WIRE_TYPE[] = {0, 1, 5, 2, 2, 2};

static int check_message(Dec *d, ptr p, ptr end, int msg) {
    if (enter(d) < 0) return -1;
    const MsgDef *def = &MESSAGES[msg];
    while (p < end) {
        uint32_t field;
        int wt;
        if (read_tag(d, &p, d->end, &field, &wt) < 0) return -1;
        const FieldDef *f = NULL;
        for (int i = 0; i < def->count; i++) {
            if (def->fields[i].number == field) {
                f = &def->fields[i];
                break;
            }
        }
        if (f == NULL || KIND_WIRE_TYPE[f->kind] != wt) {
            if (skip_field(d, &p, d->end, field, wt) < 0) return -1;
            continue;
        }
        if (f->kind == K_STRING) {
            if (read_string_checked(d, &p, d->end) < 0) return -1;
        } else if (f->kind == K_MSG) {
            ptr a, b;
            if (read_len(d, &p, end, &a, &b) < 0) return -1;
            if (check_message(d, a, b, f->msg) < 0) return -1;
        } else if (skip_field(d, &p, d->end, field, wt) < 0) {
            return -1;
        }
    }
    return leave(d, p, end);
}

static int check_field(Dec *d, ptr *pp, ptr end, int msg) {
    ptr a, b;
    if (read_len(d, pp, end, &a, &b) < 0) return -1;
    return check_message(d, a, b, msg);
}

/* --- attribute values ----------------------------------------------------------------- */

/* AnyValue's oneof as built so far: which member was set last, and its Python value. */
typedef struct {
    int member; /* field number, 0 when none */
    PyObject *value;
} AnyValue;

static int parse_key_value_into(Dec *d, ptr p, ptr end, PyObject *dict);

static int parse_any_value(Dec *d, ptr p, ptr end, AnyValue *av);

static int parse_array_into(Dec *d, ptr p, ptr end, PyObject *list) {
    if (enter(d) < 0) return -1;
    while (p < end) {
        uint32_t field;
        int wt;
        if (read_tag(d, &p, d->end, &field, &wt) < 0) return -1;
        if (field == 1 && wt == 2) {
            ptr a, b;
            if (read_len(d, &p, end, &a, &b) < 0) return -1;
            AnyValue item = {0, NULL};
            if (parse_any_value(d, a, b, &item) < 0) {
                Py_XDECREF(item.value);
                return -1;
            }
            PyObject *v = item.value ? item.value : Py_NewRef(Py_None);
            int r = PyList_Append(list, v);
            Py_DECREF(v);
            if (r < 0) return fail(d, E_PYTHON);
        } else if (skip_field(d, &p, d->end, field, wt) < 0) {
            return -1;
        }
    }
    return leave(d, p, end);
}

static int parse_kvlist_into(Dec *d, ptr p, ptr end, PyObject *dict) {
    if (enter(d) < 0) return -1;
    while (p < end) {
        uint32_t field;
        int wt;
        if (read_tag(d, &p, d->end, &field, &wt) < 0) return -1;
        if (field == 1 && wt == 2) {
            ptr a, b;
            if (read_len(d, &p, end, &a, &b) < 0) return -1;
            if (parse_key_value_into(d, a, b, dict) < 0) return -1;
        } else if (skip_field(d, &p, d->end, field, wt) < 0) {
            return -1;
        }
    }
    return leave(d, p, end);
}

/* One AnyValue occurrence, merged into *av as upb merges: a oneof member replaces another;
 * the same message member set again is merged (its repeated values appended). */
static int parse_any_value(Dec *d, ptr p, ptr end, AnyValue *av) {
    if (enter(d) < 0) return -1;
    while (p < end) {
        uint32_t field;
        int wt;
        if (read_tag(d, &p, d->end, &field, &wt) < 0) return -1;
        PyObject *v = NULL;
        uint64_t n;
        ptr a, b;
        switch (field) {
        case 1: /* string_value */
            if (wt != 2) break;
            if (av->member != 1) Py_CLEAR(av->value);
            av->member = 1;
            if (read_cached_string(d, &p, d->end, &av->value) < 0) return -1;
            continue;
        case 2: /* bool_value */
            if (wt != 0) break;
            if (read_varint(d, &p, d->end, &n) < 0) return -1;
            v = Py_NewRef(n ? Py_True : Py_False);
            goto set;
        case 3: /* int_value */
            if (wt != 0) break;
            if (read_varint(d, &p, d->end, &n) < 0) return -1;
            v = PyLong_FromLongLong((long long)(int64_t)n);
            goto set;
        case 4: /* double_value */
            if (wt != 1) break;
            if (read_fixed64(d, &p, d->end, &n) < 0) return -1;
            {
                double x;
                memcpy(&x, &n, sizeof x);
                v = PyFloat_FromDouble(x);
            }
            goto set;
        case 5: /* array_value */
            if (wt != 2) break;
            if (read_len(d, &p, end, &a, &b) < 0) return -1;
            if (av->member != 5) {
                PyObject *list = PyList_New(0);
                if (list == NULL) return fail(d, E_PYTHON);
                Py_XSETREF(av->value, list);
                av->member = 5;
            }
            if (parse_array_into(d, a, b, av->value) < 0) return -1;
            continue;
        case 6: /* kvlist_value */
            if (wt != 2) break;
            if (read_len(d, &p, end, &a, &b) < 0) return -1;
            if (av->member != 6) {
                PyObject *dict = PyDict_New();
                if (dict == NULL) return fail(d, E_PYTHON);
                Py_XSETREF(av->value, dict);
                av->member = 6;
            }
            if (parse_kvlist_into(d, a, b, av->value) < 0) return -1;
            continue;
        case 7: /* bytes_value */
            if (wt != 2) break;
            if (read_len(d, &p, end, &a, &b) < 0) return -1;
            v = PyBytes_FromStringAndSize((const char *)a, b - a);
            goto set;
        case 8: /* string_value_strindex (int32) */
            if (wt != 0) break;
            if (read_varint(d, &p, d->end, &n) < 0) return -1;
            v = PyLong_FromLong((long)(int32_t)(uint32_t)n);
            goto set;
        default:
            break;
        }
        if (skip_field(d, &p, d->end, field, wt) < 0) return -1;
        continue;
    set:
        if (v == NULL) return fail(d, E_PYTHON);
        Py_XSETREF(av->value, v);
        av->member = (int)field;
    }
    return leave(d, p, end);
}

/* One KeyValue, stored in dict (a later key replaces an earlier one, as a dict built in order). */
static int parse_key_value_into(Dec *d, ptr p, ptr end, PyObject *dict) {
    if (enter(d) < 0) return -1;
    PyObject *key = NULL;
    AnyValue av = {0, NULL};
    int rc = -1;
    while (p < end) {
        uint32_t field;
        int wt;
        if (read_tag(d, &p, d->end, &field, &wt) < 0) goto done;
        if (field == 1 && wt == 2) {
            if (read_cached_string(d, &p, d->end, &key) < 0) goto done;
        } else if (field == 2 && wt == 2) {
            ptr a, b;
            if (read_len(d, &p, end, &a, &b) < 0) goto done;
            if (parse_any_value(d, a, b, &av) < 0) goto done;
        } else if (skip_field(d, &p, d->end, field, wt) < 0) {
            goto done;
        }
    }
    if (leave(d, p, end) < 0) goto done;
    if (PyDict_SetItem(dict, key ? key : empty_str, av.value ? av.value : Py_None) < 0) {
        fail(d, E_PYTHON);
        goto done;
    }
    rc = 0;
done:
    Py_XDECREF(key);
    Py_XDECREF(av.value);
    return rc;
}

static int parse_attribute_field(Dec *d, ptr *pp, ptr end, PyObject **dict) {
    ptr a, b;
    if (read_len(d, pp, end, &a, &b) < 0) return -1;
    if (*dict == NULL && (*dict = PyDict_New()) == NULL) return fail(d, E_PYTHON);
    return parse_key_value_into(d, a, b, *dict);
}

/* --- spans -------------------------------------------------------------------------------- */

static PyObject *hex_id(ptr a, ptr b) {
    static const char digits[] = "0123456789abcdef";
    Py_ssize_t n = b - a;
    PyObject *s = PyUnicode_New(2 * n, 127);
    if (s == NULL) return NULL;
    Py_UCS1 *out = PyUnicode_1BYTE_DATA(s);
    for (Py_ssize_t i = 0; i < n; i++) {
        out[2 * i] = (Py_UCS1)digits[a[i] >> 4];
        out[2 * i + 1] = (Py_UCS1)digits[a[i] & 15];
    }
    return s;
}

/* Trace and parent ids repeat from span to span (a trace's spans come in several requests,
 * siblings name one parent): the hex str of an 8- or 16-byte id is kept, with its hash, in a
 * direct-mapped cache, so it is built and hashed once and buffered spans share it. Span ids are
 * not: each is new. */
#define ID_CACHE_SIZE 8192
typedef struct {
    PyObject *hex;
    uint8_t len;
    uint8_t raw[16];
} IdEntry;
static IdEntry id_cache[ID_CACHE_SIZE];

static PyObject *cached_hex_id(ptr a, ptr b) {
    Py_ssize_t n = b - a;
    if (n != 16 && n != 8) return hex_id(a, b);
    uint64_t x; /* the id's last 8 bytes: random in every W3C id (the first may hold a time) */
    memcpy(&x, b - 8, 8);
    x = (x ^ (x >> 31)) * 0x9e3779b97f4a7c15ULL;
    IdEntry *e = &id_cache[(x >> 40) & (ID_CACHE_SIZE - 1)];
    if (e->hex != NULL && e->len == n && memcmp(e->raw, a, n) == 0) return Py_NewRef(e->hex);
    PyObject *hex = hex_id(a, b);
    if (hex == NULL || PyObject_Hash(hex) == -1) {
        Py_XDECREF(hex);
        return NULL;
    }
    Py_XSETREF(e->hex, Py_NewRef(hex));
    e->len = (uint8_t)n;
    memcpy(e->raw, a, n);
    return hex;
}

/* Adds a dropped count (a uint32 varint) to *dropped. */
static int read_dropped(Dec *d, ptr *pp, uint64_t *dropped) {
    uint64_t n;
    if (read_varint(d, pp, d->end, &n) < 0) return -1;
    *dropped += (uint32_t)n;
    return 0;
}

static int parse_event(Dec *d, ptr p, ptr end, PyObject **events, uint64_t *dropped) {
    if (enter(d) < 0) return -1;
    PyObject *name = NULL, *attrs = NULL;
    uint64_t time_ns = 0;
    int rc = -1;
    while (p < end) {
        uint32_t field;
        int wt;
        if (read_tag(d, &p, d->end, &field, &wt) < 0) goto done;
        if (field == 1 && wt == 1) {
            if (read_fixed64(d, &p, d->end, &time_ns) < 0) goto done;
        } else if (field == 2 && wt == 2) {
            if (read_cached_string(d, &p, d->end, &name) < 0) goto done;
        } else if (field == 3 && wt == 2) {
            if (parse_attribute_field(d, &p, end, &attrs) < 0) goto done;
        } else if (field == 4 && wt == 0) { /* dropped_attributes_count */
            if (read_dropped(d, &p, dropped) < 0) goto done;
        } else if (skip_field(d, &p, d->end, field, wt) < 0) {
            goto done;
        }
    }
    if (leave(d, p, end) < 0) goto done;
    if (attrs == NULL && (attrs = PyDict_New()) == NULL) {
        fail(d, E_PYTHON);
        goto done;
    }
    if (*events == NULL && (*events = PyList_New(0)) == NULL) {
        fail(d, E_PYTHON);
        goto done;
    }
    {
        PyObject *t = PyLong_FromUnsignedLongLong(time_ns);
        if (t == NULL) {
            fail(d, E_PYTHON);
            goto done;
        }
        PyObject *args[] = {name ? name : empty_str, t, attrs};
        PyObject *event = PyObject_Vectorcall(SpanEventType, args, 3, NULL);
        Py_DECREF(t);
        if (event == NULL || PyList_Append(*events, event) < 0) {
            Py_XDECREF(event);
            fail(d, E_PYTHON);
            goto done;
        }
        Py_DECREF(event);
    }
    rc = 0;
done:
    Py_XDECREF(name);
    Py_XDECREF(attrs);
    return rc;
}

static int parse_status(Dec *d, ptr p, ptr end, int32_t *code, PyObject **message) {
    if (enter(d) < 0) return -1;
    while (p < end) {
        uint32_t field;
        int wt;
        if (read_tag(d, &p, d->end, &field, &wt) < 0) return -1;
        if (field == 2 && wt == 2) {
            if (read_string(d, &p, d->end, message) < 0) return -1;
        } else if (field == 3 && wt == 0) {
            uint64_t n;
            if (read_varint(d, &p, d->end, &n) < 0) return -1;
            *code = (int32_t)(uint32_t)n;
        } else if (skip_field(d, &p, d->end, field, wt) < 0) {
            return -1;
        }
    }
    return leave(d, p, end);
}

/* A SpanRecord of the fields v (borrowed, each set unless an allocation failed) appended to out. */
static int add_record(PyObject *out, PyObject *const *v) {
    for (int i = 0; i < N_SLOTS; i++) {
        if (v[i] == NULL) return -1;
    }
    PyObject *record;
    if (make_record != NULL) {
        record = PyObject_Vectorcall(make_record, v, N_SLOTS, NULL);
        if (record == NULL) return -1;
    } else {
        record = SpanRecordType->tp_alloc(SpanRecordType, 0);
        if (record == NULL) return -1;
        for (int i = 0; i < N_SLOTS; i++) SLOT(record, i) = Py_NewRef(v[i]);
    }
    int rc = PyList_Append(out, record);
    Py_DECREF(record);
    return rc;
}

/* One Span -> a SpanRecord appended to out (resource and scope_name are filled in by the caller). */
static int parse_span(Dec *d, ptr p, ptr end, PyObject *out) {
    if (enter(d) < 0) return -1;
    ptr span_start = p;
    ptr trace_id = p, trace_end = p, span_id = p, span_end = p, parent = p, parent_end = p;
    PyObject *name = NULL, *attrs = NULL, *events = NULL, *status_message = NULL;
    int32_t kind = 0, status_code = 0;
    uint64_t start_ns = 0, end_ns = 0, dropped = 0;
    int rc = -1;
    while (p < end) {
        uint32_t field;
        int wt;
        if (read_tag(d, &p, d->end, &field, &wt) < 0) goto done;
        uint64_t n;
        ptr a, b;
        switch (field) {
        case 1:
            if (wt != 2) break;
            if (read_len(d, &p, end, &trace_id, &trace_end) < 0) goto done;
            continue;
        case 2:
            if (wt != 2) break;
            if (read_len(d, &p, end, &span_id, &span_end) < 0) goto done;
            continue;
        case 3: /* trace_state */
            if (wt != 2) break;
            if (read_string_checked(d, &p, d->end) < 0) goto done;
            continue;
        case 4:
            if (wt != 2) break;
            if (read_len(d, &p, end, &parent, &parent_end) < 0) goto done;
            continue;
        case 5:
            if (wt != 2) break;
            if (read_cached_string(d, &p, d->end, &name) < 0) goto done;
            continue;
        case 6:
            if (wt != 0) break;
            if (read_varint(d, &p, d->end, &n) < 0) goto done;
            kind = (int32_t)(uint32_t)n;
            continue;
        case 7:
            if (wt != 1) break;
            if (read_fixed64(d, &p, d->end, &start_ns) < 0) goto done;
            continue;
        case 8:
            if (wt != 1) break;
            if (read_fixed64(d, &p, d->end, &end_ns) < 0) goto done;
            continue;
        case 9:
            if (wt != 2) break;
            if (parse_attribute_field(d, &p, end, &attrs) < 0) goto done;
            continue;
        case 11:
            if (wt != 2) break;
            if (read_len(d, &p, end, &a, &b) < 0) goto done;
            if (parse_event(d, a, b, &events, &dropped) < 0) goto done;
            continue;
        case 10: /* dropped_attributes_count */
        case 12: /* dropped_events_count */
            if (wt != 0) break;
            if (read_dropped(d, &p, &dropped) < 0) goto done;
            continue;
        case 13: /* links */
            if (wt != 2) break;
            if (check_field(d, &p, end, M_LINK) < 0) goto done;
            continue;
        case 15:
            if (wt != 2) break;
            if (read_len(d, &p, end, &a, &b) < 0) goto done;
            if (parse_status(d, a, b, &status_code, &status_message) < 0) goto done;
            continue;
        default: /* 14 (dropped links) and 16 (flags) are not kept */
            break;
        }
        if (skip_field(d, &p, d->end, field, wt) < 0) goto done;
    }
    if (leave(d, p, end) < 0) goto done;
    {
        /* Its fields, the resource and scope left to the caller, as new references. */
        PyObject *v[N_SLOTS] = {
            cached_hex_id(trace_id, trace_end),
            hex_id(span_id, span_end),
            parent == parent_end ? Py_NewRef(Py_None) : cached_hex_id(parent, parent_end),
            name ? Py_NewRef(name) : Py_NewRef(empty_str),
            PyLong_FromLong(kind),
            PyLong_FromUnsignedLongLong(start_ns),
            PyLong_FromUnsignedLongLong(end_ns),
            PyLong_FromLong(status_code),
            status_message ? Py_NewRef(status_message) : Py_NewRef(empty_str),
            attrs ? Py_NewRef(attrs) : PyDict_New(),
            events ? Py_NewRef(events) : PyList_New(0),
            Py_NewRef(empty_resource),
            Py_NewRef(empty_str),
            PyLong_FromUnsignedLongLong(dropped),
        };
        int made = add_record(out, v);
        if (made == 0 && d->wires) made = append_wire(d, v, span_start, end, trace_id, trace_end);
        for (int i = 0; i < N_SLOTS; i++) Py_XDECREF(v[i]);
        if (made < 0) {
            fail(d, E_PYTHON);
            goto done;
        }
    }
    rc = 0;
done:
    Py_XDECREF(name);
    Py_XDECREF(attrs);
    Py_XDECREF(events);
    Py_XDECREF(status_message);
    return rc;
}

/* Sets one field of every record from index `from` on (the resource or scope of their batch). */
static int fill_slot(PyObject *out, Py_ssize_t from, int slot, PyObject *value) {
    Py_ssize_t n = PyList_GET_SIZE(out);
    for (Py_ssize_t i = from; i < n; i++) {
        PyObject *record = PyList_GET_ITEM(out, i);
        if (make_record == NULL) {
            Py_XSETREF(SLOT(record, slot), Py_NewRef(value));
        } else if (slot == S_RESOURCE ? set_resource(record, value, set_resource_closure)
                                      : set_scope_name(record, value, set_scope_name_closure)) {
            return -1;
        }
    }
    return 0;
}

static int parse_scope(Dec *d, ptr p, ptr end, PyObject **name) {
    if (enter(d) < 0) return -1;
    while (p < end) {
        uint32_t field;
        int wt;
        if (read_tag(d, &p, d->end, &field, &wt) < 0) return -1;
        if (field == 1 && wt == 2) {
            if (read_string(d, &p, d->end, name) < 0) return -1;
        } else if (field == 2 && wt == 2) {
            if (read_string_checked(d, &p, d->end) < 0) return -1;
        } else if (field == 3 && wt == 2) {
            if (check_field(d, &p, end, M_KEY_VALUE) < 0) return -1;
        } else if (skip_field(d, &p, d->end, field, wt) < 0) {
            return -1;
        }
    }
    return leave(d, p, end);
}

static int parse_scope_spans(Dec *d, ptr p, ptr end, PyObject *out) {
    if (enter(d) < 0) return -1;
    Py_ssize_t first = PyList_GET_SIZE(out);
    PyObject *scope_name = NULL, *scope = NULL, *schema_url = NULL;
    if (d->origins) d->origin = PyList_GET_SIZE(d->origins);
    int rc = -1;
    while (p < end) {
        uint32_t field;
        int wt;
        if (read_tag(d, &p, d->end, &field, &wt) < 0) goto done;
        ptr a, b;
        if (field == 1 && wt == 2) {
            if (read_len(d, &p, end, &a, &b) < 0) goto done;
            if (parse_scope(d, a, b, &scope_name) < 0) goto done;
            if (d->origins && append_bytes(d, &scope, a, b) < 0) goto done;
        } else if (field == 2 && wt == 2) {
            if (read_len(d, &p, end, &a, &b) < 0) goto done;
            if (parse_span(d, a, b, out) < 0) goto done;
        } else if (field == 3 && wt == 2) {
            if ((d->origins ? read_string(d, &p, d->end, &schema_url) : read_string_checked(d, &p, d->end)) < 0)
                goto done;
        } else if (skip_field(d, &p, d->end, field, wt) < 0) {
            goto done;
        }
    }
    if (leave(d, p, end) < 0) goto done;
    if (fill_slot(out, first, S_SCOPE_NAME, scope_name ? scope_name : empty_str) < 0) {
        fail(d, E_PYTHON);
        goto done;
    }
    if (d->origins) {
        /* The resource is filled in once its ResourceSpans is read (it may come last). */
        PyObject *origin = Py_BuildValue("(OOOO)", Py_None, Py_None, scope ? scope : empty_bytes,
                                         schema_url ? schema_url : empty_str);
        if (origin == NULL || PyList_Append(d->origins, origin) < 0) {
            Py_XDECREF(origin);
            fail(d, E_PYTHON);
            goto done;
        }
        Py_DECREF(origin);
    }
    rc = 0;
done:
    Py_XDECREF(scope_name);
    Py_XDECREF(scope);
    Py_XDECREF(schema_url);
    return rc;
}

static int parse_resource(Dec *d, ptr p, ptr end, PyObject *attrs) {
    if (enter(d) < 0) return -1;
    while (p < end) {
        uint32_t field;
        int wt;
        if (read_tag(d, &p, d->end, &field, &wt) < 0) return -1;
        if (field == 1 && wt == 2) {
            if (parse_attribute_field(d, &p, end, &attrs) < 0) return -1;
        } else if (field == 3 && wt == 2) {
            if (check_field(d, &p, end, M_ENTITY_REF) < 0) return -1;
        } else if (skip_field(d, &p, d->end, field, wt) < 0) {
            return -1;
        }
    }
    return leave(d, p, end);
}

static int parse_resource_spans(Dec *d, ptr p, ptr end, PyObject *out) {
    if (enter(d) < 0) return -1;
    Py_ssize_t first = PyList_GET_SIZE(out);
    Py_ssize_t first_origin = d->origins ? PyList_GET_SIZE(d->origins) : 0;
    /* One dict per ResourceSpans, shared by its spans. */
    PyObject *resource = PyDict_New();
    if (resource == NULL) return fail(d, E_PYTHON);
    PyObject *resource_bytes = NULL, *schema_url = NULL;
    int rc = -1;
    while (p < end) {
        uint32_t field;
        int wt;
        if (read_tag(d, &p, d->end, &field, &wt) < 0) goto done;
        ptr a, b;
        if (field == 1 && wt == 2) {
            if (read_len(d, &p, end, &a, &b) < 0) goto done;
            if (parse_resource(d, a, b, resource) < 0) goto done;
            if (d->origins && append_bytes(d, &resource_bytes, a, b) < 0) goto done;
        } else if (field == 2 && wt == 2) {
            if (read_len(d, &p, end, &a, &b) < 0) goto done;
            if (parse_scope_spans(d, a, b, out) < 0) goto done;
        } else if (field == 3 && wt == 2) {
            if ((d->origins ? read_string(d, &p, d->end, &schema_url) : read_string_checked(d, &p, d->end)) < 0)
                goto done;
        } else if (skip_field(d, &p, d->end, field, wt) < 0) {
            goto done;
        }
    }
    if (leave(d, p, end) < 0) goto done;
    if (fill_slot(out, first, S_RESOURCE, resource) < 0) {
        fail(d, E_PYTHON);
        goto done;
    }
    if (d->origins) {
        Py_ssize_t n = PyList_GET_SIZE(d->origins);
        for (Py_ssize_t i = first_origin; i < n; i++) {
            PyObject *pending = PyList_GET_ITEM(d->origins, i);
            PyObject *origin = Py_BuildValue("(OOOO)", resource_bytes ? resource_bytes : empty_bytes,
                                             schema_url ? schema_url : empty_str, PyTuple_GET_ITEM(pending, 2),
                                             PyTuple_GET_ITEM(pending, 3));
            if (origin == NULL) {
                fail(d, E_PYTHON);
                goto done;
            }
            PyList_SET_ITEM(d->origins, i, origin); /* steals origin */
            Py_DECREF(pending);
        }
    }
    rc = 0;
done:
    Py_DECREF(resource);
    Py_XDECREF(resource_bytes);
    Py_XDECREF(schema_url);
    return rc;
}

static const char *const MESSAGES_TEXT[] = {
    NULL,
    "Wire format was corrupt",
    "Exceeded upb_DecodeOptions_MaxDepth",
    "String field had bad UTF-8",
};

/* The records of a request and, when wires and origins are lists, the spans as sent. */
static PyObject *decode(PyObject *arg, PyObject *wires, PyObject *origins) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    ptr p = (ptr)view.buf, end = p + view.len;
    Dec d = {DEPTH_LIMIT, OK, end, wires, origins, 0};
    while (p < end) {
        uint32_t field;
        int wt;
        if (read_tag(&d, &p, d.end, &field, &wt) < 0) break;
        if (field == 1 && wt == 2) {
            ptr a, b;
            if (read_len(&d, &p, end, &a, &b) < 0) break;
            if (parse_resource_spans(&d, a, b, out) < 0) break;
        } else if (skip_field(&d, &p, d.end, field, wt) < 0) {
            break;
        }
    }
    PyBuffer_Release(&view);
    if (d.err == OK) return out;
    Py_DECREF(out);
    if (d.err == E_PYTHON) return NULL;
    PyErr_Format(DecodeError,
                 "Error parsing message with type 'opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest': %s",
                 MESSAGES_TEXT[d.err]);
    return NULL;
}

static PyObject *decode_request(PyObject *module, PyObject *arg) {
    return decode(arg, NULL, NULL);
}

static PyObject *decode_spans(PyObject *module, PyObject *arg) {
    PyObject *wires = PyList_New(0), *origins = PyList_New(0), *records = NULL, *result = NULL;
    if (wires != NULL && origins != NULL) records = decode(arg, wires, origins);
    if (records != NULL) result = PyTuple_Pack(3, records, wires, origins);
    Py_XDECREF(records);
    Py_XDECREF(wires);
    Py_XDECREF(origins);
    return result;
}

/* --- encoding export requests ------------------------------------------------------------ */
/* encode_spans: otel_plumb.export.annotate._encode_spans in C (the pure-Python path, which
 * tests/test_native_decoder.py holds this to, byte for byte): spans grouped back under their
 * resource and scope in order of first appearance, cut into requests of at most max_spans
 * spans and about max_bytes bytes, each request written around the spans' own bytes. */

#define GROUP_OVERHEAD 64

static PyObject *str_body, *str_origin, *str_resource, *str_scope;

static inline Py_ssize_t varint_size(Py_ssize_t n) {
    Py_ssize_t size = 1;
    for (size_t v = (size_t)n; v >= 0x80; v >>= 7) size++;
    return size;
}

static inline char *put_varint(char *out, Py_ssize_t n) {
    size_t v = (size_t)n;
    while (v >= 0x80) {
        *out++ = (char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    *out++ = (char)v;
    return out;
}

static inline char *put_field(char *out, char tag, const char *data, Py_ssize_t len) {
    *out++ = tag;
    out = put_varint(out, len);
    memcpy(out, data, (size_t)len);
    return out + len;
}

/* A wire: (serialised message, schema URL); its parts, the URL as UTF-8. */
static int wire_parts(PyObject *wire, PyObject **message, const char **url, Py_ssize_t *url_len) {
    if (!PyTuple_Check(wire) || PyTuple_GET_SIZE(wire) != 2 || !PyBytes_Check(PyTuple_GET_ITEM(wire, 0)) ||
        !PyUnicode_Check(PyTuple_GET_ITEM(wire, 1))) {
        PyErr_SetString(PyExc_TypeError, "a resource or scope is (bytes, str)");
        return -1;
    }
    *message = PyTuple_GET_ITEM(wire, 0);
    *url = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(wire, 1), url_len);
    return *url == NULL ? -1 : 0;
}

/* Size of a ScopeSpans (scope: its wire; spans: list of bytes), or -1. */
static Py_ssize_t scope_spans_size(PyObject *scope, PyObject *spans) {
    PyObject *message;
    const char *url;
    Py_ssize_t url_len;
    if (wire_parts(scope, &message, &url, &url_len) < 0) return -1;
    Py_ssize_t len = PyBytes_GET_SIZE(message), size = 1 + varint_size(len) + len;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(spans); i++) {
        Py_ssize_t n = PyBytes_GET_SIZE(PyList_GET_ITEM(spans, i));
        size += 1 + varint_size(n) + n;
    }
    if (url_len) size += 1 + varint_size(url_len) + url_len;
    return size;
}

/* Size of a ResourceSpans (resource: its wire; scopes: dict scope wire -> list of bytes), or -1. */
static Py_ssize_t resource_spans_size(PyObject *resource, PyObject *scopes) {
    PyObject *message, *scope, *spans;
    const char *url;
    Py_ssize_t url_len, pos = 0;
    if (wire_parts(resource, &message, &url, &url_len) < 0) return -1;
    Py_ssize_t len = PyBytes_GET_SIZE(message), size = 1 + varint_size(len) + len;
    while (PyDict_Next(scopes, &pos, &scope, &spans)) {
        Py_ssize_t n = scope_spans_size(scope, spans);
        if (n < 0) return -1;
        size += 1 + varint_size(n) + n;
    }
    if (url_len) size += 1 + varint_size(url_len) + url_len;
    return size;
}

/* The ExportTraceServiceRequest of groups (dict resource wire -> dict scope wire -> list of bytes). */
static PyObject *encode_groups(PyObject *groups) {
    PyObject *resource, *scopes, *scope, *spans, *message;
    const char *url;
    Py_ssize_t url_len, pos = 0, total = 0;
    while (PyDict_Next(groups, &pos, &resource, &scopes)) {
        Py_ssize_t n = resource_spans_size(resource, scopes);
        if (n < 0) return NULL;
        total += 1 + varint_size(n) + n;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) return NULL;
    char *w = PyBytes_AS_STRING(out);
    pos = 0;
    while (PyDict_Next(groups, &pos, &resource, &scopes)) {
        *w++ = 0x0a; /* ExportTraceServiceRequest.resource_spans = 1 */
        w = put_varint(w, resource_spans_size(resource, scopes));
        wire_parts(resource, &message, &url, &url_len); /* checked by resource_spans_size */
        w = put_field(w, 0x0a, PyBytes_AS_STRING(message), PyBytes_GET_SIZE(message)); /* resource = 1 */
        Py_ssize_t scope_pos = 0;
        while (PyDict_Next(scopes, &scope_pos, &scope, &spans)) {
            *w++ = 0x12; /* ResourceSpans.scope_spans = 2 */
            w = put_varint(w, scope_spans_size(scope, spans));
            const char *scope_url;
            Py_ssize_t scope_url_len;
            PyObject *scope_message;
            wire_parts(scope, &scope_message, &scope_url, &scope_url_len);
            w = put_field(w, 0x0a, PyBytes_AS_STRING(scope_message), PyBytes_GET_SIZE(scope_message)); /* scope = 1 */
            for (Py_ssize_t i = 0; i < PyList_GET_SIZE(spans); i++) {
                PyObject *span = PyList_GET_ITEM(spans, i);
                w = put_field(w, 0x12, PyBytes_AS_STRING(span), PyBytes_GET_SIZE(span)); /* spans = 2 */
            }
            if (scope_url_len) w = put_field(w, 0x1a, scope_url, scope_url_len); /* schema_url = 3 */
        }
        if (url_len) w = put_field(w, 0x1a, url, url_len); /* schema_url = 3 */
    }
    return out;
}

/* A span to encode: (body, origin) or an object with .body and .origin; origin has .resource and
 * .scope. New references in *body and *origin. */
static int span_parts(PyObject *item, PyObject **body, PyObject **origin) {
    if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == 2) {
        *body = Py_NewRef(PyTuple_GET_ITEM(item, 0));
        *origin = Py_NewRef(PyTuple_GET_ITEM(item, 1));
    } else {
        *body = PyObject_GetAttr(item, str_body);
        *origin = *body == NULL ? NULL : PyObject_GetAttr(item, str_origin);
    }
    if (*origin == NULL) return -1;
    if (!PyBytes_Check(*body)) {
        PyErr_SetString(PyExc_TypeError, "a span's body is bytes");
        return -1;
    }
    return 0;
}

/* An origin's resource and scope, checked. New references. */
static int origin_parts(PyObject *origin, PyObject **resource, PyObject **scope) {
    *resource = PyObject_GetAttr(origin, str_resource);
    *scope = *resource == NULL ? NULL : PyObject_GetAttr(origin, str_scope);
    if (*scope == NULL) return -1;
    PyObject *message;
    const char *url;
    Py_ssize_t url_len;
    return wire_parts(*resource, &message, &url, &url_len) < 0 || wire_parts(*scope, &message, &url, &url_len) < 0
               ? -1 : 0;
}

static int flush_batch(PyObject *out, PyObject **groups, Py_ssize_t count) {
    PyObject *request = encode_groups(*groups);
    if (request == NULL) return -1;
    PyObject *pair = Py_BuildValue("(Nn)", request, count);
    if (pair == NULL || PyList_Append(out, pair) < 0) {
        Py_XDECREF(pair);
        return -1;
    }
    Py_DECREF(pair);
    Py_SETREF(*groups, PyDict_New());
    return *groups == NULL ? -1 : 0;
}

static PyObject *encode_spans(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "encode_spans(spans, max_spans, max_bytes)");
        return NULL;
    }
    Py_ssize_t max_spans = PyLong_AsSsize_t(args[1]);
    if (max_spans == -1 && PyErr_Occurred()) return NULL;
    long long max_bytes = -1; /* None */
    if (args[2] != Py_None) {
        max_bytes = PyLong_AsLongLong(args[2]);
        if (max_bytes == -1 && PyErr_Occurred()) return NULL;
        if (max_bytes < 0) max_bytes = 0; /* never None: every span then goes alone */
    }
    PyObject *it = PyObject_GetIter(args[0]);
    if (it == NULL) return NULL;
    PyObject *out = PyList_New(0), *groups = PyDict_New(), *item;
    /* The last span's origin, group and list: a batch holds runs of spans of one origin, and the
     * processor keeps one Origin object per distinct resource and scope, so most spans skip the
     * lookups (each hashes and compares the serialised resource and scope). */
    PyObject *origin = NULL, *resource = NULL, *scope = NULL, *group = NULL, *spans = NULL;
    Py_ssize_t count = 0;
    long long size = 0;
    if (out == NULL || groups == NULL) goto error;
    while ((item = PyIter_Next(it)) != NULL) {
        PyObject *body = NULL, *next_origin = NULL;
        int bad = span_parts(item, &body, &next_origin);
        Py_DECREF(item);
        if (!bad && next_origin != origin) {
            Py_XSETREF(origin, next_origin);
            next_origin = NULL;
            Py_CLEAR(resource);
            Py_CLEAR(scope);
            group = spans = NULL;
            bad = origin_parts(origin, &resource, &scope);
        }
        Py_XDECREF(next_origin);
        if (bad) {
            Py_XDECREF(body);
            goto error;
        }
        Py_ssize_t body_len = PyBytes_GET_SIZE(body);
        Py_ssize_t resource_len = PyBytes_GET_SIZE(PyTuple_GET_ITEM(resource, 0));
        Py_ssize_t scope_len = PyBytes_GET_SIZE(PyTuple_GET_ITEM(scope, 0));
        long long extra = body_len + 6;
        if (group == NULL) { /* borrowed from groups */
            group = PyDict_GetItemWithError(groups, resource);
            if (group == NULL && PyErr_Occurred()) goto error_span;
            spans = NULL;
        }
        if (spans == NULL && group != NULL) { /* borrowed from group */
            spans = PyDict_GetItemWithError(group, scope);
            if (spans == NULL && PyErr_Occurred()) goto error_span;
        }
        if (max_bytes >= 0) {
            if (group == NULL) extra += resource_len + GROUP_OVERHEAD;
            if (spans == NULL) extra += scope_len + GROUP_OVERHEAD;
        }
        if (count && (count >= max_spans || (max_bytes >= 0 && size + extra > max_bytes))) {
            if (flush_batch(out, &groups, count) < 0) goto error_span;
            count = 0;
            size = 0;
            group = spans = NULL;
            /* the wrappers go into the new request as well */
            if (max_bytes >= 0) extra = body_len + 6 + resource_len + scope_len + 2 * GROUP_OVERHEAD;
        }
        size += extra;
        if (group == NULL) {
            group = PyDict_New();
            if (group == NULL || PyDict_SetItem(groups, resource, group) < 0) {
                Py_XDECREF(group);
                group = NULL;
                goto error_span;
            }
            Py_DECREF(group); /* held by groups */
        }
        if (spans == NULL) {
            spans = PyList_New(0);
            if (spans == NULL || PyDict_SetItem(group, scope, spans) < 0) {
                Py_XDECREF(spans);
                goto error_span;
            }
            Py_DECREF(spans); /* held by group */
        }
        if (PyList_Append(spans, body) < 0) goto error_span;
        count++;
        Py_DECREF(body);
        continue;
    error_span:
        Py_DECREF(body);
        goto error;
    }
    Py_XDECREF(origin);
    Py_XDECREF(resource);
    Py_XDECREF(scope);
    if (PyErr_Occurred()) goto error;
    if (count && flush_batch(out, &groups, count) < 0) goto error;
    Py_DECREF(it);
    Py_DECREF(groups);
    return out;
error:
    Py_XDECREF(origin);
    Py_XDECREF(resource);
    Py_XDECREF(scope);
    Py_DECREF(it);
    Py_XDECREF(out);
    Py_XDECREF(groups);
    return NULL;
}

/* --- span annotations -------------------------------------------------------------------- */
/* span_addition: otel_plumb.export.annotate.span_addition in C (held to the pure-Python one,
 * byte for byte, by tests/test_native_decoder.py): a serialised Span holding only the given
 * attributes and events, values written as receive.otlp.to_any_value writes them. */

#define VALUE_DEPTH_LIMIT 500 /* nested lists and maps: below Python's recursion limit */

typedef struct {
    char *w;     /* NULL while measuring */
    Py_ssize_t size;
} Out;

static inline void out_byte(Out *o, char b) {
    if (o->w) *o->w++ = b;
    o->size++;
}

static inline void out_varint(Out *o, uint64_t v) {
    do {
        char b = (char)(v & 0x7F);
        v >>= 7;
        out_byte(o, v ? (char)(b | 0x80) : b);
    } while (v);
}

static inline void out_data(Out *o, const char *data, Py_ssize_t len) {
    if (o->w) {
        memcpy(o->w, data, (size_t)len);
        o->w += len;
    }
    o->size += len;
}

/* Text as UTF-8, a lone surrogate written as its escape (str.encode("utf-8", "backslashreplace")).
 * *holder: a bytes object to release when the UTF-8 is not the str's own. */
static const char *utf8_of(PyObject *text, Py_ssize_t *len, PyObject **holder) {
    *holder = NULL;
    const char *data = PyUnicode_AsUTF8AndSize(text, len);
    if (data != NULL) return data;
    if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) return NULL;
    PyErr_Clear();
    *holder = PyUnicode_AsEncodedString(text, "utf-8", "backslashreplace");
    if (*holder == NULL) return NULL;
    *len = PyBytes_GET_SIZE(*holder);
    return PyBytes_AS_STRING(*holder);
}

static int out_text_field(Out *o, char tag, PyObject *text) {
    Py_ssize_t len;
    PyObject *holder;
    const char *data = utf8_of(text, &len, &holder);
    if (data == NULL) return -1;
    out_byte(o, tag);
    out_varint(o, (uint64_t)len);
    out_data(o, data, len);
    Py_XDECREF(holder);
    return 0;
}

static int any_value(Out *o, PyObject *v, int depth);

/* A length-delimited field whose body a BODY(target) macro writes: measured first (its length
 * comes before it), then written. O(size x nesting depth). */
#define NESTED(o, tag, BODY)                                        \
    do {                                                            \
        Out m_ = {NULL, 0};                                         \
        if (BODY((&m_)) < 0) return -1;                             \
        out_byte((o), (tag));                                       \
        out_varint((o), (uint64_t)m_.size);                         \
        if ((o)->w) {                                               \
            Out w_ = {(o)->w, 0};                                   \
            if (BODY((&w_)) < 0) return -1;                         \
            (o)->w = w_.w;                                          \
        }                                                           \
        (o)->size += m_.size;                                       \
    } while (0)

static int key_value(Out *o, PyObject *key, PyObject *value, int depth) {
    if (!PyUnicode_Check(key)) {
        PyErr_Format(PyExc_AttributeError, "'%.100s' object has no attribute 'encode'", Py_TYPE(key)->tp_name);
        return -1;
    }
    if (PyUnicode_GET_LENGTH(key) && out_text_field(o, 0x0a, key) < 0) return -1; /* key = 1 */
#define VALUE_BODY(t) any_value((t), value, depth)
    NESTED(o, 0x12, VALUE_BODY); /* value = 2 */
#undef VALUE_BODY
    return 0;
}

static int array_body(Out *o, PyObject *seq, int depth) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
#define ITEM_BODY(t) any_value((t), items[i], depth + 1)
        NESTED(o, 0x0a, ITEM_BODY); /* ArrayValue.values = 1 */
#undef ITEM_BODY
    }
    return 0;
}

static int kvlist_body(Out *o, PyObject *dict, int depth) {
    Py_ssize_t pos = 0;
    PyObject *k, *x;
    while (PyDict_Next(dict, &pos, &k, &x)) {
#define PAIR_BODY(t) key_value((t), k, x, depth + 1)
        NESTED(o, 0x0a, PAIR_BODY); /* KeyValueList.values = 1 */
#undef PAIR_BODY
    }
    return 0;
}

static int any_value(Out *o, PyObject *v, int depth) {
    if (depth > VALUE_DEPTH_LIMIT) {
        PyErr_SetString(PyExc_RecursionError, "maximum recursion depth exceeded while encoding an annotation");
        return -1;
    }
    if (PyBool_Check(v)) {
        out_byte(o, 0x10); /* bool_value = 2 */
        out_byte(o, v == Py_True ? 1 : 0);
        return 0;
    }
    if (PyLong_Check(v)) {
        int overflow;
        long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (n == -1 && PyErr_Occurred()) return -1;
        if (overflow) {
            PyErr_Format(PyExc_ValueError, "integer %S is out of the int64 range", v);
            return -1;
        }
        out_byte(o, 0x18); /* int_value = 3 */
        out_varint(o, (uint64_t)n);
        return 0;
    }
    if (PyFloat_Check(v)) {
        double d = PyFloat_AS_DOUBLE(v);
        char le[8];
        if (PyFloat_Pack8(d, le, 1) < 0) return -1;
        out_byte(o, 0x21); /* double_value = 4 */
        out_data(o, le, 8);
        return 0;
    }
    if (PyBytes_Check(v)) {
        out_byte(o, 0x3a); /* bytes_value = 7 */
        out_varint(o, (uint64_t)PyBytes_GET_SIZE(v));
        out_data(o, PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v));
        return 0;
    }
    if (PyList_Check(v) || PyTuple_Check(v)) {
#define ARRAY_BODY(t) array_body((t), v, depth)
        NESTED(o, 0x2a, ARRAY_BODY); /* array_value = 5 */
#undef ARRAY_BODY
        return 0;
    }
    if (PyDict_Check(v)) {
#define KVLIST_BODY(t) kvlist_body((t), v, depth)
        NESTED(o, 0x32, KVLIST_BODY); /* kvlist_value = 6 */
#undef KVLIST_BODY
        return 0;
    }
    PyObject *text = v == Py_None ? Py_NewRef(empty_str) : PyObject_Str(v);
    if (text == NULL) return -1;
    int rc = out_text_field(o, 0x0a, text); /* string_value = 1 */
    Py_DECREF(text);
    return rc;
}

/* One event: (name, time_ns, attributes). */
static int event_body(Out *o, PyObject *event) {
    if (!PyTuple_Check(event) || PyTuple_GET_SIZE(event) != 3 || !PyDict_Check(PyTuple_GET_ITEM(event, 2))) {
        PyErr_SetString(PyExc_TypeError, "an event is (name, time_ns, attributes)");
        return -1;
    }
    PyObject *name = PyTuple_GET_ITEM(event, 0), *time_ns = PyTuple_GET_ITEM(event, 1);
    int has_time = PyObject_IsTrue(time_ns);
    if (has_time < 0) return -1;
    if (has_time) {
        unsigned long long t = PyLong_AsUnsignedLongLong(time_ns);
        if (t == (unsigned long long)-1 && PyErr_Occurred()) return -1;
        char le[8];
        for (int i = 0; i < 8; i++) le[i] = (char)((t >> (8 * i)) & 0xFF);
        out_byte(o, 0x09); /* Event.time_unix_nano = 1 (fixed64) */
        out_data(o, le, 8);
    }
    int has_name = PyObject_IsTrue(name);
    if (has_name < 0) return -1;
    if (has_name) {
        if (!PyUnicode_Check(name)) {
            PyErr_SetString(PyExc_TypeError, "an event name is str");
            return -1;
        }
        if (out_text_field(o, 0x12, name) < 0) return -1; /* Event.name = 2 */
    }
    Py_ssize_t pos = 0;
    PyObject *k, *x;
    while (PyDict_Next(PyTuple_GET_ITEM(event, 2), &pos, &k, &x)) {
#define ATTR_BODY(t) key_value((t), k, x, 0)
        NESTED(o, 0x1a, ATTR_BODY); /* Event.attributes = 3 */
#undef ATTR_BODY
    }
    return 0;
}

static int addition_body(Out *o, PyObject *attributes, PyObject *events) {
    Py_ssize_t pos = 0;
    PyObject *k, *x;
    while (PyDict_Next(attributes, &pos, &k, &x)) {
#define ATTR_BODY(t) key_value((t), k, x, 0)
        NESTED(o, 0x4a, ATTR_BODY); /* Span.attributes = 9 */
#undef ATTR_BODY
    }
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(events); i++) {
        PyObject *event = PySequence_Fast_GET_ITEM(events, i);
#define EVENT_BODY(t) event_body((t), event)
        NESTED(o, 0x5a, EVENT_BODY); /* Span.events = 11 */
#undef EVENT_BODY
    }
    return 0;
}

static PyObject *span_addition(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2 || !PyDict_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "span_addition(attributes: dict, events=())");
        return NULL;
    }
    PyObject *events = nargs == 2 ? PySequence_Fast(args[1], "events must be iterable") : PyTuple_New(0);
    if (events == NULL) return NULL;
    Out measure = {NULL, 0};
    PyObject *out = NULL;
    if (addition_body(&measure, args[0], events) == 0) {
        out = PyBytes_FromStringAndSize(NULL, measure.size);
        if (out != NULL) {
            Out write = {PyBytes_AS_STRING(out), 0};
            if (addition_body(&write, args[0], events) < 0 || write.size != measure.size) {
                if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "an annotation changed while encoded");
                Py_CLEAR(out);
            }
        }
    }
    Py_DECREF(events);
    return out;
}

/* --- module ------------------------------------------------------------------------------- */

/* The compiled SpanRecord: made by model.span.decoded, its resource and scope set through their
 * descriptors' setters. */
static int bind_compiled_record(PyObject *module, PyObject *cls) {
    static const char *const names[] = {"resource", "scope_name"};
    setter *setters[] = {&set_resource, &set_scope_name};
    void **closures[] = {&set_resource_closure, &set_scope_name_closure};
    for (int i = 0; i < 2; i++) {
        PyObject *descr = PyObject_GetAttrString(cls, names[i]);
        if (descr == NULL) return -1;
        /* The type holds its descriptors, and they their getset definitions, as long as it lives. */
        int ok = Py_IS_TYPE(descr, &PyGetSetDescr_Type) && ((PyGetSetDescrObject *)descr)->d_getset->set != NULL;
        if (ok) {
            *setters[i] = ((PyGetSetDescrObject *)descr)->d_getset->set;
            *closures[i] = ((PyGetSetDescrObject *)descr)->d_getset->closure;
        }
        Py_DECREF(descr);
        if (!ok) {
            PyErr_Format(PyExc_ImportError, "the compiled SpanRecord.%s cannot be set", names[i]);
            return -1;
        }
    }
    make_record = PyObject_GetAttrString(module, "decoded");
    if (make_record == NULL) return -1;
    SpanRecordType = (PyTypeObject *)Py_NewRef(cls);
    return 0;
}

/* SpanRecord as the core has it: the compiled class (its fields are descriptors of the core's
 * own), or a plain class whose slots are filled by offset, which must be exactly those above. */
static int bind_span_record(PyObject *module, PyObject *cls) {
    if (!PyType_Check(cls)) {
        PyErr_SetString(PyExc_ImportError, "SpanRecord is not a class");
        return -1;
    }
    PyObject *first = PyObject_GetAttrString(cls, RECORD_SLOTS[0]);
    if (first == NULL) return -1;
    int compiled = Py_IS_TYPE(first, &PyGetSetDescr_Type);
    Py_DECREF(first);
    if (compiled) return bind_compiled_record(module, cls);
    PyObject *slots = PyObject_GetAttrString(cls, "__slots__");
    if (slots == NULL) return -1;
    PyObject *have = PySet_New(slots);
    Py_DECREF(slots);
    if (have == NULL) return -1;
    Py_ssize_t count = PySet_GET_SIZE(have);
    Py_DECREF(have);
    if (count != N_SLOTS) {
        PyErr_SetString(PyExc_ImportError, "SpanRecord's slots are not the ones this decoder fills: rebuild it");
        return -1;
    }
    for (int i = 0; i < N_SLOTS; i++) {
        PyObject *descr = PyObject_GetAttrString(cls, RECORD_SLOTS[i]);
        if (descr == NULL) return -1;
        int ok = Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
                 ((PyMemberDescrObject *)descr)->d_member->type == T_OBJECT_EX;
        if (ok) slot_offset[i] = ((PyMemberDescrObject *)descr)->d_member->offset;
        Py_DECREF(descr);
        if (!ok) {
            PyErr_Format(PyExc_ImportError, "SpanRecord.%s is not a slot", RECORD_SLOTS[i]);
            return -1;
        }
    }
    SpanRecordType = (PyTypeObject *)Py_NewRef(cls);
    return 0;
}

static PyMethodDef methods[] = {
    {"decode_request", decode_request, METH_O,
     "decode_request(data) -> list[SpanRecord]: the spans of a serialized ExportTraceServiceRequest.\n"
     "Raises google.protobuf.message.DecodeError on malformed bytes."},
    {"decode_spans", decode_spans, METH_O,
     "decode_spans(data) -> (records, spans, origins): decode_request's records, with each span as sent\n"
     "(its bytes, its trace id's bytes, the index of its origin, model.span.fingerprint of its record)\n"
     "and each ScopeSpans' origin (resource bytes, resource schema URL, scope bytes, scope schema URL).\n"
     "The same errors as decode_request."},
    {"encode_spans", (PyCFunction)(void (*)(void))encode_spans, METH_FASTCALL,
     "encode_spans(spans, max_spans, max_bytes) -> list[(bytes, int)]: serialised\n"
     "ExportTraceServiceRequests of the spans ((body, origin) pairs, or objects with .body and .origin;\n"
     "an origin has .resource and .scope, each (bytes, schema URL)), as otel_plumb.export.annotate\n"
     "groups and cuts them."},
    {"span_addition", (PyCFunction)(void (*)(void))span_addition, METH_FASTCALL,
     "span_addition(attributes, events=()) -> bytes: a serialised Span holding only these attributes and\n"
     "events ((name, time_ns, attributes) each), as otel_plumb.export.annotate.span_addition writes it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_otlp_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit__otlp_native(void) {
    PyObject *span = PyImport_ImportModule("otel_plumb.model.span");
    if (span == NULL) return NULL;
    PyObject *record = PyObject_GetAttrString(span, "SpanRecord");
    SpanEventType = PyObject_GetAttrString(span, "SpanEvent");
    empty_resource = PyDict_New();
    int bound = record != NULL && SpanEventType != NULL && empty_resource != NULL && bind_span_record(span, record) == 0;
    Py_XDECREF(record);
    Py_DECREF(span);
    if (!bound) return NULL;
    PyObject *message = PyImport_ImportModule("google.protobuf.message");
    if (message == NULL) return NULL;
    DecodeError = PyObject_GetAttrString(message, "DecodeError");
    Py_DECREF(message);
    if (DecodeError == NULL) return NULL;
    str_body = PyUnicode_InternFromString("body");
    str_origin = PyUnicode_InternFromString("origin");
    str_resource = PyUnicode_InternFromString("resource");
    str_scope = PyUnicode_InternFromString("scope");
    if (str_body == NULL || str_origin == NULL || str_resource == NULL || str_scope == NULL) return NULL;
    empty_str = PyUnicode_New(0, 0);
    empty_bytes = PyBytes_FromStringAndSize(NULL, 0);
    if (empty_str == NULL || empty_bytes == NULL) return NULL;
    return PyModule_Create(&module_def);
}
