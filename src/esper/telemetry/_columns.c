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
 * convert_many() converts a whole batch (every type, every slice) in one call and reads
 * most values with the GIL released, so the trainer's thread runs while the writer
 * converts. That pass only reads what cannot change or be freed under it: the events
 * are frozen Structs held by a private copy of each slice, and it takes only exact
 * ints, floats, True/False and compact ASCII strs (immutable objects, read without any
 * call that needs the interpreter). A column with any other value, and every list
 * column (a list can be changed in place), is converted afterwards with the GIL held;
 * the GIL-free pass records each event's list pointer, so that pass reads no event
 * again. The buffers (_columns_values.c) use the raw allocator, which needs no GIL, are
 * sized once where their length is known, and go to Arrow without a copy: with one
 * read of each event (cache-cold: another thread wrote it last) this costs the same
 * CPU per event as the single pass with the GIL held (benchmarks/convert.py).
 *
 * The pass "with the GIL held" is what keeps a list from changing while it is read: on
 * a free-threaded build the module refuses to compile (the build is optional, and
 * pyarrow converts instead).
 */
#include "_columns_values.h"

#ifdef Py_GIL_DISABLED
#error "the column converter relies on the GIL; setup.py skips it on free-threaded builds"
#endif

#include <string.h>

/* One slice of one type to convert. */
typedef struct {
    PyObject *cls;
    PyObject *events; /* a private copy of the slice: nothing else can change it */
    Column *cols;
    Py_ssize_t n_fields;
    char *deferred; /* per column: left to the pass with the GIL */
    Py_ssize_t n;   /* events */
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
        job->deferred[f] = column_is_list(job->cols[f].kind);
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
            int status = v == NULL ? FALLBACK : column_put_unlocked(col, v);
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
                job->status = v == NULL ? FALLBACK : column_put(col, v);
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
                job->status = v == NULL ? FALLBACK : column_put(&job->cols[f], v);
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
