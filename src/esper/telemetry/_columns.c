/* Event Structs -> Arrow column buffers, in one native pass (optional accelerator).
 *
 * The writer thread's largest cost is turning Python event objects into Arrow columns:
 * Arrow's own converter pays 20-45 ns per Python value. This module reads each field
 * straight from the frozen msgspec Struct's slot (the offset of its member descriptor)
 * and appends it to a plain buffer, so the per-value price is a type check and a store.
 * Python then wraps the buffers as Arrow arrays without copying
 * (:mod:`esper.telemetry.arrow_schema`).
 *
 * It handles exactly the value shapes the event catalogue uses and nothing else: exact
 * int (int64), exact float, True/False, str, and lists of those. Any other value (an int
 * that overflows int64, an int in a float field, a tuple for a list, a str that cannot be
 * encoded as UTF-8, ...) makes convert() return None, and the caller converts that slice
 * with pyarrow instead: the same table, or the same error, as without this module.
 *
 * Buffers follow Arrow's layout: int64/float64 values, bit-packed booleans (least
 * significant bit first), int32 offsets for strings and lists.
 *
 * convert_many() converts a whole batch (every type, every slice) in one call and reads
 * most values with the GIL released, so the trainer's thread runs while the writer
 * converts. That pass only reads what cannot change or be freed under it: the events
 * are frozen Structs held by a private copy of each slice, and it takes only exact
 * ints, floats, True/False and compact ASCII strs (immutable objects, read without any
 * call that needs the interpreter). A column with any other value, and every list
 * column (a list can be changed in place), is converted afterwards with the GIL held.
 * The buffers use the raw allocator, which needs no GIL.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    char *data;
    Py_ssize_t len;
    Py_ssize_t cap;
} Buf;

/* Kinds, one byte per field (see arrow_schema._FIELD_KINDS). */
enum {
    K_INT = 'q', K_FLOAT = 'd', K_BOOL = '?', K_STR = 's',
    K_LIST_INT = 'Q', K_LIST_FLOAT = 'D', K_LIST_BOOL = 'B', K_LIST_STR = 'S',
};

/* Largest offset an int32-offset Arrow array may hold. */
#define MAX_OFFSET INT32_MAX
#define MIN_CAPACITY 64

typedef struct {
    char kind;
    Py_ssize_t offset; /* byte offset of the field's slot in the Struct instance */
    Buf a, b, c;       /* see the layout per kind in column_to_python() */
    Py_ssize_t bits;   /* booleans appended so far (K_BOOL: a; K_LIST_BOOL: b) */
    PyObject **cells;  /* list columns: each event's list, read by the GIL-free pass */
} Column;

/* 0, or -1 when memory ran out (no Python error set: it may run without the GIL). */
static int
buf_reserve(Buf *buf, Py_ssize_t extra)
{
    if (buf->len + extra <= buf->cap) {
        return 0;
    }
    Py_ssize_t cap = buf->cap ? buf->cap : MIN_CAPACITY;
    while (cap < buf->len + extra) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            return -1;
        }
        cap *= 2;
    }
    char *data = PyMem_RawRealloc(buf->data, (size_t)cap);
    if (data == NULL) {
        return -1;
    }
    buf->data = data;
    buf->cap = cap;
    return 0;
}

static int
buf_put(Buf *buf, const void *src, Py_ssize_t size)
{
    if (buf_reserve(buf, size) < 0) {
        return -1;
    }
    memcpy(buf->data + buf->len, src, (size_t)size);
    buf->len += size;
    return 0;
}

static int
put_offset(Buf *buf, Py_ssize_t value)
{
    int32_t v = (int32_t)value;
    return buf_put(buf, &v, sizeof v);
}

/* Status of one append: appended; not a fast-path value (fall back to pyarrow); a value
 * the GIL-free pass leaves to the pass with the GIL; a Python error set; out of memory
 * (no error set yet: the caller sets it once it holds the GIL). */
enum { OK = 0, FALLBACK = 1, NEEDS_GIL = 2, ERROR = -1, NO_MEMORY = -2 };

static int
put_int(Buf *buf, PyObject *v)
{
    if (!PyLong_CheckExact(v)) {
        return FALLBACK;
    }
    /* On an exact int this only reads its digits: it cannot fail (so no PyErr_Occurred,
     * which needs the GIL) and reports only overflow. */
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) {
        return FALLBACK;
    }
    int64_t y = (int64_t)x;
    return buf_put(buf, &y, sizeof y) < 0 ? NO_MEMORY : OK;
}

