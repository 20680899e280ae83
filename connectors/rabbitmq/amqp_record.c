/* The per-message part of connectors/rabbitmq/amqp_message.py `encode_record`, in C: the
 * relay's publish path for RabbitMQ Streams spent ~1.9 us a message in that Python
 * function, the largest cost the sink adds to the relay's thread (bench/catchup.py
 * --profile; docs/benchmarks.md). Optional: built by tools/build_amqp_record.py (run by
 * `./run.sh setup` where a C compiler is), loaded by amqp_record_native.py only when its
 * BUILT_FROM is the SHA-256 of this file; without it the Python function runs.
 *
 * encode_tail(block, count, closed, headers, cut, key, value, creation_time_ms, names,
 *             key_name, null_name) -> bytes | None
 *
 * The message's bytes, the same as the Python function's (tests/unit/test_amqp_record_native.py
 * compares them), or None for anything but the common case, which then goes the Python way:
 * a type other than the exact one (str names, bytes values), a non-ASCII value or key (the
 * Python way re-encodes those), a name in `closed` (the transaction's names and the two the
 * record writes itself) or twice among the last ones, a name `names` does not hold yet, a
 * timestamp outside a signed 64-bit integer, a length past 32 bits.
 *
 * The layout (OASIS AMQP 1.0 part 3.2, "Message Format"; the types of part 1.6), as
 * amqp_message.py's docstring describes it:
 *   00 53 73  c0 19 0a  40 x9  83 <creation-time: 8 bytes, big-endian, signed>   properties
 *   00 53 74  d1 <size: u32> <count: u32> <entries>                             application-properties
 *   00 53 75  b0 <length: u32> <body>                                           data
 * an entry being its name's str32 (b1, u32 length, UTF-8; `names` holds them made) then the
 * value's str32. Sizes and counts are big-endian (part 1.6.1, "fixed width").
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#ifndef BUILT_FROM
#define BUILT_FROM ""
#endif

/* the relay's messages have SUFFIX (4) headers after their transaction's; room for more */
#define MAX_TAIL 16

static const unsigned char CREATED_HEAD[16] = {
    0x00, 0x53, 0x73, 0xC0, 19, 10, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x83,
};
static const unsigned char APPLICATION_PROPERTIES[4] = {0x00, 0x53, 0x74, 0xD1};
static const unsigned char DATA[4] = {0x00, 0x53, 0x75, 0xB0};
static const char TRUE_TEXT[4] = {'t', 'r', 'u', 'e'};

static int is_ascii(const unsigned char *p, Py_ssize_t n) {
    unsigned char seen = 0;
    for (Py_ssize_t i = 0; i < n; i++) seen |= p[i];
    return seen < 0x80;
}

static unsigned char *put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
    return p + 4;
}

static unsigned char *put_bytes(unsigned char *p, const void *src, Py_ssize_t n) {
    memcpy(p, src, (size_t)n);
    return p + n;
}

/* an entry's value: its str32 head (b1, length) then the bytes */
static unsigned char *put_str32(unsigned char *p, const void *src, Py_ssize_t n) {
    *p++ = 0xB1;
    p = put_u32(p, (uint32_t)n);
    return put_bytes(p, src, n);
}

static PyObject *go_python_way(void) {
    PyErr_Clear();
    Py_RETURN_NONE;
}

