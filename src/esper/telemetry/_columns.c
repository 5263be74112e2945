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
} Column;

static int
buf_reserve(Buf *buf, Py_ssize_t extra)
{
    if (buf->len + extra <= buf->cap) {
        return 0;
    }
    Py_ssize_t cap = buf->cap ? buf->cap : MIN_CAPACITY;
    while (cap < buf->len + extra) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *data = PyMem_Realloc(buf->data, (size_t)cap);
    if (data == NULL) {
        PyErr_NoMemory();
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

/* Status of one append: appended, not a fast-path value (fall back), or a Python error. */
enum { OK = 0, FALLBACK = 1, ERROR = -1 };

static int
put_int(Buf *buf, PyObject *v)
{
    if (!PyLong_CheckExact(v)) {
        return FALLBACK;
    }
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) {
        return FALLBACK;
    }
    if (x == -1 && PyErr_Occurred()) {
        return ERROR;
    }
    int64_t y = (int64_t)x;
    return buf_put(buf, &y, sizeof y) < 0 ? ERROR : OK;
}

static int
put_float(Buf *buf, PyObject *v)
{
    if (!PyFloat_CheckExact(v)) {
        return FALLBACK;
    }
    double x = PyFloat_AS_DOUBLE(v);
    return buf_put(buf, &x, sizeof x) < 0 ? ERROR : OK;
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
            return ERROR;
        }
    }
    if (v == Py_True) {
        buf->data[*bits >> 3] |= (char)(1 << (*bits & 7));
    }
    (*bits)++;
    return OK;
}

/* One string: its UTF-8 bytes into data, the new end offset into offsets. */
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
    if (size > MAX_OFFSET - data->len) {
        return FALLBACK;
    }
    if (buf_put(data, utf8, size) < 0) {
        return ERROR;
    }
    return put_offset(offsets, data->len) < 0 ? ERROR : OK;
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
    return put_offset(&col->a, end) < 0 ? ERROR : OK;
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

/* Offset buffers start with a 0 entry (Arrow's offsets have length + 1 entries). */
static int
column_start(Column *col)
{
    switch (col->kind) {
    case K_INT:
    case K_FLOAT:
    case K_BOOL:
        return 0;
    case K_STR:
    case K_LIST_INT:
    case K_LIST_FLOAT:
    case K_LIST_BOOL:
        return put_offset(&col->a, 0);
    default: /* K_LIST_STR: list offsets in a, string offsets in b */
        if (put_offset(&col->a, 0) < 0) {
            return -1;
        }
        return put_offset(&col->b, 0);
    }
}

static PyObject *
buf_bytes(const Buf *buf)
{
    return PyBytes_FromStringAndSize(buf->data ? buf->data : "", buf->len);
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

/* int/float/bool: the values' bytes; str: (offsets, data). */
static PyObject *
scalars_to_python(char kind, const Buf *values, const Buf *data)
{
    if (kind == K_STR) {
        return pair(buf_bytes(values), buf_bytes(data));
    }
    return buf_bytes(values);
}

/* A scalar column as above; a list column: (list offsets, its items as above). */
static PyObject *
column_to_python(const Column *col)
{
    if (is_list_kind(col->kind)) {
        PyObject *items = scalars_to_python(item_kind_of(col->kind), &col->b, &col->c);
        return pair(buf_bytes(&col->a), items);
    }
    return scalars_to_python(col->kind, &col->a, &col->b);
}

static void
columns_free(Column *cols, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        PyMem_Free(cols[i].a.data);
        PyMem_Free(cols[i].b.data);
        PyMem_Free(cols[i].c.data);
    }
    PyMem_Free(cols);
}

static int
is_known_kind(char kind)
{
    return kind == K_INT || kind == K_FLOAT || kind == K_BOOL || kind == K_STR
           || is_list_kind(kind);
}

/* Columns set up from the field descriptors and kinds; NULL with an error set. */
static Column *
columns_new(PyObject *cls, PyObject *descrs, const char *kinds, Py_ssize_t n_fields)
{
    Column *cols = PyMem_Calloc((size_t)n_fields, sizeof(Column));
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
        if (column_start(&cols[f]) < 0) {
            goto fail;
        }
    }
    return cols;
fail:
    columns_free(cols, n_fields);
    return NULL;
}

PyDoc_STRVAR(convert_doc,
"convert(cls, events, descriptors, kinds, start, stop) -> list | None\n\n"
"Column buffers of events[start:stop], every one of exact type cls; descriptors are\n"
"cls's member descriptors of the fields and kinds one byte per field. None when a value\n"
"is not one the fast path handles (convert that slice with pyarrow instead).");

static PyObject *
convert(PyObject *self, PyObject *args)
{
    PyObject *cls, *events, *descrs;
    const char *kinds;
    Py_ssize_t n_kinds, start, stop;
    if (!PyArg_ParseTuple(args, "O!O!O!y#nn", &PyType_Type, &cls, &PyList_Type, &events, &PyTuple_Type,
                          &descrs, &kinds, &n_kinds, &start, &stop)) {
        return NULL;
    }
    Py_ssize_t n_fields = PyTuple_GET_SIZE(descrs);
    if (n_kinds != n_fields) {
        PyErr_SetString(PyExc_ValueError, "one kind per descriptor");
        return NULL;
    }
    if (start < 0 || stop < start || stop > PyList_GET_SIZE(events)) {
        PyErr_SetString(PyExc_IndexError, "slice out of range");
        return NULL;
    }
    Column *cols = columns_new(cls, descrs, kinds, n_fields);
    if (cols == NULL) {
        return NULL;
    }
    int status = OK;
    for (Py_ssize_t i = start; i < stop && status == OK; i++) {
        PyObject *event = PyList_GET_ITEM(events, i);
        if ((PyObject *)Py_TYPE(event) != cls) {
            status = FALLBACK;
            break;
        }
        for (Py_ssize_t f = 0; f < n_fields && status == OK; f++) {
            PyObject *v = *(PyObject **)((char *)event + cols[f].offset);
            status = v == NULL ? FALLBACK : put_value(&cols[f], v);
        }
    }
    PyObject *out = NULL;
    if (status == FALLBACK) {
        out = Py_NewRef(Py_None);
    }
    else if (status == OK && (out = PyList_New(n_fields)) != NULL) {
        for (Py_ssize_t f = 0; f < n_fields; f++) {
            PyObject *col = column_to_python(&cols[f]);
            if (col == NULL) {
                Py_CLEAR(out);
                break;
            }
            PyList_SET_ITEM(out, f, col);
        }
    }
    columns_free(cols, n_fields);
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
    return PyModule_Create(&module);
}