static int
put_float(Buf *buf, PyObject *v)
{
    if (!PyFloat_CheckExact(v)) {
        return FALLBACK;
    }
    double x = PyFloat_AS_DOUBLE(v);
    return buf_put(buf, &x, sizeof x) < 0 ? NO_MEMORY : OK;
}

static int
put_bool(Buf *buf, Py_ssize_t *bits, PyObject *v)
{
    if (v != Py_True && v != Py_False) {
        return FALLBACK;
    }
    if ((*bits & 7) == 0) {
        char zero = 0;
        if (buf_put(buf, &zero, 1) < 0) {
            return NO_MEMORY;
        }
    }
    if (v == Py_True) {
        buf->data[*bits >> 3] |= (char)(1 << (*bits & 7));
    }
    (*bits)++;
    return OK;
}

/* UTF-8 bytes into data, the new end offset into offsets. */
static int
put_bytes(Buf *offsets, Buf *data, const char *utf8, Py_ssize_t size)
{
    if (size > MAX_OFFSET - data->len) {
        return FALLBACK;
    }
    if (buf_put(data, utf8, size) < 0 || put_offset(offsets, data->len) < 0) {
        return NO_MEMORY;
    }
    return OK;
}

/* One string (the GIL held): its UTF-8 bytes, see put_bytes(). */
static int
put_str(Buf *offsets, Buf *data, PyObject *v)
{
    if (!PyUnicode_Check(v)) {
        return FALLBACK;
    }
    Py_ssize_t size = 0;
    const char *utf8 = PyUnicode_AsUTF8AndSize(v, &size);
    if (utf8 == NULL) { /* lone surrogates: let pyarrow raise its own error */
        PyErr_Clear();
        return FALLBACK;
    }
    return put_bytes(offsets, data, utf8, size);
}

/* One scalar of ``kind``: numbers and booleans into ``values``; a string's end offset
 * into ``values`` and its bytes into ``data``. A column's own values use its buffers a
 * and b; a list column's items use b and c (a holds the list offsets). */
static int
put_scalar(char kind, Buf *values, Buf *data, Py_ssize_t *bits, PyObject *v)
{
    switch (kind) {
    case K_INT:
        return put_int(values, v);
    case K_FLOAT:
        return put_float(values, v);
    case K_BOOL:
        return put_bool(values, bits, v);
    default:
        return put_str(values, data, v);
    }
}

static char
item_kind_of(char list_kind)
{
    switch (list_kind) {
    case K_LIST_INT:
        return K_INT;
    case K_LIST_FLOAT:
        return K_FLOAT;
    case K_LIST_BOOL:
        return K_BOOL;
    default:
        return K_STR;
    }
}

static Py_ssize_t
list_items(Column *col)
{
    switch (col->kind) {
    case K_LIST_INT:
    case K_LIST_FLOAT:
        return col->b.len / 8;
    case K_LIST_BOOL:
        return col->bits;
    default:
        return col->b.len / (Py_ssize_t)sizeof(int32_t) - 1;
    }
}

static int
put_list(Column *col, PyObject *v)
{
    if (!PyList_CheckExact(v)) {
        return FALLBACK;
    }
    char item_kind = item_kind_of(col->kind);
    Py_ssize_t n = PyList_GET_SIZE(v);
    for (Py_ssize_t i = 0; i < n; i++) {
        int status = put_scalar(item_kind, &col->b, &col->c, &col->bits, PyList_GET_ITEM(v, i));
        if (status != OK) {
            return status;
        }
    }
    Py_ssize_t end = list_items(col);
    if (end > MAX_OFFSET) {
        return FALLBACK;
    }
    return put_offset(&col->a, end) < 0 ? NO_MEMORY : OK;
}

static int
is_list_kind(char kind)
{
    return kind == K_LIST_INT || kind == K_LIST_FLOAT || kind == K_LIST_BOOL
           || kind == K_LIST_STR;
}

static int
put_value(Column *col, PyObject *v)
{
    if (is_list_kind(col->kind)) {
        return put_list(col, v);
    }
    return put_scalar(col->kind, &col->a, &col->b, &col->bits, v);
}

