/* Counts of the values of a Parquet RLE / bit-packed hybrid stream (optional accelerator).
 *
 * A dictionary-encoded Parquet page stores each row as an index into the column chunk's
 * dictionary, in runs: "this index, n times" (RLE) or groups of eight indices packed in
 * ``bit_width`` bits each. Counting a column's values (the event counts' histograms of
 * round, env and step) needs only how often each index occurs: an RLE run adds n at
 * once, and no value is ever decoded into a row. Definition levels use the same
 * encoding (bit width 1: 0 = null, 1 = present).
 *
 * Every read is bounds-checked: a malformed stream raises ValueError, never reads past
 * its buffer or writes past ``counts``.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if PY_BIG_ENDIAN
#error "the run counter reads Parquet's little-endian bit packing with native loads"
#endif

/* Widest index this decoder reads (Parquet allows 32). */
#define MAX_BIT_WIDTH 32
/* Bytes of a ULEB128 run header at most (a 32-bit count). */
#define MAX_VARINT_BYTES 5
#define GROUP 8

typedef struct {
    const uint8_t *data;
    Py_ssize_t size, pos;
    int64_t *counts;
    Py_ssize_t ncounts;
    const char *error;
} Stream;

static int
read_varint(Stream *s, uint64_t *out)
{
    uint64_t value = 0;
    for (int i = 0; i < MAX_VARINT_BYTES; i++) {
        if (s->pos >= s->size) {
            s->error = "a run header runs past the page";
            return -1;
        }
        uint8_t b = s->data[s->pos++];
        value |= (uint64_t)(b & 0x7F) << (7 * i);
        if (!(b & 0x80)) {
            *out = value;
            return 0;
        }
    }
    s->error = "a run header is longer than 5 bytes";
    return -1;
}

static int
count_value(Stream *s, uint64_t value, uint64_t times)
{
    if (value >= (uint64_t)s->ncounts) {
        s->error = "an index is outside the dictionary";
        return -1;
    }
    s->counts[value] += (int64_t)times;
    return 0;
}

/* Counts ``n`` values of a stream of ``width``-bit values; 0, or -1 with s->error. */
static int
count_stream(Stream *s, int width, Py_ssize_t n)
{
    Py_ssize_t value_bytes = (width + 7) / 8;
    while (n > 0) {
        uint64_t header;
        if (read_varint(s, &header) < 0) {
            return -1;
        }
        if (!(header & 1)) { /* RLE: one value, repeated */
            uint64_t times = header >> 1;
            if (s->pos + value_bytes > s->size) {
                s->error = "an RLE run runs past the page";
                return -1;
            }
            uint64_t value = 0;
            for (Py_ssize_t b = 0; b < value_bytes; b++) {
                value |= (uint64_t)s->data[s->pos + b] << (8 * b);
            }
            s->pos += value_bytes;
            if (times > (uint64_t)n) {
                times = (uint64_t)n; /* a run may be written past the last value */
            }
            if (times && count_value(s, value, times) < 0) {
                return -1;
            }
            n -= (Py_ssize_t)times;
            continue;
        }
        uint64_t groups = header >> 1; /* bit-packed: groups of 8 values */
        if (width && groups > (uint64_t)(s->size - s->pos) / width) {
            s->error = "a bit-packed run runs past the page";
            return -1;
        }
        Py_ssize_t bytes = (Py_ssize_t)groups * width;
        const uint8_t *p = s->data + s->pos;
        uint64_t mask = width == 64 ? ~0ULL : ((1ULL << width) - 1);
        Py_ssize_t values = (Py_ssize_t)groups * GROUP;
        Py_ssize_t take = values < n ? values : n; /* the rest pads the last group */
        for (Py_ssize_t i = 0; i < take; i++) {
            uint64_t bit = (uint64_t)i * width, value = 0;
            Py_ssize_t byte = (Py_ssize_t)(bit >> 3);
            int shift = (int)(bit & 7);
            if (byte + 8 <= bytes) { /* one unaligned little-endian load */
                memcpy(&value, p + byte, 8);
            } else {
                for (int got = 0; got < width + shift; got += 8) {
                    value |= (uint64_t)p[byte++] << got;
                }
            }
            value = (value >> shift) & mask;
            if (value >= (uint64_t)s->ncounts) {
                s->error = "an index is outside the dictionary";
                return -1;
            }
            s->counts[value] += 1;
        }
        s->pos += bytes;
        n -= take;
    }
    return 0;
}

PyDoc_STRVAR(count_runs_doc,
"count_runs(data, bit_width, n, counts) -> int\n\n"
"Adds to ``counts[v]`` (int64, writable) the occurrences of each value ``v`` among the\n"
"first ``n`` values of the RLE / bit-packed hybrid stream ``data`` (a bytes-like\n"
"object, starting at its first run header) of ``bit_width``-bit values. Returns the\n"
"bytes read. A malformed stream, or a value outside ``counts``, raises ValueError\n"
"(``counts`` is then partly updated).");

static PyObject *
count_runs(PyObject *self, PyObject *args)
{
    Py_buffer data, counts;
    int width;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y*inw*", &data, &width, &n, &counts)) {
        return NULL;
    }
    PyObject *result = NULL;
    if (width < 0 || width > MAX_BIT_WIDTH) {
        PyErr_Format(PyExc_ValueError, "bit width %d is outside 0..%d", width, MAX_BIT_WIDTH);
        goto done;
    }
    if (n < 0 || counts.itemsize != 8 || counts.len % 8) {
        PyErr_SetString(PyExc_ValueError, "n >= 0 and counts: a buffer of int64");
        goto done;
    }
    Stream s = {data.buf, data.len, 0, counts.buf, counts.len / 8, NULL};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = count_stream(&s, width, n);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        PyErr_Format(PyExc_ValueError, "%s (at byte %zd)", s.error, s.pos);
        goto done;
    }
    result = PyLong_FromSsize_t(s.pos);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&counts);
    return result;
}

static PyMethodDef methods[] = {
    {"count_runs", count_runs, METH_VARARGS, count_runs_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_rle",
    "Counts of the values of Parquet RLE / bit-packed streams (optional accelerator).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__rle(void)
{
    return PyModule_Create(&module);
}
