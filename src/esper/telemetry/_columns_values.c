/* Column buffers of the native converter: see _columns.c for the design, and
 * _columns_values.h for what the module uses of this file.
 *
 * Buffers follow Arrow's layout: int64/float64 values, bit-packed booleans (least
 * significant bit first), int32 offsets for strings and lists. They use the raw
 * allocator, which needs no GIL.
 */
#include "_columns_values.h"

#include <structmember.h>
#include <string.h>

#define MIN_CAPACITY 64

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

int
column_is_list(char kind)
{
    return kind == K_LIST_INT || kind == K_LIST_FLOAT || kind == K_LIST_BOOL
           || kind == K_LIST_STR;
}

int
column_put(Column *col, PyObject *v)
{
    if (column_is_list(col->kind)) {
        return put_list(col, v);
    }
    return put_scalar(col->kind, &col->a, &col->b, &col->bits, v);
}

/* One value without the GIL: exact ints, floats, booleans and compact ASCII strs (their
 * bytes are the object's own, immutable); NEEDS_GIL for any other str and every list. */
int
column_put_unlocked(Column *col, PyObject *v)
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

PyTypeObject OwnedType = {
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
PyObject *
column_to_python(Column *col)
{
    if (column_is_list(col->kind)) {
        PyObject *items = scalars_to_python(item_kind_of(col->kind), &col->b, &col->c);
        return pair(buf_take(&col->a), items);
    }
    return scalars_to_python(col->kind, &col->a, &col->b);
}

void
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
int
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
           || column_is_list(kind);
}

/* Columns set up from the field descriptors and kinds; NULL with an error set. */
Column *
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
        if (column_is_list(kinds[f])
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

