/* The sinks' per-message encoding in C, where the relay's thread spent the most of what a
 * sink adds to it (bench/catchup.py --profile; docs/benchmarks.md): the part of a message
 * that is its own (its last headers, key, value and time), its transaction's part being made
 * once in Python and passed in.
 *
 *   amqp_record_tail   connectors/rabbitmq/amqp_message.py `encode_record` (RabbitMQ Streams)
 *   nats_header_tail   connectors/nats/sink.py `message_header_block` (NATS JetStream)
 *
 * Each returns the bytes the Python function makes (tests/unit/test_sink_native_amqp.py and
 * test_sink_native_nats.py compare them on generated records) or None for anything but the
 * common case, which then goes the Python way; a wrong type is None too, never an error.
 * Optional: built by `tools/build_native.py sink_native` (run by `./run.sh setup` where a C
 * compiler is) and loaded by connectors/sink_native.py only when its BUILT_FROM is the
 * SHA-256 of this file; without it the Python functions run.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifndef BUILT_FROM
#define BUILT_FROM ""
#endif

/* the relay's messages have SUFFIX (4) headers after their transaction's; room for more */
#define MAX_TAIL 16

static unsigned char *put(unsigned char *p, const void *src, Py_ssize_t n) {
    memcpy(p, src, (size_t)n);
    return p + n;
}

static unsigned char *put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
    return p + 4;
}

static PyObject *go_python_way(void) {
    PyErr_Clear();
    Py_RETURN_NONE;
}

static int is_ascii(PyObject *bytes) {
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(bytes);
    unsigned char seen = 0;
    for (Py_ssize_t i = 0, n = PyBytes_GET_SIZE(bytes); i < n; i++) seen |= p[i];
    return seen < 0x80;
}

/* One of a message's last headers, the relay's kind: an exact (str, bytes) pair whose name is
 * not in `closed`, not among the `k` names taken before it (`own`) and already made in `made`
 * (a dict of name -> its encoded bytes, filled by the Python way). 1: taken (*name, *value,
 * *encoded set); 0: a None value, left out; -1: anything else, the Python way. */
static int own_header(PyObject *item, PyObject *closed, PyObject *const *own, Py_ssize_t k, PyObject *made,
                      PyObject **name, PyObject **value, PyObject **encoded) {
    if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) != 2) return -1;
    *name = PyTuple_GET_ITEM(item, 0);
    *value = PyTuple_GET_ITEM(item, 1);
    if (*value == Py_None) return 0;
    if (!PyUnicode_CheckExact(*name) || !PyBytes_CheckExact(*value)) return -1;
    if (PySet_Contains(closed, *name) != 0) return -1;
    for (Py_ssize_t j = 0; j < k; j++) {
        if (PyObject_RichCompareBool(own[j], *name, Py_EQ) != 0) return -1;
    }
    *encoded = PyDict_GetItemWithError(made, *name); /* borrowed */
    if (*encoded == NULL || !PyBytes_CheckExact(*encoded)) return -1;
    return 1;
}

/* ======================================================================= RabbitMQ Streams */

/* amqp_record_tail(block, count, closed, headers, cut, key, value, creation_time_ms, names,
 *                  key_name, null_name) -> bytes | None
 *
 * The message's bytes, the same as the Python function's (tests/unit/test_sink_native_amqp.py
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

static const unsigned char CREATED_HEAD[16] = {
    0x00, 0x53, 0x73, 0xC0, 19, 10, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x40, 0x83,
};
static const unsigned char APPLICATION_PROPERTIES[4] = {0x00, 0x53, 0x74, 0xD1};
static const unsigned char DATA[4] = {0x00, 0x53, 0x75, 0xB0};
static const char TRUE_TEXT[4] = {'t', 'r', 'u', 'e'};

/* an entry's value: its str32 head (b1, length) then the bytes */
static unsigned char *put_str32(unsigned char *p, const void *src, Py_ssize_t n) {
    *p++ = 0xB1;
    p = put_u32(p, (uint32_t)n);
    return put(p, src, n);
}

