/* The hub's emit fast path in one native call (optional accelerator).
 *
 * ``TelemetryHub.emit`` in Python costs about 0.55 us per event: a level lookup, three
 * checks, a lock, four ``force_setattr`` calls and an append, each paying the
 * interpreter's dispatch. This module does the same work in one C call: the level
 * lookup, the checks, the stamp (``run_id``, ``seq``, ``ts_ns``, ``rank`` written
 * straight into the Struct's slots) and the append to the writer's buffer.
 *
 * Atomicity comes from the GIL instead of the hub's lock: the call never releases the
 * GIL between taking a ``seq`` and appending, so stamps stay in buffer order whatever
 * the number of producer threads, and the writer takes events with two single C-level
 * list operations (copy a prefix, delete that prefix) that an append cannot split. On a
 * build without the GIL (free-threaded CPython) the module refuses to import and the
 * hub keeps its locked Python path.
 *
 * Every case off the fast path (an event type outside the catalogue, a closed hub or a
 * failed writer, an event already stamped, a full buffer) is handed to the hub's Python
 * ``emit`` (``slow``), which raises the same errors and blocks or drops as it always did;
 * it stamps and appends through ``push``, so the counter has one owner.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

#ifdef Py_GIL_DISABLED
#error "the emit fast path relies on the GIL; setup.py skips it on free-threaded builds"
#endif

/* Envelope slots, in this order (the descriptors passed to Emitter()). */
enum { F_RUN_ID, F_SEQ, F_TS_NS, F_RANK, N_ENVELOPE };
#define UNSTAMPED_SEQ (-1)
#define NS_PER_S 1000000000LL

typedef struct {
    PyObject_HEAD
    PyObject *levels;  /* dict: event class -> int level */
    PyObject *buffer;  /* list the writer drains */
    PyObject *run_id;  /* str */
    PyObject *rank;    /* int */
    PyObject *slow;    /* callable(event): the hub's Python emit */
    PyObject *clock;   /* time.time_ns, where clock_gettime is missing */
    Py_ssize_t capacity;
    Py_ssize_t offsets[N_ENVELOPE];
    long long seq;     /* the next seq */
    long level;
    int open;
} Emitter;

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))

static int
envelope_offsets(PyObject *base, PyObject *descrs, Py_ssize_t *offsets)
{
    if (!PyTuple_Check(descrs) || PyTuple_GET_SIZE(descrs) != N_ENVELOPE) {
        PyErr_SetString(PyExc_TypeError, "descriptors: a tuple of run_id, seq, ts_ns, rank");
        return -1;
    }
    for (Py_ssize_t f = 0; f < N_ENVELOPE; f++) {
        PyObject *d = PyTuple_GET_ITEM(descrs, f);
        if (!PyObject_TypeCheck(d, &PyMemberDescr_Type)
            || ((PyMemberDescrObject *)d)->d_member->type != T_OBJECT_EX
            || !PyType_IsSubtype((PyTypeObject *)base, PyDescr_TYPE(d))) {
            PyErr_Format(PyExc_TypeError, "envelope field %zd is not an object slot of %R", f,
                         base);
            return -1;
        }
        offsets[f] = ((PyMemberDescrObject *)d)->d_member->offset;
    }
    return 0;
}

/* A copy of ``levels`` (class -> level) after checking every class is a subclass of
 * ``base`` (so the envelope offsets hold for its instances) and every level an int. */
static PyObject *
checked_levels(PyObject *base, PyObject *levels)
{
    if (!PyDict_Check(levels)) {
        PyErr_SetString(PyExc_TypeError, "levels: a dict of event class -> int");
        return NULL;
    }
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(levels, &pos, &key, &value)) {
        if (!PyType_Check(key) || !PyType_IsSubtype((PyTypeObject *)key, (PyTypeObject *)base)) {
            PyErr_Format(PyExc_TypeError, "levels: %R is not a subclass of %R", key, base);
            return NULL;
        }
        if (!PyLong_CheckExact(value)) {
            PyErr_Format(PyExc_TypeError, "levels: the level of %R is not an int", key);
            return NULL;
        }
    }
    return PyDict_Copy(levels);
}