static PyObject *encode_tail(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "encode_tail takes 11 arguments");
        return NULL;
    }
    PyObject *block = args[0], *count_obj = args[1], *closed = args[2], *headers = args[3];
    PyObject *cut_obj = args[4], *key = args[5], *value = args[6], *ts_obj = args[7];
    PyObject *names = args[8], *key_name = args[9], *null_name = args[10];

    if (!PyBytes_CheckExact(block) || !PyList_CheckExact(headers) || !PyAnySet_Check(closed) ||
        !PyDict_CheckExact(names) || !PyBytes_CheckExact(key_name) || !PyBytes_CheckExact(null_name))
        return go_python_way();
    Py_ssize_t count = PyLong_AsSsize_t(count_obj);
    Py_ssize_t cut = PyLong_AsSsize_t(cut_obj);
    long long ts = PyLong_AsLongLong(ts_obj);
    if (PyErr_Occurred()) return go_python_way();
    Py_ssize_t n = PyList_GET_SIZE(headers);
    if (cut < 0 || cut > n || n - cut > MAX_TAIL || count < 0) return go_python_way();

    PyObject *own[MAX_TAIL], *entry[MAX_TAIL], *raw[MAX_TAIL];
    Py_ssize_t k = 0;
    Py_ssize_t table = PyBytes_GET_SIZE(block);
    for (Py_ssize_t i = cut; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(headers, i);
        if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2) return go_python_way();
        PyObject *name = PyTuple_GET_ITEM(item, 0), *v = PyTuple_GET_ITEM(item, 1);
        if (v == Py_None) continue;
        if (!PyUnicode_CheckExact(name) || !PyBytes_CheckExact(v)) return go_python_way();
        if (PySet_Contains(closed, name) != 0) return go_python_way();
        for (Py_ssize_t j = 0; j < k; j++) {
            if (PyObject_RichCompareBool(own[j], name, Py_EQ) != 0) return go_python_way();
        }
        PyObject *made = PyDict_GetItemWithError(names, name); /* borrowed */
        if (made == NULL || !PyBytes_CheckExact(made)) return go_python_way();
        if (!is_ascii((const unsigned char *)PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v))) return go_python_way();
        own[k] = name;
        entry[k] = made;
        raw[k] = v;
        k++;
        table += PyBytes_GET_SIZE(made) + 5 + PyBytes_GET_SIZE(v);
    }
    count += k;
    if (key != Py_None) {
        if (!PyBytes_CheckExact(key)) return go_python_way();
        if (!is_ascii((const unsigned char *)PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key))) return go_python_way();
        table += PyBytes_GET_SIZE(key_name) + 5 + PyBytes_GET_SIZE(key);
        count += 1;
    }
    Py_ssize_t body = 0;
    if (value == Py_None) {
        table += PyBytes_GET_SIZE(null_name) + 5 + 4;
        count += 1;
    } else {
        if (!PyBytes_CheckExact(value)) return go_python_way();
        body = PyBytes_GET_SIZE(value);
    }
    /* the Python way's struct.pack(">I", ...) raises past 32 bits: let it */
    if ((uint64_t)table + 4 > 0xFFFFFFFFu || (uint64_t)count * 2 > 0xFFFFFFFFu || (uint64_t)body > 0xFFFFFFFFu)
        return go_python_way();

    Py_ssize_t total = 16 + 8 + 4 + 4 + 4 + table + 4 + 4 + body;
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    p = put_bytes(p, CREATED_HEAD, sizeof CREATED_HEAD);
    uint64_t t = (uint64_t)ts;
    p = put_u32(p, (uint32_t)(t >> 32));
    p = put_u32(p, (uint32_t)t);
    p = put_bytes(p, APPLICATION_PROPERTIES, sizeof APPLICATION_PROPERTIES);
    p = put_u32(p, (uint32_t)(table + 4));
    p = put_u32(p, (uint32_t)(2 * count));
    p = put_bytes(p, PyBytes_AS_STRING(block), PyBytes_GET_SIZE(block));
    for (Py_ssize_t j = 0; j < k; j++) {
        p = put_bytes(p, PyBytes_AS_STRING(entry[j]), PyBytes_GET_SIZE(entry[j]));
        p = put_str32(p, PyBytes_AS_STRING(raw[j]), PyBytes_GET_SIZE(raw[j]));
    }
    if (key != Py_None) {
        p = put_bytes(p, PyBytes_AS_STRING(key_name), PyBytes_GET_SIZE(key_name));
        p = put_str32(p, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key));
    }
    if (value == Py_None) {
        p = put_bytes(p, PyBytes_AS_STRING(null_name), PyBytes_GET_SIZE(null_name));
        p = put_str32(p, TRUE_TEXT, 4);
    }
    p = put_bytes(p, DATA, sizeof DATA);
    p = put_u32(p, (uint32_t)body);
    if (body) p = put_bytes(p, PyBytes_AS_STRING(value), body);
    if (p != (unsigned char *)PyBytes_AS_STRING(out) + total) { /* a sizing slip: never hand it on */
        Py_DECREF(out);
        PyErr_SetString(PyExc_SystemError, "amqp_record: the message's size was miscounted");
        return NULL;
    }
    return out;
}

static PyMethodDef methods[] = {
    {"encode_tail", (PyCFunction)(void (*)(void))encode_tail, METH_FASTCALL,
     "A message's bytes from its transaction's encoded headers and its own, or None (the Python way)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_amqp_record", "connectors/rabbitmq/amqp_record.c", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__amqp_record(void) {
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    if (PyModule_AddStringConstant(m, "BUILT_FROM", BUILT_FROM) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