/* One value without the GIL: exact ints, floats, booleans and compact ASCII strs (their
 * bytes are the object's own, immutable); NEEDS_GIL for any other str and every list. */
static int
put_value_unlocked(Column *col, PyObject *v)
{
    switch (col->kind) {
    case K_INT:
        return put_int(&col->a, v);
    case K_FLOAT:
        return put_float(&col->a, v);
    case K_BOOL:
        return put_bool(&col->a, &col->bits, v);
    case K_STR:
        if (!PyUnicode_CheckExact(v) || !PyUnicode_IS_COMPACT_ASCII(v)) {
            return NEEDS_GIL;
        }
        return put_bytes(&col->a, &col->b, PyUnicode_DATA(v), PyUnicode_GET_LENGTH(v));
    default:
        return NEEDS_GIL;
    }
}

/* Start a column of n rows: its fixed-width buffer reserved at its final size (no
 * copy as it grows), offset buffers with their first 0 entry (Arrow's offsets have
 * length + 1 entries). -1: out of memory. */
static int
column_start(Column *col, Py_ssize_t n)
{
    switch (col->kind) {
    case K_INT:
    case K_FLOAT:
        return buf_reserve(&col->a, n * 8);
    case K_BOOL:
        return buf_reserve(&col->a, (n + 7) / 8);
    case K_STR:
    case K_LIST_INT:
    case K_LIST_FLOAT:
    case K_LIST_BOOL:
        return buf_reserve(&col->a, (n + 1) * 4) < 0 ? -1 : put_offset(&col->a, 0);
    default: /* K_LIST_STR: list offsets in a, string offsets in b */
        if (buf_reserve(&col->a, (n + 1) * 4) < 0 || put_offset(&col->a, 0) < 0) {
            return -1;
        }
        return put_offset(&col->b, 0);
    }
}

/* A read-only buffer-protocol object owning converted bytes: the column's memory goes
 * to Arrow as it is (pa.py_buffer keeps the object alive), instead of being copied
 * into a bytes object. */
typedef struct {
    PyObject_HEAD
    char *data; /* raw allocator */
    Py_ssize_t len;
} Owned;

static int
owned_getbuffer(PyObject *self, Py_buffer *view, int flags)
{
    Owned *owned = (Owned *)self;
    return PyBuffer_FillInfo(view, self, owned->data, owned->len, 1, flags);
}

static void
owned_dealloc(PyObject *self)
{
    PyMem_RawFree(((Owned *)self)->data);
    Py_TYPE(self)->tp_free(self);
}

static PyBufferProcs owned_as_buffer = {owned_getbuffer, NULL};

static PyTypeObject OwnedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "esper.telemetry._columns.Owned",
    .tp_basicsize = sizeof(Owned),
    .tp_dealloc = owned_dealloc,
    .tp_as_buffer = &owned_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Bytes of one converted column buffer (buffer protocol, read-only).",
};

/* The buffer's bytes as an Owned object, which takes the memory over (buf is emptied). */
static PyObject *
buf_take(Buf *buf)
{
    if (buf->data == NULL && buf_reserve(buf, 1) < 0) { /* never a NULL pointer */
        return PyErr_NoMemory();
    }
    Owned *owned = PyObject_New(Owned, &OwnedType);
    if (owned == NULL) {
        return NULL;
    }
    owned->data = buf->data;
    owned->len = buf->len;
    buf->data = NULL;
    buf->len = buf->cap = 0;
    return (PyObject *)owned;
}

/* A tuple of two new references, which it takes over (NULL if either is NULL). */
static PyObject *
pair(PyObject *first, PyObject *second)
{
    PyObject *out = (first && second) ? PyTuple_Pack(2, first, second) : NULL;
    Py_XDECREF(first);
    Py_XDECREF(second);
    return out;
}

/* int/float/bool: the values' bytes; str: (offsets, data). Takes the buffers over. */
static PyObject *
scalars_to_python(char kind, Buf *values, Buf *data)
{
    if (kind == K_STR) {
        return pair(buf_take(values), buf_take(data));
    }
    return buf_take(values);
}

/* A scalar column as above; a list column: (list offsets, its items as above). */
static PyObject *
column_to_python(Column *col)
{
    if (is_list_kind(col->kind)) {
        PyObject *items = scalars_to_python(item_kind_of(col->kind), &col->b, &col->c);
        return pair(buf_take(&col->a), items);
    }
    return scalars_to_python(col->kind, &col->a, &col->b);
}