static int
emitter_init(Emitter *self, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"base", "descriptors", "levels", "buffer", "capacity", "run_id",
                            "rank", "seq", "level", "slow", NULL};
    PyObject *base, *descrs, *levels, *buffer, *run_id, *rank, *slow;
    Py_ssize_t capacity;
    long long seq;
    long level;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OOO!nUO!LlO:Emitter", names, &PyType_Type,
                                     &base, &descrs, &levels, &PyList_Type, &buffer, &capacity,
                                     &run_id, &PyLong_Type, &rank, &seq, &level, &slow)) {
        return -1;
    }
    if (!PyCallable_Check(slow)) {
        PyErr_SetString(PyExc_TypeError, "slow must be callable");
        return -1;
    }
    if (capacity < 1) {
        PyErr_SetString(PyExc_ValueError, "capacity must be at least 1");
        return -1;
    }
    if (envelope_offsets(base, descrs, self->offsets) < 0) {
        return -1;
    }
    PyObject *copy = checked_levels(base, levels);
    if (copy == NULL) {
        return -1;
    }
    Py_XSETREF(self->levels, copy);
    Py_XSETREF(self->buffer, Py_NewRef(buffer));
    Py_XSETREF(self->run_id, Py_NewRef(run_id));
    Py_XSETREF(self->rank, Py_NewRef(rank));
    Py_XSETREF(self->slow, Py_NewRef(slow));
    self->capacity = capacity;
    self->seq = seq;
    self->level = level;
    self->open = 1;
    return 0;
}

static PyObject *
now_ns(Emitter *self)
{
#if defined(CLOCK_REALTIME)
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) == 0) {
        return PyLong_FromLongLong((long long)ts.tv_sec * NS_PER_S + ts.tv_nsec);
    }
#endif
    if (self->clock == NULL) {
        PyObject *time = PyImport_ImportModule("time");
        if (time == NULL) {
            return NULL;
        }
        self->clock = PyObject_GetAttrString(time, "time_ns");
        Py_DECREF(time);
        if (self->clock == NULL) {
            return NULL;
        }
    }
    return PyObject_CallNoArgs(self->clock);
}


/* Stamp ``event`` with the next seq and append it (no check but the caller's). */
static PyObject *
push_stamped(Emitter *self, PyObject *event)
{
    PyObject *seq = PyLong_FromLongLong(self->seq);
    PyObject *ts = seq == NULL ? NULL : now_ns(self);
    if (ts == NULL) {
        Py_XDECREF(seq);
        return NULL;
    }
    /* The append is the one step that can fail (memory): done first, so a failure
     * leaves the event unstamped and the counter where it was. */
    if (PyList_Append(self->buffer, event) < 0) {
        Py_DECREF(seq);
        Py_DECREF(ts);
        return NULL;
    }
    PyObject *stamp[N_ENVELOPE] = {Py_NewRef(self->run_id), seq, ts, Py_NewRef(self->rank)};
    PyObject *old[N_ENVELOPE];
    for (int f = 0; f < N_ENVELOPE; f++) {
        old[f] = SLOT(event, self->offsets[f]);
        SLOT(event, self->offsets[f]) = stamp[f]; /* takes the reference */
    }
    self->seq++;
    /* Released last: an old value's destructor may run Python code (and let another
     * thread emit), which must find the counter already advanced. */
    for (int f = 0; f < N_ENVELOPE; f++) {
        Py_XDECREF(old[f]);
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(push_doc,
"push(event)\n\n"
"Stamp ``event`` with the next seq and append it to the buffer, whatever its level or\n"
"the buffer's size (the hub's Python path calls it after its own checks).");

static PyObject *
emitter_push(Emitter *self, PyObject *event)
{
    PyObject *level = PyDict_GetItemWithError(self->levels, (PyObject *)Py_TYPE(event));
    if (level == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_Format(PyExc_TypeError, "%s is not an event type of the catalogue",
                         Py_TYPE(event)->tp_name);
        }
        return NULL;
    }
    return push_stamped(self, event);
}

static int
is_unstamped(PyObject *seq)
{
    if (seq == NULL || !PyLong_CheckExact(seq)) {
        return 0;
    }
    int overflow;
    long value = PyLong_AsLongAndOverflow(seq, &overflow);
    return !overflow && value == UNSTAMPED_SEQ;
}

PyDoc_STRVAR(emit_doc,
"emit(event)\n\n"
"Filter by level, check, stamp and append ``event``; any case off the fast path goes to\n"
"the hub's Python emit.");

static PyObject *
emitter_emit(Emitter *self, PyObject *event)
{
    PyObject *level = PyDict_GetItemWithError(self->levels, (PyObject *)Py_TYPE(event));
    if (level == NULL) {
        return PyErr_Occurred() ? NULL : PyObject_CallOneArg(self->slow, event);
    }
    if (PyLong_AsLong(level) > self->level) {
        Py_RETURN_NONE;
    }
    if (!self->open || !is_unstamped(SLOT(event, self->offsets[F_SEQ]))
        || PyList_GET_SIZE(self->buffer) >= self->capacity) {
        return PyObject_CallOneArg(self->slow, event);
    }
    return push_stamped(self, event);
}

static PyObject *
get_seq(Emitter *self, void *closure)
{
    return PyLong_FromLongLong(self->seq);
}

static PyObject *
get_level(Emitter *self, void *closure)
{
    return PyLong_FromLong(self->level);
}

static int
set_level(Emitter *self, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "level cannot be deleted");
        return -1;
    }
    long level = PyLong_AsLong(value);
    if (level == -1 && PyErr_Occurred()) {
        return -1;
    }
    self->level = level;
    return 0;
}