static PyObject *amqp_record_tail(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 11) {
        PyErr_SetString(PyExc_TypeError, "amqp_record_tail takes 11 arguments");
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
        PyObject *name, *v, *made;
        int taken = own_header(PyList_GET_ITEM(headers, i), closed, own, k, names, &name, &v, &made);
        if (taken < 0) return go_python_way();
        if (!taken) continue;
        if (!is_ascii(v)) return go_python_way();
        own[k] = name;
        entry[k] = made;
        raw[k] = v;
        k++;
        table += PyBytes_GET_SIZE(made) + 5 + PyBytes_GET_SIZE(v);
    }
    count += k;
    if (key != Py_None) {
        if (!PyBytes_CheckExact(key)) return go_python_way();
        if (!is_ascii(key)) return go_python_way();
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
    p = put(p, CREATED_HEAD, sizeof CREATED_HEAD);
    uint64_t t = (uint64_t)ts;
    p = put_u32(p, (uint32_t)(t >> 32));
    p = put_u32(p, (uint32_t)t);
    p = put(p, APPLICATION_PROPERTIES, sizeof APPLICATION_PROPERTIES);
    p = put_u32(p, (uint32_t)(table + 4));
    p = put_u32(p, (uint32_t)(2 * count));
    p = put(p, PyBytes_AS_STRING(block), PyBytes_GET_SIZE(block));
    for (Py_ssize_t j = 0; j < k; j++) {
        p = put(p, PyBytes_AS_STRING(entry[j]), PyBytes_GET_SIZE(entry[j]));
        p = put_str32(p, PyBytes_AS_STRING(raw[j]), PyBytes_GET_SIZE(raw[j]));
    }
    if (key != Py_None) {
        p = put(p, PyBytes_AS_STRING(key_name), PyBytes_GET_SIZE(key_name));
        p = put_str32(p, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key));
    }
    if (value == Py_None) {
        p = put(p, PyBytes_AS_STRING(null_name), PyBytes_GET_SIZE(null_name));
        p = put_str32(p, TRUE_TEXT, 4);
    }
    p = put(p, DATA, sizeof DATA);
    p = put_u32(p, (uint32_t)body);
    if (body) p = put(p, PyBytes_AS_STRING(value), body);
    if (p != (unsigned char *)PyBytes_AS_STRING(out) + total) { /* a sizing slip: never hand it on */
        Py_DECREF(out);
        PyErr_SetString(PyExc_SystemError, "amqp_record_tail: the message's size was miscounted");
        return NULL;
    }
    return out;
}

/* ======================================================================= NATS JetStream */

/* nats_header_tail(block, closed, middle, headers, cut, key, value, ts, topic, known, identity,
 *                  row_name, key_prefix, null_line, ts_prefix, msg_id_prefix) -> bytes | None
 *
 * The header block's bytes, the same as the Python function's (tests/unit/test_sink_native_nats.py
 * compares them), or None for anything but the common case, which then goes the Python way:
 *   - a type other than the exact one (str names, topic and middle; bytes values; int time);
 *   - a value, key, topic or middle that is not ASCII, holds CR or LF, or (a value, a key)
 *     begins or ends with white space (the Python way decodes, replaces and strips those);
 *   - a name in `closed` (the transaction's names and those the block writes itself) or twice
 *     among the last ones, a name `known` does not hold yet;
 *   - an identity other than the transaction's plus the row (`middle` None, or an identity
 *     name other than the row's among the last ones), a row that is not plain digits.
 *
 * What it writes (the NATS protocol's headers, https://docs.nats.io/reference/reference-protocols/nats-protocol
 * HPUB: `Name: value` lines ended by CR LF), in the Python way's order:
 *   block (NATS/1.0 and the transaction's lines) | each last header's `Name: value` (none for
 *   an empty name) | `cdc.key: ...` | the null value's line | the timestamp's line |
 *   `Nats-Msg-Id: <topic>|<middle>|<row>` when there is a row.
 * No line ends the block: the pump adds it (after the chain's header when there is one).
 */

/* str.strip()'s white space among ASCII: \t \n \v \f \r, \x1c-\x1f, space */
static int is_space(unsigned char c) { return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F); }