static void
columns_free(Column *cols, Py_ssize_t n)
{
    if (cols == NULL) {
        return;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyMem_RawFree(cols[i].a.data);
        PyMem_RawFree(cols[i].b.data);
        PyMem_RawFree(cols[i].c.data);
        PyMem_RawFree(cols[i].cells);
    }
    PyMem_RawFree(cols);
}

/* Empty a column of n rows again (its buffers kept), for a new pass; -1: no memory. */
static int
column_restart(Column *col, Py_ssize_t n)
{
    col->a.len = col->b.len = col->c.len = 0;
    col->bits = 0;
    return column_start(col, n);
}

static int
is_known_kind(char kind)
{
    return kind == K_INT || kind == K_FLOAT || kind == K_BOOL || kind == K_STR
           || is_list_kind(kind);
}

/* Columns set up from the field descriptors and kinds; NULL with an error set. */
static Column *
columns_new(PyObject *cls, PyObject *descrs, const char *kinds, Py_ssize_t n_fields,
            Py_ssize_t n)
{
    Column *cols = PyMem_RawCalloc((size_t)(n_fields ? n_fields : 1), sizeof(Column));
    if (cols == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    for (Py_ssize_t f = 0; f < n_fields; f++) {
        PyObject *d = PyTuple_GET_ITEM(descrs, f);
        if (!PyObject_TypeCheck(d, &PyMemberDescr_Type)
            || ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX) {
            PyErr_Format(PyExc_TypeError, "field %zd is not an object slot", f);
            goto fail;
        }
        /* A slot of cls or a base: its offset lies inside every instance of cls. */
        if (!PyType_IsSubtype((PyTypeObject *)cls, PyDescr_TYPE(d))) {
            PyErr_Format(PyExc_TypeError, "field %zd is not a slot of %R", f, cls);
            goto fail;
        }
        if (!is_known_kind(kinds[f])) {
            PyErr_Format(PyExc_ValueError, "unknown column kind %c", kinds[f]);
            goto fail;
        }
        cols[f].kind = kinds[f];
        cols[f].offset = ((PyMemberDescrObject *)d)->d_member->offset;
        if (is_list_kind(kinds[f])
            && (cols[f].cells = PyMem_RawMalloc((size_t)(n ? n : 1) * sizeof(PyObject *)))
                   == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        if (column_start(&cols[f], n) < 0) {
            PyErr_NoMemory();
            goto fail;
        }
    }
    return cols;
fail:
    columns_free(cols, n_fields);
    return NULL;
}

/* One slice of one type to convert. */
typedef struct {
    PyObject *cls;
    PyObject *events; /* a private copy of the slice: nothing else can change it */
    Column *cols;
    Py_ssize_t n_fields;
    char *deferred; /* per column: left to the pass with the GIL */
    Py_ssize_t n;     /* events */
    int status;
} Job;

static void
job_clear(Job *job)
{
    Py_CLEAR(job->cls);
    Py_CLEAR(job->events);
    columns_free(job->cols, job->n_fields);
    job->cols = NULL;
    PyMem_RawFree(job->deferred);
    job->deferred = NULL;
}

/* Set up a job from (cls, events, descriptors, kinds, start, stop); -1 with an error. */
static int
job_init(Job *job, PyObject *spec)
{
    PyObject *cls, *events, *descrs;
    const char *kinds;
    Py_ssize_t n_kinds, start, stop;
    memset(job, 0, sizeof *job);
    if (!PyTuple_Check(spec)) {
        PyErr_SetString(PyExc_TypeError, "a job is a tuple");
        return -1;
    }
    if (!PyArg_ParseTuple(spec, "O!O!O!y#nn", &PyType_Type, &cls, &PyList_Type, &events,
                          &PyTuple_Type, &descrs, &kinds, &n_kinds, &start, &stop)) {
        return -1;
    }
    Py_ssize_t n_fields = PyTuple_GET_SIZE(descrs);
    if (n_kinds != n_fields) {
        PyErr_SetString(PyExc_ValueError, "one kind per descriptor");
        return -1;
    }
    if (start < 0 || stop < start || stop > PyList_GET_SIZE(events)) {
        PyErr_SetString(PyExc_IndexError, "slice out of range");
        return -1;
    }
    job->cls = Py_NewRef(cls);
    job->n_fields = n_fields;
    job->cols = columns_new(cls, descrs, kinds, n_fields, stop - start);
    job->deferred = PyMem_RawCalloc((size_t)(n_fields ? n_fields : 1), 1);
    job->events = PyList_GetSlice(events, start, stop);
    job->n = stop - start;
    if (job->cols == NULL || job->deferred == NULL || job->events == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_NoMemory();
        }
        job_clear(job);
        return -1;
    }
    return 0;
}

/* The pass without the GIL: every event's type, and each column's values while they
 * need no GIL; a column that meets one that does is deferred (emptied later). */
static void
job_scan_unlocked(Job *job)
{
    for (Py_ssize_t f = 0; f < job->n_fields; f++) {
        job->deferred[f] = is_list_kind(job->cols[f].kind);
    }
    Py_ssize_t n = job->n;
    for (Py_ssize_t i = 0; i < n && job->status == OK; i++) {
        PyObject *event = PyList_GET_ITEM(job->events, i);
        if ((PyObject *)Py_TYPE(event) != job->cls) {
            job->status = FALLBACK;
            break;
        }
        for (Py_ssize_t f = 0; f < job->n_fields; f++) {
            Column *col = &job->cols[f];
            PyObject *v = *(PyObject **)((char *)event + col->offset);
            if (col->cells != NULL) { /* a list: only its pointer now */
                col->cells[i] = v;
                continue;
            }
            if (job->deferred[f]) {
                continue;
            }
            int status = v == NULL ? FALLBACK : put_value_unlocked(col, v);
            if (status == NEEDS_GIL) {
                job->deferred[f] = 1;
            }
            else if (status != OK) {
                job->status = status;
                break;
            }
        }
    }
}

/* The pass with the GIL over the deferred columns (``all``: every column, and the type
 * of every event checked here): list columns from the pointers the GIL-free pass
 * recorded (no event read again), any other from the events. */
static void
job_scan_locked(Job *job, int all)
{
    Py_ssize_t n = job->n;
    int from_events = all;
    for (Py_ssize_t f = 0; f < job->n_fields && job->status == OK; f++) {
        Column *col = &job->cols[f];
        if (all || !job->deferred[f]) {
            job->deferred[f] = (char)all;
            continue;
        }
        if (column_restart(col, n) < 0) {
            job->status = NO_MEMORY;
        }
        else if (col->cells == NULL) {
            from_events = 1;
        }
        else {
            for (Py_ssize_t i = 0; i < n && job->status == OK; i++) {
                PyObject *v = col->cells[i];
                job->status = v == NULL ? FALLBACK : put_value(col, v);
            }
            job->deferred[f] = 0;
        }
    }
    for (Py_ssize_t i = 0; i < n && from_events && job->status == OK; i++) {
        PyObject *event = PyList_GET_ITEM(job->events, i);
        if (all && (PyObject *)Py_TYPE(event) != job->cls) {
            job->status = FALLBACK;
            break;
        }
        for (Py_ssize_t f = 0; f < job->n_fields && job->status == OK; f++) {
            if (job->deferred[f]) {
                PyObject *v = *(PyObject **)((char *)event + job->cols[f].offset);
                job->status = v == NULL ? FALLBACK : put_value(&job->cols[f], v);
            }
        }
    }
}

/* The job's result (the GIL held): its column buffers, None if it fell back, NULL with
 * an error set. */
static PyObject *
job_result(Job *job)
{
    if (job->status == FALLBACK) {
        return Py_NewRef(Py_None);
    }
    if (job->status == NO_MEMORY) {
        return PyErr_NoMemory();
    }
    if (job->status != OK) {
        return NULL; /* ERROR: a Python error is set */
    }
    PyObject *out = PyList_New(job->n_fields);
    for (Py_ssize_t f = 0; out != NULL && f < job->n_fields; f++) {
        PyObject *col = column_to_python(&job->cols[f]);
        if (col == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, f, col);
    }
    return out;
}

/* Run the jobs, the first pass without the GIL where ``release``; a list of results, or
 * NULL with an error set. */
static PyObject *
run_jobs(Job *jobs, Py_ssize_t n_jobs, int release)
{
    if (release) {
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t j = 0; j < n_jobs; j++) {
            job_scan_unlocked(&jobs[j]);
        }
        Py_END_ALLOW_THREADS
    }
    PyObject *out = PyList_New(n_jobs);
    for (Py_ssize_t j = 0; out != NULL && j < n_jobs; j++) {
        if (jobs[j].status == OK) {
            job_scan_locked(&jobs[j], !release);
        }
        PyObject *result = job_result(&jobs[j]);
        if (result == NULL) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, j, result);
    }
    return out;
}

