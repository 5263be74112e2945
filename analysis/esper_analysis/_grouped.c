/* The reward breakdown's passes over its float columns (optional accelerator).
 *
 * ``add_grouped``: ``reward_breakdown`` sums a dozen reward columns per finest group
 * (rank, round, env, op). numpy does that one column at a time (``np.add.at``), each a
 * pass over the group codes and a scattered write; this does every column in one pass,
 * with the GIL released, and the row counts with it. The additions are exactly
 * ``np.add.at``'s: each group's sum of each column is the values added one by one in
 * row order, so both ways give the same bits (tested), and calling it chunk by chunk
 * gives the bits of one call over the whole column.
 *
 * ``check_rows``: the per-column minimum, maximum and non-zero count, and the rows whose
 * components may not add up to the total, in one pass over a row group that polars
 * would otherwise check in one small query per row group.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <float.h>
#include <math.h>
#include <string.h>

/* Column pointers kept on the stack below this many columns (more: one allocation). */
#define STACK_COLUMNS 32

static int
get_buffer(PyObject *obj, Py_buffer *view, int writable, Py_ssize_t itemsize, const char *kinds,
           const char *what)
{
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        return -1;
    }
    const char *fmt = view->format ? view->format : "B";
    if (*fmt == '@' || *fmt == '=' || *fmt == '<') {
        fmt++;
    }
    if (view->itemsize != itemsize || fmt[0] == '\0' || fmt[1] != '\0' || !strchr(kinds, fmt[0])) {
        PyErr_Format(PyExc_TypeError, "%s: a contiguous buffer of %zd-byte items of kind %s",
                     what, itemsize, kinds);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(add_grouped_doc,
"add_grouped(sums, rows, codes, columns)\n\n"
"For each row i in order: rows[codes[i]] += 1 and, for every column c,\n"
"sums[c * len(rows) + codes[i]] += columns[c][i]. ``sums``: float64, ``rows``:\n"
"int64 (both writable, contiguous); ``codes``: int64; ``columns``: float64 buffers as\n"
"long as ``codes``. A code outside ``rows`` raises ValueError (the outputs are then\n"
"partly updated).");

static PyObject *
add_grouped(PyObject *self, PyObject *args)
{
    PyObject *sums_obj, *rows_obj, *codes_obj, *columns_obj;
    if (!PyArg_ParseTuple(args, "OOOO", &sums_obj, &rows_obj, &codes_obj, &columns_obj)) {
        return NULL;
    }
    PyObject *columns = PySequence_Fast(columns_obj, "columns: a sequence of buffers");
    if (columns == NULL) {
        return NULL;
    }
    Py_ssize_t k = PySequence_Fast_GET_SIZE(columns);
    Py_buffer sums, rows, codes;
    Py_buffer stack_views[STACK_COLUMNS];
    const double *stack_ptrs[STACK_COLUMNS];
    Py_buffer *views = k <= STACK_COLUMNS ? stack_views : PyMem_Calloc(k, sizeof(Py_buffer));
    const double **ptrs = k <= STACK_COLUMNS ? stack_ptrs : PyMem_Calloc(k, sizeof(double *));
    PyObject *result = NULL;
    Py_ssize_t got = 0;
    int have_sums = 0, have_rows = 0, have_codes = 0;
    if (views == NULL || ptrs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (get_buffer(sums_obj, &sums, 1, 8, "d", "sums") < 0) {
        goto done;
    }
    have_sums = 1;
    if (get_buffer(rows_obj, &rows, 1, 8, "lq", "rows") < 0) {
        goto done;
    }
    have_rows = 1;
    if (get_buffer(codes_obj, &codes, 0, 8, "lq", "codes") < 0) {
        goto done;
    }
    have_codes = 1;
    Py_ssize_t n = codes.len / 8, groups = rows.len / 8;
    if (sums.len / 8 != groups * k) {
        PyErr_Format(PyExc_ValueError, "sums: %zd values, expected %zd groups x %zd columns",
                     sums.len / 8, groups, k);
        goto done;
    }
    for (; got < k; got++) {
        if (get_buffer(PySequence_Fast_GET_ITEM(columns, got), &views[got], 0, 8, "d", "column") < 0) {
            goto done;
        }
        if (views[got].len / 8 != n) {
            PyErr_Format(PyExc_ValueError, "column %zd: %zd values, codes: %zd", got,
                         views[got].len / 8, n);
            got++;
            goto done;
        }
        ptrs[got] = (const double *)views[got].buf;
    }
    const int64_t *code = (const int64_t *)codes.buf;
    int64_t *count = (int64_t *)rows.buf;
    double *out = (double *)sums.buf;
    Py_ssize_t bad = -1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t g = code[i];
        if (g < 0 || g >= groups) {
            bad = i;
            break;
        }
        count[g] += 1;
        for (Py_ssize_t c = 0; c < k; c++) {
            out[c * groups + g] += ptrs[c][i];
        }
    }
    Py_END_ALLOW_THREADS
    if (bad >= 0) {
        PyErr_Format(PyExc_ValueError, "codes[%zd] = %lld is outside [0, %zd)", bad,
                     (long long)code[bad], groups);
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    for (Py_ssize_t c = 0; c < got; c++) {
        PyBuffer_Release(&views[c]);
    }
    if (have_codes) {
        PyBuffer_Release(&codes);
    }
    if (have_rows) {
        PyBuffer_Release(&rows);
    }
    if (have_sums) {
        PyBuffer_Release(&sums);
    }
    if (views != stack_views) {
        PyMem_Free(views);
    }
    if (ptrs != stack_ptrs) {
        PyMem_Free((void *)ptrs);
    }
    Py_DECREF(columns);
    return result;
}

/* The float64 buffers of a sequence, all of one length (-1 where unknown yet). */
typedef struct {
    PyObject *seq;
    Py_buffer *views;
    const double **ptrs;
    Py_ssize_t count, got, length;
} Columns;

static int
columns_open(Columns *cols, PyObject *obj, Py_ssize_t length)
{
    memset(cols, 0, sizeof(*cols));
    cols->seq = PySequence_Fast(obj, "columns: a sequence of buffers");
    if (cols->seq == NULL) {
        return -1;
    }
    cols->count = PySequence_Fast_GET_SIZE(cols->seq);
    cols->length = length;
    cols->views = PyMem_Calloc(cols->count ? cols->count : 1, sizeof(Py_buffer));
    cols->ptrs = PyMem_Calloc(cols->count ? cols->count : 1, sizeof(double *));
    if (cols->views == NULL || cols->ptrs == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (; cols->got < cols->count; cols->got++) {
        Py_buffer *view = &cols->views[cols->got];
        if (get_buffer(PySequence_Fast_GET_ITEM(cols->seq, cols->got), view, 0, 8, "d", "column") < 0) {
            return -1;
        }
        Py_ssize_t n = view->len / 8;
        if (cols->length < 0) {
            cols->length = n;
        }
        if (n != cols->length) {
            PyErr_Format(PyExc_ValueError, "column %zd: %zd values, expected %zd", cols->got, n,
                         cols->length);
            cols->got++;
            return -1;
        }
        cols->ptrs[cols->got] = (const double *)view->buf;
    }
    return 0;
}

static void
columns_close(Columns *cols)
{
    for (Py_ssize_t c = 0; c < cols->got; c++) {
        PyBuffer_Release(&cols->views[c]);
    }
    PyMem_Free(cols->views);
    PyMem_Free((void *)cols->ptrs);
    Py_XDECREF(cols->seq);
}

PyDoc_STRVAR(check_rows_doc,
"check_rows(columns, tolerance, low, high, values, nans, nonzero) -> int\n\n"
"``columns``: float64 components, then the total, all of one length. Folds each\n"
"column into its running statistics (one entry per column): ``low``/``high``\n"
"(float64) the smallest and largest value that is not NaN, ``values``/``nans``/\n"
"``nonzero`` (int64) the counts of values that are not NaN, of NaNs and of values\n"
"other than 0 (a NaN is one). Returns the rows whose components (added left to right)\n"
"may differ from the total by more than ``tolerance``, or give NaN: a superset of the\n"
"rows an exact check flags, by a margin of a few ulps of the row's magnitude (where\n"
"the exact check's additions could round otherwise). Zero: no row is flagged.");

/* Rows checked together: their partial sums stay in cache while each column is read. */
#define BLOCK 512
/* Ulps of a row's magnitude the margin allows for another order of additions. */
#define MARGIN_ULPS 64.0

static void
fold_block(const double *x, Py_ssize_t m, double *lo, double *hi, int64_t *values, int64_t *nan,
           int64_t *nz)
{
    double l = *lo, h = *hi;
    int64_t nans = 0, nonzero = 0;
    for (Py_ssize_t r = 0; r < m; r++) {
        double v = x[r];
        nonzero += v != 0.0;
        nans += v != v;
        l = v < l ? v : l; /* a NaN compares false: skipped */
        h = v > h ? v : h;
    }
    *lo = l;
    *hi = h;
    *values += m - nans;
    *nan += nans;
    *nz += nonzero;
}

static PyObject *
check_rows(PyObject *self, PyObject *args)
{
    PyObject *columns_obj, *outs[5];
    double tolerance;
    if (!PyArg_ParseTuple(args, "OdOOOOO", &columns_obj, &tolerance, &outs[0], &outs[1], &outs[2],
                          &outs[3], &outs[4])) {
        return NULL;
    }
    Columns cols;
    Py_buffer views[5];
    int have = 0;
    PyObject *result = NULL;
    if (columns_open(&cols, columns_obj, -1) < 0) {
        goto done;
    }
    if (cols.count < 1) {
        PyErr_SetString(PyExc_ValueError, "columns: the components, then the total");
        goto done;
    }
    for (; have < 5; have++) {
        const char *kind = have < 2 ? "d" : "lq";
        if (get_buffer(outs[have], &views[have], 1, 8, kind, "statistics") < 0) {
            goto done;
        }
        if (views[have].len / 8 != cols.count) {
            PyErr_Format(PyExc_ValueError, "statistics: %zd entries for %zd columns",
                         views[have].len / 8, cols.count);
            have++;
            goto done;
        }
    }
    double *low = views[0].buf, *high = views[1].buf;
    int64_t *values = views[2].buf, *nans = views[3].buf, *nonzero = views[4].buf;
    Py_ssize_t n = cols.length, k = cols.count - 1, bad = 0;
    const double *total = cols.ptrs[k];
    Py_BEGIN_ALLOW_THREADS
    double sum[BLOCK], size[BLOCK];
    for (Py_ssize_t start = 0; start < n; start += BLOCK) {
        Py_ssize_t m = n - start < BLOCK ? n - start : BLOCK;
        const double *t = total + start;
        for (Py_ssize_t r = 0; r < m; r++) {
            sum[r] = 0.0;
            size[r] = fabs(t[r]);
        }
        for (Py_ssize_t c = 0; c <= k; c++) {
            const double *x = cols.ptrs[c] + start;
            fold_block(x, m, &low[c], &high[c], &values[c], &nans[c], &nonzero[c]);
            if (c == k) {
                break;
            }
            for (Py_ssize_t r = 0; r < m; r++) {
                sum[r] += x[r];
                size[r] += fabs(x[r]);
            }
        }
        for (Py_ssize_t r = 0; r < m; r++) {
            double diff = fabs(sum[r] - t[r]);
            bad += !(diff <= tolerance - MARGIN_ULPS * DBL_EPSILON * size[r]);
        }
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(bad);
done:
    for (int i = 0; i < have; i++) {
        PyBuffer_Release(&views[i]);
    }
    columns_close(&cols);
    return result;
}

static PyMethodDef methods[] = {
    {"add_grouped", add_grouped, METH_VARARGS, add_grouped_doc},
    {"check_rows", check_rows, METH_VARARGS, check_rows_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_grouped", "Grouped sums in one pass (optional accelerator).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__grouped(void)
{
    return PyModule_Create(&module);
}