static PyObject *
get_open(Emitter *self, void *closure)
{
    return PyBool_FromLong(self->open);
}

static int
set_open(Emitter *self, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "open cannot be deleted");
        return -1;
    }
    int open = PyObject_IsTrue(value);
    if (open < 0) {
        return -1;
    }
    self->open = open;
    return 0;
}

static PyGetSetDef getset[] = {
    {"seq", (getter)get_seq, NULL, "The seq the next stamped event gets.", NULL},
    {"level", (getter)get_level, (setter)set_level, "Events above this level are filtered.",
     NULL},
    {"open", (getter)get_open, (setter)set_open,
     "False once the hub is closed or its writer failed: every emit takes the slow path.",
     NULL},
    {NULL},
};

static PyMethodDef emitter_methods[] = {
    {"emit", (PyCFunction)emitter_emit, METH_O, emit_doc},
    {"push", (PyCFunction)emitter_push, METH_O, push_doc},
    {NULL, NULL, 0, NULL},
};

static int
emitter_traverse(Emitter *self, visitproc visit, void *arg)
{
    Py_VISIT(self->levels);
    Py_VISIT(self->buffer);
    Py_VISIT(self->slow);
    Py_VISIT(self->clock);
    return 0;
}

static int
emitter_clear(Emitter *self)
{
    Py_CLEAR(self->levels);
    Py_CLEAR(self->buffer);
    Py_CLEAR(self->run_id);
    Py_CLEAR(self->rank);
    Py_CLEAR(self->slow);
    Py_CLEAR(self->clock);
    return 0;
}

static void
emitter_dealloc(Emitter *self)
{
    PyObject_GC_UnTrack(self);
    emitter_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(emitter_doc,
"Emitter(base, descriptors, levels, buffer, capacity, run_id, rank, seq, level, slow)\n\n"
"The emit fast path of one hub: ``base`` is the envelope Struct and ``descriptors`` its\n"
"member descriptors of run_id, seq, ts_ns and rank; ``levels`` maps each event class\n"
"(subclasses of ``base``) to its level; ``buffer`` is the writer's list, ``capacity``\n"
"its bound; ``seq`` the first seq to stamp; ``slow`` the hub's Python emit.");

static PyTypeObject EmitterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "esper.telemetry._emit.Emitter",
    .tp_basicsize = sizeof(Emitter),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = emitter_doc,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)emitter_init,
    .tp_dealloc = (destructor)emitter_dealloc,
    .tp_traverse = (traverseproc)emitter_traverse,
    .tp_clear = (inquiry)emitter_clear,
    .tp_methods = emitter_methods,
    .tp_getset = getset,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_emit", "The hub's emit fast path (optional accelerator).", -1,
    NULL,
};

PyMODINIT_FUNC
PyInit__emit(void)
{
    if (PyType_Ready(&EmitterType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "Emitter", (PyObject *)&EmitterType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