PyDoc_STRVAR(convert_doc,
"convert(cls, events, descriptors, kinds, start, stop) -> list | None\n\n"
"Column buffers of events[start:stop], every one of exact type cls; descriptors are\n"
"cls's member descriptors of the fields and kinds one byte per field. None when a value\n"
"is not one the fast path handles (convert that slice with pyarrow instead).");

static PyObject *
convert(PyObject *self, PyObject *args)
{
    Job job;
    if (job_init(&job, args) < 0) {
        return NULL;
    }
    PyObject *results = run_jobs(&job, 1, 0);
    job_clear(&job);
    PyObject *out = results ? Py_NewRef(PyList_GET_ITEM(results, 0)) : NULL;
    Py_XDECREF(results);
    return out;
}

PyDoc_STRVAR(convert_many_doc,
"convert_many(jobs, release_gil) -> list\n\n"
"convert(*job) for each job tuple, in one call: with release_gil, the values that allow\n"
"it are read with the GIL released (one release for the whole batch, so other threads\n"
"run meanwhile; see the module comment), the rest with it held. Same results.");

static PyObject *
convert_many(PyObject *self, PyObject *args)
{
    PyObject *specs;
    int release;
    if (!PyArg_ParseTuple(args, "O!p", &PyList_Type, &specs, &release)) {
        return NULL;
    }
    Py_ssize_t n_jobs = PyList_GET_SIZE(specs);
    Job *jobs = PyMem_RawCalloc((size_t)(n_jobs ? n_jobs : 1), sizeof(Job));
    if (jobs == NULL) {
        return PyErr_NoMemory();
    }
    PyObject *out = NULL;
    Py_ssize_t ready = 0;
    for (; ready < n_jobs; ready++) {
        if (job_init(&jobs[ready], PyList_GET_ITEM(specs, ready)) < 0) {
            goto done;
        }
    }
    out = run_jobs(jobs, n_jobs, release);
done:
    for (Py_ssize_t j = 0; j < ready; j++) {
        job_clear(&jobs[j]);
    }
    PyMem_RawFree(jobs);
    return out;
}

