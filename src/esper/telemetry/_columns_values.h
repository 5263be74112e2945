/* Column buffers of the native converter (``_columns.c``): Arrow-layout buffers, the
 * append of one Python value (with or without the GIL), and the hand-over to Python.
 */
#ifndef ESPER_COLUMNS_VALUES_H
#define ESPER_COLUMNS_VALUES_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef struct {
    char *data;
    Py_ssize_t len;
    Py_ssize_t cap;
} Buf;

/* Kinds, one byte per field (see arrow_schema._KINDS). */
enum {
    K_INT = 'q', K_FLOAT = 'd', K_BOOL = '?', K_STR = 's',
    K_LIST_INT = 'Q', K_LIST_FLOAT = 'D', K_LIST_BOOL = 'B', K_LIST_STR = 'S',
};

/* Largest offset an int32-offset Arrow array may hold. */
#define MAX_OFFSET INT32_MAX

typedef struct {
    char kind;
    Py_ssize_t offset; /* byte offset of the field's slot in the Struct instance */
    Buf a, b, c;       /* see the layout per kind in column_to_python() */
    Py_ssize_t bits;   /* booleans appended so far (K_BOOL: a; K_LIST_BOOL: b) */
    PyObject **cells;  /* list columns: each event's list, read by the GIL-free pass */
} Column;

/* Status of one append: appended; not a fast-path value (fall back to pyarrow); a value
 * the GIL-free pass leaves to the pass with the GIL; a Python error set; out of memory
 * (no error set yet: the caller sets it once it holds the GIL). */
enum { OK = 0, FALLBACK = 1, NEEDS_GIL = 2, ERROR = -1, NO_MEMORY = -2 };

/* Whether a kind is a list of scalars. */
int column_is_list(char kind);
/* Append one value (the GIL held): a status above. */
int column_put(Column *col, PyObject *v);
/* Append one value without the GIL: exact ints, floats, booleans and compact ASCII strs;
 * NEEDS_GIL for any other str and every list. */
int column_put_unlocked(Column *col, PyObject *v);
/* Empty a column of n rows again (its buffers kept); -1: out of memory. */
int column_restart(Column *col, Py_ssize_t n);
/* Columns of n rows from the fields' member descriptors and kinds; NULL with an error. */
Column *columns_new(PyObject *cls, PyObject *descrs, const char *kinds, Py_ssize_t n_fields,
                    Py_ssize_t n);
void columns_free(Column *cols, Py_ssize_t n);
/* The column's buffers as Python objects (see the definition); takes them over. */
PyObject *column_to_python(Column *col);
/* Type of the buffer-protocol objects column_to_python() returns (PyType_Ready it). */
extern PyTypeObject OwnedType;

#endif