/* ASCII, no CR or LF */
static int is_plain(const unsigned char *p, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) {
        if (p[i] >= 0x80 || p[i] == '\r' || p[i] == '\n') return 0;
    }
    return 1;
}

/* plain, and nothing for strip() to take off */
static int is_clean(PyObject *bytes) {
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(bytes);
    Py_ssize_t n = PyBytes_GET_SIZE(bytes);
    if (!is_plain(p, n)) return 0;
    return n == 0 || (!is_space(p[0]) && !is_space(p[n - 1]));
}

static PyObject *nats_header_tail(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 16) {
        PyErr_SetString(PyExc_TypeError, "nats_header_tail takes 16 arguments");
        return NULL;
    }
    PyObject *block = args[0], *closed = args[1], *middle = args[2], *headers = args[3];
    PyObject *cut_obj = args[4], *key = args[5], *value = args[6], *ts = args[7], *topic = args[8];
    PyObject *known = args[9], *identity = args[10], *row_name = args[11];
    PyObject *key_prefix = args[12], *null_line = args[13], *ts_prefix = args[14], *msg_id_prefix = args[15];

    if (!PyBytes_CheckExact(block) || !PyAnySet_Check(closed) || !PyList_CheckExact(headers) ||
        !PyUnicode_CheckExact(topic) || !PyDict_CheckExact(known) || !PyAnySet_Check(identity) ||
        !PyUnicode_CheckExact(row_name) || !PyBytes_CheckExact(key_prefix) || !PyBytes_CheckExact(null_line) ||
        !PyBytes_CheckExact(ts_prefix) || !PyBytes_CheckExact(msg_id_prefix))
        return go_python_way();
    if (middle == Py_None || !PyUnicode_CheckExact(middle)) return go_python_way();
    Py_ssize_t cut = PyLong_AsSsize_t(cut_obj);
    if (PyErr_Occurred()) return go_python_way();
    Py_ssize_t n = PyList_GET_SIZE(headers);
    if (cut < 0 || cut > n || n - cut > MAX_TAIL) return go_python_way();

    PyObject *own[MAX_TAIL], *line[MAX_TAIL], *raw[MAX_TAIL];
    Py_ssize_t k = 0;
    Py_ssize_t size = PyBytes_GET_SIZE(block);
    PyObject *row = NULL;
    for (Py_ssize_t i = cut; i < n; i++) {
        PyObject *name, *v, *made; /* made: `Name: `, or b"" for a name that strips to nothing */
        int taken = own_header(PyList_GET_ITEM(headers, i), closed, own, k, known, &name, &v, &made);
        if (taken < 0) return go_python_way();
        if (!taken) continue;
        if (!is_clean(v)) return go_python_way();
        int in_identity = PySet_Contains(identity, name);
        if (in_identity < 0) return go_python_way();
        if (in_identity) {
            int is_row = PyObject_RichCompareBool(name, row_name, Py_EQ);
            if (is_row != 1) return go_python_way(); /* another identity name: the Python way */
            row = v;
        }
        own[k] = name;
        line[k] = made;
        raw[k] = v;
        k++;
        if (PyBytes_GET_SIZE(made)) size += PyBytes_GET_SIZE(made) + PyBytes_GET_SIZE(v) + 2;
    }
    if (key != Py_None) {
        if (!PyBytes_CheckExact(key)) return go_python_way();
        if (!is_clean(key)) return go_python_way();
        size += PyBytes_GET_SIZE(key_prefix) + PyBytes_GET_SIZE(key) + 2;
    }
    if (value == Py_None) size += PyBytes_GET_SIZE(null_line);
    char ts_text[24];
    int ts_len = 0;
    if (ts != Py_None) {
        if (!PyLong_CheckExact(ts)) return go_python_way();
        long long t = PyLong_AsLongLong(ts);
        if (PyErr_Occurred()) return go_python_way();
        ts_len = snprintf(ts_text, sizeof ts_text, "%lld", t);
        size += PyBytes_GET_SIZE(ts_prefix) + ts_len + 2;
    }
    /* Nats-Msg-Id: topic|middle|int(row) */
    char row_text[24];
    int row_len = 0;
    Py_ssize_t topic_len = 0, middle_len = 0;
    const char *topic_text = NULL, *middle_text = NULL;
    if (row != NULL) {
        Py_ssize_t digits = PyBytes_GET_SIZE(row);
        const char *d = PyBytes_AS_STRING(row);
        if (digits < 1 || digits > 18) return go_python_way();
        long long r = 0;
        for (Py_ssize_t i = 0; i < digits; i++) {
            if (d[i] < '0' || d[i] > '9') return go_python_way();
            r = r * 10 + (d[i] - '0');
        }
        row_len = snprintf(row_text, sizeof row_text, "%lld", r);
        if (!PyUnicode_IS_ASCII(topic) || !PyUnicode_IS_ASCII(middle)) return go_python_way();
        topic_text = (const char *)PyUnicode_DATA(topic);
        middle_text = (const char *)PyUnicode_DATA(middle);
        topic_len = PyUnicode_GET_LENGTH(topic);
        middle_len = PyUnicode_GET_LENGTH(middle);
        if (!is_plain((const unsigned char *)topic_text, topic_len) ||
            !is_plain((const unsigned char *)middle_text, middle_len))
            return go_python_way();
        /* what strip() would see first: the topic's first character, else the bar */
        if (topic_len && is_space((unsigned char)topic_text[0])) return go_python_way();
        size += PyBytes_GET_SIZE(msg_id_prefix) + topic_len + 1 + middle_len + 1 + row_len + 2;
    }

    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL) return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    p = put(p, PyBytes_AS_STRING(block), PyBytes_GET_SIZE(block));
    for (Py_ssize_t j = 0; j < k; j++) {
        if (!PyBytes_GET_SIZE(line[j])) continue; /* an empty name: no line, as nats-py */
        p = put(p, PyBytes_AS_STRING(line[j]), PyBytes_GET_SIZE(line[j]));
        p = put(p, PyBytes_AS_STRING(raw[j]), PyBytes_GET_SIZE(raw[j]));
        p = put(p, "\r\n", 2);
    }
    if (key != Py_None) {
        p = put(p, PyBytes_AS_STRING(key_prefix), PyBytes_GET_SIZE(key_prefix));
        p = put(p, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key));
        p = put(p, "\r\n", 2);
    }
    if (value == Py_None) p = put(p, PyBytes_AS_STRING(null_line), PyBytes_GET_SIZE(null_line));
    if (ts != Py_None) {
        p = put(p, PyBytes_AS_STRING(ts_prefix), PyBytes_GET_SIZE(ts_prefix));
        p = put(p, ts_text, ts_len);
        p = put(p, "\r\n", 2);
    }
    if (row != NULL) {
        p = put(p, PyBytes_AS_STRING(msg_id_prefix), PyBytes_GET_SIZE(msg_id_prefix));
        p = put(p, topic_text, topic_len);
        p = put(p, "|", 1);
        p = put(p, middle_text, middle_len);
        p = put(p, "|", 1);
        p = put(p, row_text, row_len);
        p = put(p, "\r\n", 2);
    }
    if (p != (unsigned char *)PyBytes_AS_STRING(out) + size) { /* a sizing slip: never hand it on */
        Py_DECREF(out);
        PyErr_SetString(PyExc_SystemError, "nats_header_tail: the block's size was miscounted");
        return NULL;
    }
    return out;
}


static PyMethodDef methods[] = {
    {"amqp_record_tail", (PyCFunction)(void (*)(void))amqp_record_tail, METH_FASTCALL,
     "A Streams message's bytes from its transaction's encoded headers and its own, or None (the Python way)."},
    {"nats_header_tail", (PyCFunction)(void (*)(void))nats_header_tail, METH_FASTCALL,
     "A NATS message's header block from its transaction's lines and its own headers, or None (the Python way)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_sink_native", "connectors/sink_native.c", -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__sink_native(void) {
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) return NULL;
    if (PyModule_AddStringConstant(m, "BUILT_FROM", BUILT_FROM) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