PyDoc_STRVAR(group_doc,
"group(events) -> dict\n\n"
"The events of a list by exact type, {type: [its events in list order]}, the types in\n"
"order of first appearance: what a dict of lists built in Python gives, at a third of\n"
"the cost (the writer groups every burst by type before converting it).");

static PyObject *
group(PyObject *self, PyObject *events)
{
    if (!PyList_Check(events)) {
        PyErr_SetString(PyExc_TypeError, "group() takes a list");
        return NULL;
    }
    PyObject *out = PyDict_New();
    if (out == NULL) {
        return NULL;
    }
    /* Borrowed: the dict holds the lists. Type keys hash and compare by identity, so no
     * Python code runs while the list is read. */
    PyObject *last_type = NULL, *last_list = NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++) {
        PyObject *event = PyList_GET_ITEM(events, i);
        PyObject *type = (PyObject *)Py_TYPE(event);
        if (type != last_type) {
            PyObject *found = PyDict_GetItemWithError(out, type);
            if (found == NULL) {
                if (PyErr_Occurred() || (found = PyList_New(0)) == NULL) {
                    goto fail;
                }
                int status = PyDict_SetItem(out, type, found);
                Py_DECREF(found);
                if (status < 0) {
                    goto fail;
                }
            }
            last_type = type;
            last_list = found;
        }
        if (PyList_Append(last_list, event) < 0) {
            goto fail;
        }
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef methods[] = {
    {"convert", convert, METH_VARARGS, convert_doc},
    {"convert_many", convert_many, METH_VARARGS, convert_many_doc},
    {"group", group, METH_O, group_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_columns",
    "Event Structs -> Arrow column buffers in one native pass (optional accelerator).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__columns(void)
{
    if (PyType_Ready(&OwnedType) < 0) {
        return NULL;
    }
    return PyModule_Create(&module);
}
