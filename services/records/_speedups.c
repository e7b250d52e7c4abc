/*
 * _speedups: an optional C accelerator for the per-record hot loops of the RecordBatch v2 codec.
 *
 * It accelerates three loops that run once per record and dominate the codec's cost in Python:
 *
 *   decode_records        record.py's decode_records: the consumer path (fetch, iterate a batch).
 *   validate_records      record.py's validate_records: the storage node's check of every record
 *                         of every batch it is asked to append.
 *   append_record         the per-record encode inside builder.py's RecordBatchBuilder.append:
 *                         the producer path.
 *
 * and the Arrow paths of the SDK and the Spark source and sink (columns.py is their reference):
 *
 *   Columns               records of fetched batches decoded straight into Arrow buffers,
 *                         decode_records' checks without a Python object per record;
 *   encode_columns        Arrow binary columns (keys, values, headers) encoded as records;
 *   partition_keys        Kafka's murmur2 partition of every key of an Arrow column.
 *
 * The pure-Python code in record.py and builder.py is the reference and the fallback. These
 * functions must return the same values and raise the same exception types for every input;
 * tests/unit/services/records/test_records_speedups.py checks them side by side on random valid
 * and malformed batches. Where this file and the Python disagree, the Python is right.
 * record.py chooses between the two at import (see ``speedups_enabled``); setting the
 * environment variable TRIBUTARY_NO_EXTENSIONS to a non-empty value selects the Python code.
 *
 * decode_records and validate_records parse untrusted bytes from the network. The rules
 * that keep them memory-safe on any input:
 *   - every byte is read through an index compared against the end of the buffer (and, inside
 *     a record, the end of that record) immediately before the read;
 *   - every length read from the data is compared against the bytes left (a subtraction that
 *     cannot overflow) before it is added to a position;
 *   - varints are decoded into 64-bit unsigned integers from at most 5 (varint) or 10 (varlong)
 *     bytes, so they cannot overflow either;
 *   - the input is held through the buffer protocol for the whole call, so a bytearray cannot
 *     be resized underneath the parser.
 *
 * append_record handles only the common argument types (exact ints, bytes-like keys and
 * values, tuple/list headers of (str, bytes | bytearray | None)). For anything else, or any
 * value out of range, it writes nothing and returns False, and builder.py encodes the record
 * (or raises the right error) in Python. That keeps every error path in one place.
 *
 * The module keeps its state in two C globals set by init(); it supports neither
 * sub-interpreters nor being initialised with different classes at the same time.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>
#include <time.h>

/* services.records.record.Record and services.errors.CorruptRecordError, set by init(). */
static PyTypeObject *record_type = NULL;
static PyObject *corrupt_error = NULL;

/* format.py's MIN_RECORD_SIZE: length, attributes, timestampDelta, offsetDelta, keyLength,
 * valueLength and headerCount, one byte each. */
#define MIN_RECORD_SIZE 7
#define VARINT_MAX_BYTES 5
#define VARLONG_MAX_BYTES 10
#define RECORD_FIELDS 5

/* ------------------------------------------------------------------------------------------ */
/* helpers                                                                                    */
/* ------------------------------------------------------------------------------------------ */

static int
ensure_initialised(void)
{
    if (record_type == NULL || corrupt_error == NULL) {
        PyErr_SetString(PyExc_RuntimeError,
                        "services.records._speedups.init() has not been called");
        return -1;
    }
    return 0;
}

/* Parse vectorcall arguments against a list of parameter names, as a def with positional-or-
 * keyword parameters would. Unfilled optional slots are left NULL. References are borrowed. */
static int
parse_args(const char *fname, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
           const char *const *names, Py_ssize_t nrequired, Py_ssize_t nparams, PyObject **out)
{
    Py_ssize_t i, k;

    for (i = 0; i < nparams; i++) {
        out[i] = NULL;
    }
    if (nargs > nparams) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %zd arguments (%zd given)", fname,
                     nparams, nargs);
        return -1;
    }
    for (i = 0; i < nargs; i++) {
        out[i] = args[i];
    }
    if (kwnames != NULL) {
        Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
        for (k = 0; k < nkw; k++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, k);
            for (i = 0; i < nparams; i++) {
                if (PyUnicode_CompareWithASCIIString(name, names[i]) == 0) {
                    break;
                }
            }
            if (i == nparams) {
                PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'",
                             fname, name);
                return -1;
            }
            if (out[i] != NULL) {
                PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'",
                             fname, names[i]);
                return -1;
            }
            out[i] = args[nargs + k];
        }
    }
    for (i = 0; i < nrequired; i++) {
        if (out[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", fname,
                         names[i]);
            return -1;
        }
    }
    return 0;
}

/* Decode a zigzag varint (max_bytes 5) or varlong (max_bytes 10) starting at buf[*pos], as
 * varint.py's _decode does: nothing at or beyond ``end`` is read (CorruptRecordError
 * "truncated"), at most max_bytes bytes are read, and bits beyond 32 (varint) or 64 (varlong)
 * in the last byte are rejected. ``end`` never lies beyond the buffer. Returns the number of
 * bytes read (and advances *pos), or 0 with an exception set. */
static int
read_varint_slow(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t end, int max_bytes,
                 int64_t *out)
{
    Py_ssize_t start = *pos, p = *pos;
    uint64_t raw = 0;
    int i;

    for (i = 0; i < max_bytes; i++) {
        unsigned int b;
        if (p >= end) {
            PyErr_Format(corrupt_error, "truncated %s at byte %zd",
                         max_bytes == VARINT_MAX_BYTES ? "varint" : "varlong", start);
            return 0;
        }
        b = buf[p++];
        /* For i == 9 the shift is 63: bits past 64 are dropped here and rejected below. */
        raw |= (uint64_t)(b & 0x7F) << (7 * i);
        if (b < 0x80) {
            /* Bits beyond the value width can only come from the last possible byte: bits
             * 4-6 of a varint's fifth byte, bits 1-6 of a varlong's tenth. */
            if ((max_bytes == VARINT_MAX_BYTES && i == 4 && (b & 0x70)) ||
                (max_bytes == VARLONG_MAX_BYTES && i == 9 && (b & 0x7E))) {
                PyErr_Format(corrupt_error, "%s out of range at byte %zd",
                             max_bytes == VARINT_MAX_BYTES ? "varint" : "varlong", start);
                return 0;
            }
            /* Two's-complement conversion of the unsigned zigzag result (defined by gcc/clang
             * and every platform CPython supports). */
            *out = (int64_t)((raw >> 1) ^ (~(raw & 1) + 1));
            *pos = p;
            return i + 1;
        }
    }
    PyErr_Format(corrupt_error, "%s longer than %d bytes at byte %zd",
                 max_bytes == VARINT_MAX_BYTES ? "varint" : "varlong", max_bytes, start);
    return 0;
}

/* One- and two-byte varints (nearly every length and delta in a batch: up to 8191) inline;
 * others out of line. Two bytes cannot exceed either width, so no range check is needed. */
static inline int
read_varint(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t end, int max_bytes,
            int64_t *out)
{
    Py_ssize_t p = *pos;
    if (p < end && buf[p] < 0x80) {
        unsigned int b = buf[p];
        *out = (int64_t)(b >> 1) ^ -(int64_t)(b & 1);
        *pos = p + 1;
        return 1;
    }
    if (end - p >= 2 && buf[p + 1] < 0x80) { /* p < end here: buf[p] >= 0x80 */
        unsigned int raw = (buf[p] & 0x7Fu) | ((unsigned int)buf[p + 1] << 7);
        *out = (int64_t)(raw >> 1) ^ -(int64_t)(raw & 1);
        *pos = p + 2;
        return 2;
    }
    return read_varint_slow(buf, pos, end, max_bytes, out);
}

/* ``base + delta`` as a new Python int. ``base_fits`` says that ``base`` is an exact int whose
 * value is ``base_value``; otherwise (or on int64 overflow) Python's own ``+`` does the work, so
 * the result is what record.py computes for any base. */
static PyObject *
add_delta(PyObject *base, int base_fits, int64_t base_value, int64_t delta)
{
    int64_t sum;
    PyObject *delta_obj, *result;

    if (base_fits && !__builtin_add_overflow(base_value, delta, &sum)) {
        return PyLong_FromLongLong(sum);
    }
    delta_obj = PyLong_FromLongLong(delta);
    if (delta_obj == NULL) {
        return NULL;
    }
    result = PyNumber_Add(base, delta_obj);
    Py_DECREF(delta_obj);
    return result;
}

/* Whether ``obj`` is an exact int that fits an int64, storing it in *value. Never raises. */
static int
exact_int64(PyObject *obj, int64_t *value)
{
    int overflow;
    long long v;

    if (!PyLong_CheckExact(obj)) {
        return 0;
    }
    v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *value = (int64_t)v;
    return 1;
}

/* ------------------------------------------------------------------------------------------ */
/* decode_records                                                                             */
/* ------------------------------------------------------------------------------------------ */

/* record.py's _decode_headers: the header count, then (key, value) pairs, inside
 * buf[*pos..rend). Returns a new tuple of 2-tuples and advances *pos, or NULL on error. */
static PyObject *
decode_headers(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t rend)
{
    int64_t count, size;
    Py_ssize_t p = *pos, i;
    PyObject *headers = NULL, *key = NULL, *value = NULL, *pair;

    if (!read_varint(buf, &p, rend, VARINT_MAX_BYTES, &count)) {
        return NULL;
    }
    /* Each header takes at least two bytes (two zero lengths). count is an int32, so 2 * count
     * cannot overflow. */
    if (count < 0 || 2 * count > rend - p) {
        PyErr_Format(corrupt_error, "header count %lld out of bounds", (long long)count);
        return NULL;
    }
    headers = PyTuple_New((Py_ssize_t)count);
    if (headers == NULL) {
        return NULL;
    }
    for (i = 0; i < (Py_ssize_t)count; i++) {
        if (!read_varint(buf, &p, rend, VARINT_MAX_BYTES, &size)) {
            goto error;
        }
        if (size < 0 || size > rend - p) {
            PyErr_Format(corrupt_error, "header key length %lld out of bounds", (long long)size);
            goto error;
        }
        key = PyUnicode_DecodeUTF8((const char *)buf + p, (Py_ssize_t)size, NULL);
        if (key == NULL) {
            if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
                /* record.py: raise CorruptRecordError(f"header key is not UTF-8: {exc}") */
#if PY_VERSION_HEX >= 0x030C0000
                PyObject *exc = PyErr_GetRaisedException();
                PyErr_Format(corrupt_error, "header key is not UTF-8: %S", exc);
                Py_XDECREF(exc);
#else
                PyObject *type, *exc, *tb;
                PyErr_Fetch(&type, &exc, &tb);
                PyErr_NormalizeException(&type, &exc, &tb);
                PyErr_Format(corrupt_error, "header key is not UTF-8: %S", exc);
                Py_XDECREF(type);
                Py_XDECREF(exc);
                Py_XDECREF(tb);
#endif
            }
            goto error;
        }
        p += (Py_ssize_t)size;
        if (!read_varint(buf, &p, rend, VARINT_MAX_BYTES, &size)) {
            goto error;
        }
        if (size >= 0) {
            if (size > rend - p) {
                PyErr_Format(corrupt_error, "header value length %lld out of bounds",
                             (long long)size);
                goto error;
            }
            value = PyBytes_FromStringAndSize((const char *)buf + p, (Py_ssize_t)size);
            if (value == NULL) {
                goto error;
            }
            p += (Py_ssize_t)size;
        }
        else if (size == -1) {
            value = Py_NewRef(Py_None);
        }
        else {
            PyErr_Format(corrupt_error, "negative header value length %lld", (long long)size);
            goto error;
        }
        pair = PyTuple_New(2);
        if (pair == NULL) {
            goto error;
        }
        PyTuple_SET_ITEM(pair, 0, key);   /* steals */
        PyTuple_SET_ITEM(pair, 1, value); /* steals */
        key = value = NULL;
        PyTuple_SET_ITEM(headers, i, pair);
    }
    *pos = p;
    return headers;

error:
    Py_XDECREF(key);
    Py_XDECREF(value);
    Py_DECREF(headers); /* tuple dealloc skips the NULL slots not yet filled */
    return NULL;
}

/* One record starting at buf[*pos]; returns a new Record or NULL. *previous_delta is the
 * previous record's offset delta (-1 before the first) and is updated. */
static PyObject *
decode_one(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t end, int64_t *previous_delta,
           PyObject *base_offset, int base_offset_fits, int64_t base_offset_value,
           PyObject *base_timestamp, int base_timestamp_fits, int64_t base_timestamp_value,
           PyObject *log_append_time)
{
    Py_ssize_t p = *pos, rend;
    int64_t length, timestamp_delta, offset_delta, size;
    int size_bytes;
    PyObject *fields[RECORD_FIELDS] = {NULL, NULL, NULL, NULL, NULL};
    PyObject *record;
    int i;

    /* length: varint, bounded by the data (as record.py's decode_varint(data, pos, end)). */
    if (p >= end) {
        /* The message record.py gives when the data stops before a record count says. */
        PyErr_SetString(corrupt_error, "record runs past the end of the batch");
        return NULL;
    }
    if (!read_varint(buf, &p, end, VARINT_MAX_BYTES, &length)) {
        return NULL;
    }
    /* record.py would fail later on a negative length (its fields never end at record_end)
     * or one past the data (the next read or the leftover check fails); fail now. */
    if (length < 0) {
        PyErr_Format(corrupt_error, "negative record length %lld", (long long)length);
        return NULL;
    }
    if (length > end - p) {
        PyErr_SetString(corrupt_error, "record runs past the end of the batch");
        return NULL;
    }
    rend = p + (Py_ssize_t)length;
    /* attributes: int8, unused. Every field below is read within the record: a field crossing
     * rend makes record.py's end-of-record check fail, so failing at the crossing is the same. */
    if (p >= rend) {
        PyErr_SetString(corrupt_error, "record runs past the end of the batch");
        return NULL;
    }
    p += 1;
    /* timestampDelta: varlong (may be negative) */
    if (!read_varint(buf, &p, rend, VARLONG_MAX_BYTES, &timestamp_delta)) {
        return NULL;
    }
    /* offsetDelta: varint, strictly increasing (so never negative) */
    if (!read_varint(buf, &p, rend, VARINT_MAX_BYTES, &offset_delta)) {
        return NULL;
    }
    if (offset_delta <= *previous_delta) {
        PyErr_Format(corrupt_error, "offset delta %lld does not increase (previous %lld)",
                     (long long)offset_delta, (long long)*previous_delta);
        return NULL;
    }
    *previous_delta = offset_delta;
    /* key: varint length (-1 = null), bytes */
    if (!read_varint(buf, &p, rend, VARINT_MAX_BYTES, &size)) {
        return NULL;
    }
    if (size >= 0) {
        if (size > rend - p) {
            PyErr_SetString(corrupt_error, "record runs past the end of the batch");
            return NULL;
        }
        fields[2] = PyBytes_FromStringAndSize((const char *)buf + p, (Py_ssize_t)size);
        if (fields[2] == NULL) {
            return NULL;
        }
        p += (Py_ssize_t)size;
    }
    else if (size == -1) {
        fields[2] = Py_NewRef(Py_None);
    }
    else {
        PyErr_Format(corrupt_error, "negative key length %lld", (long long)size);
        return NULL;
    }
    /* value: varint length (-1 = null), bytes. record.py's two-byte fast path rejects every
     * negative two-byte length, including the non-canonical two-byte -1, so this does too. */
    size_bytes = read_varint(buf, &p, rend, VARINT_MAX_BYTES, &size);
    if (!size_bytes) {
        goto error;
    }
    if (size >= 0) {
        if (size > rend - p) {
            PyErr_SetString(corrupt_error, "record runs past the end of the batch");
            goto error;
        }
        fields[3] = PyBytes_FromStringAndSize((const char *)buf + p, (Py_ssize_t)size);
        if (fields[3] == NULL) {
            goto error;
        }
        p += (Py_ssize_t)size;
    }
    else if (size == -1 && size_bytes != 2) {
        fields[3] = Py_NewRef(Py_None);
    }
    else {
        PyErr_Format(corrupt_error, "negative value length %lld", (long long)size);
        goto error;
    }
    /* headers: varint count, then pairs; a zero byte (no headers) is the common case. */
    if (p >= rend) {
        PyErr_SetString(corrupt_error, "record runs past the end of the batch");
        goto error;
    }
    if (buf[p] == 0) {
        fields[4] = PyTuple_New(0); /* the shared empty tuple, as record.py's () */
        if (fields[4] == NULL) {
            goto error;
        }
        p += 1;
    }
    else {
        fields[4] = decode_headers(buf, &p, rend);
        if (fields[4] == NULL) {
            goto error;
        }
    }
    if (p != rend) {
        PyErr_Format(corrupt_error, "record body is %lld bytes but its fields take %lld",
                     (long long)length, (long long)(length + p - rend));
        goto error;
    }
    fields[0] = add_delta(base_offset, base_offset_fits, base_offset_value, offset_delta);
    if (fields[0] == NULL) {
        goto error;
    }
    if (log_append_time == Py_None) {
        fields[1] = add_delta(base_timestamp, base_timestamp_fits, base_timestamp_value,
                              timestamp_delta);
        if (fields[1] == NULL) {
            goto error;
        }
    }
    else {
        fields[1] = Py_NewRef(log_append_time);
    }
    /* What tuple.__new__(Record, fields) does, minus the intermediate tuple: init() checked
     * that Record is a tuple subclass with the tuple's layout. */
    record = record_type->tp_alloc(record_type, RECORD_FIELDS);
    if (record == NULL) {
        goto error;
    }
#if PY_VERSION_HEX >= 0x030E0000
    /* 3.14 caches a tuple's hash, -1 meaning "not computed"; tp_alloc zero-fills, and a cached
     * 0 would be returned as the hash of every record. tuple_subtype_new resets it the same way. */
    ((PyTupleObject *)record)->ob_hash = -1;
#endif
    for (i = 0; i < RECORD_FIELDS; i++) {
        PyTuple_SET_ITEM(record, i, fields[i]); /* steals */
    }
    *pos = p;
    return record;

error:
    for (i = 0; i < RECORD_FIELDS; i++) {
        Py_XDECREF(fields[i]);
    }
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* walking a record without building it: validate_records, and the records a window skips      */
/* ------------------------------------------------------------------------------------------ */

/* Whether a header key is UTF-8 as Python's strict decoder (decode_headers) takes it. ASCII,
 * nearly every key, is settled here; anything else goes to PyUnicode_DecodeUTF8 itself, so the
 * answer is the decoder's by construction. Returns 1, or 0 with an exception set. */
static int
check_header_key(const unsigned char *key, Py_ssize_t size, Py_ssize_t index)
{
    Py_ssize_t i;
    PyObject *decoded;

    for (i = 0; i < size; i++) {
        if (key[i] & 0x80) {
            break;
        }
    }
    if (i == size) {
        return 1;
    }
    decoded = PyUnicode_DecodeUTF8((const char *)key, size, NULL);
    if (decoded != NULL) {
        Py_DECREF(decoded);
        return 1;
    }
    if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();
        PyErr_Format(corrupt_error, "record %zd has a header key that is not UTF-8", index);
    }
    return 0;
}

/* Past a nullable length-prefixed field (key, value, header value) inside buf[*pos..rend): its
 * length is -1 (null) or fits before rend. Sets *size; returns the length varint's size in bytes,
 * or 0 with an exception set. */
static int
skip_nullable(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t rend, Py_ssize_t index,
              const char *what, int64_t *size)
{
    int size_bytes = read_varint(buf, pos, rend, VARINT_MAX_BYTES, size);

    if (!size_bytes) {
        return 0;
    }
    if (*size < -1 || *size > rend - *pos) {
        PyErr_Format(corrupt_error, "record %zd has %s length %lld with %zd bytes left", index,
                     what, (long long)*size, rend - *pos);
        return 0;
    }
    if (*size > 0) {
        *pos += (Py_ssize_t)*size;
    }
    return size_bytes;
}

/* One record at buf[*pos], checked field by field as decode_one checks it, building nothing:
 * the same inputs fail (the tests compare the two on malformed data). Its offset delta goes to
 * *offset_delta for the caller's rule. Advances *pos; returns 1, or 0 with an exception set. */
static int
walk_record(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t end, Py_ssize_t index,
            int64_t *offset_delta)
{
    Py_ssize_t p = *pos, rend;
    int64_t length, timestamp_delta, size, header_count, i;
    int size_bytes;

    if (p >= end) {
        PyErr_Format(corrupt_error, "the records end before record %zd", index);
        return 0;
    }
    if (!read_varint(buf, &p, end, VARINT_MAX_BYTES, &length)) {
        return 0;
    }
    /* The six one-byte fields after the length; also keeps the attributes byte in the record. */
    if (length < MIN_RECORD_SIZE - 1 || length > end - p) {
        PyErr_Format(corrupt_error, "record %zd has length %lld with %zd bytes left", index,
                     (long long)length, end - p);
        return 0;
    }
    rend = p + (Py_ssize_t)length;
    p += 1; /* attributes: int8, unused */
    if (!read_varint(buf, &p, rend, VARLONG_MAX_BYTES, &timestamp_delta) ||
        !read_varint(buf, &p, rend, VARINT_MAX_BYTES, offset_delta) ||
        !skip_nullable(buf, &p, rend, index, "key", &size)) {
        return 0;
    }
    size_bytes = skip_nullable(buf, &p, rend, index, "value", &size);
    if (!size_bytes) {
        return 0;
    }
    if (size == -1 && size_bytes == 2) { /* see decode_one: the two-byte path reads lengths >= 0 */
        PyErr_Format(corrupt_error, "record %zd has a null value length in two bytes", index);
        return 0;
    }
    if (!read_varint(buf, &p, rend, VARINT_MAX_BYTES, &header_count)) {
        return 0;
    }
    /* Each header takes at least two bytes (two zero lengths); header_count is an int32. */
    if (header_count < 0 || 2 * header_count > rend - p) {
        PyErr_Format(corrupt_error, "record %zd has header count %lld with %zd bytes left", index,
                     (long long)header_count, rend - p);
        return 0;
    }
    for (i = 0; i < header_count; i++) {
        if (!read_varint(buf, &p, rend, VARINT_MAX_BYTES, &size)) {
            return 0;
        }
        if (size < 0 || size > rend - p) {
            PyErr_Format(corrupt_error, "record %zd has header key length %lld with %zd bytes left",
                         index, (long long)size, rend - p);
            return 0;
        }
        if (!check_header_key(buf + p, (Py_ssize_t)size, index)) {
            return 0;
        }
        p += (Py_ssize_t)size;
        if (!skip_nullable(buf, &p, rend, index, "header value", &size)) {
            return 0;
        }
    }
    if (p != rend) {
        PyErr_Format(corrupt_error, "record %zd is %lld bytes but its fields take %lld", index,
                     (long long)length, (long long)(length + p - rend));
        return 0;
    }
    *pos = p;
    return 1;
}

/* Walks (builds nothing) the records a window starts after: from record *index on, up to the
 * first whose offset delta reaches first_delta, which is left at *pos for the caller to decode.
 * Offset deltas must increase, so once one reaches first_delta every later one does too.
 * Advances *pos, *index and *previous_delta; returns 1, or 0 with an exception set. */
static int
skip_below_window(const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t end, Py_ssize_t count,
                  int64_t first_delta, int64_t *previous_delta, Py_ssize_t *index)
{
    for (; *index < count; (*index)++) {
        Py_ssize_t start = *pos;
        int64_t offset_delta;
        if (!walk_record(buf, pos, end, *index, &offset_delta)) {
            return 0;
        }
        if (offset_delta <= *previous_delta) {
            PyErr_Format(corrupt_error, "offset delta %lld does not increase (previous %lld)",
                         (long long)offset_delta, (long long)*previous_delta);
            return 0;
        }
        if (offset_delta >= first_delta) {
            *pos = start;
            return 1;
        }
        *previous_delta = offset_delta;
    }
    return 1;
}

static const char *const decode_records_names[] = {
    "data", "count", "base_offset", "base_timestamp", "log_append_time", "last_offset_delta",
    "first_offset", "max_records",
};

PyDoc_STRVAR(decode_records_doc,
"decode_records(data, count, base_offset, base_timestamp, log_append_time, last_offset_delta,\n"
"               first_offset=None, max_records=None)\n"
"--\n\n"
"C version of services.records.record.decode_records (the reference): decode exactly\n"
"``count`` records that must fill ``data`` (any contiguous buffer) exactly, as a list of\n"
"Record. Keys and values are bytes. Raises CorruptRecordError for malformed data. Records\n"
"below ``first_offset`` are checked but not returned; decoding stops once ``max_records``\n"
"are in the list.");

/* The window arguments of decode_records. *first_delta: records whose offset delta is below it
 * are skipped (first_offset - base_offset, clamped to int64: deltas are int32s). *limit: the
 * most records to return, -1 for all. Returns 0, or -1 with an exception set. */
static int
parse_window(PyObject *first_offset, PyObject *max_records, PyObject *base_offset,
             int64_t *first_delta, Py_ssize_t *limit)
{
    long long value;
    int overflow;

    *first_delta = -1;
    *limit = -1;
    if (first_offset != NULL && first_offset != Py_None) {
        PyObject *difference;
        if (!PyLong_Check(first_offset)) {
            PyErr_Format(PyExc_TypeError, "first_offset must be an int, not %.100s",
                         Py_TYPE(first_offset)->tp_name);
            return -1;
        }
        difference = PyNumber_Subtract(first_offset, base_offset);
        if (difference == NULL) {
            return -1;
        }
        value = PyLong_AsLongLongAndOverflow(difference, &overflow);
        Py_DECREF(difference);
        if (value == -1 && PyErr_Occurred()) {
            return -1;
        }
        *first_delta = overflow > 0 ? INT64_MAX : overflow < 0 ? INT64_MIN : (int64_t)value;
    }
    if (max_records != NULL && max_records != Py_None) {
        if (!PyLong_Check(max_records)) {
            PyErr_Format(PyExc_TypeError, "max_records must be an int, not %.100s",
                         Py_TYPE(max_records)->tp_name);
            return -1;
        }
        value = PyLong_AsLongLongAndOverflow(max_records, &overflow);
        if (value == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (overflow < 0 || (overflow == 0 && value < 1)) {
            PyErr_Format(PyExc_ValueError, "max_records must be at least 1, not %S", max_records);
            return -1;
        }
        *limit = (overflow > 0 || value > PY_SSIZE_T_MAX) ? -1 : (Py_ssize_t)value;
    }
    return 0;
}

static PyObject *
decode_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *argv[8];
    PyObject *data, *count_obj, *base_offset, *base_timestamp, *log_append_time, *last_delta;
    PyObject *records = NULL, *previous = NULL;
    Py_buffer view;
    const unsigned char *buf;
    Py_ssize_t end, pos = 0, i, count, slots, taken = 0, limit;
    long long requested;
    int64_t previous_delta = -1, base_offset_value = 0, base_timestamp_value = 0, first_delta;
    int overflow, base_offset_fits, base_timestamp_fits, exceeds;

    (void)module;
    if (parse_args("decode_records", args, nargs, kwnames, decode_records_names, 6, 8, argv) < 0) {
        return NULL;
    }
    data = argv[0];
    count_obj = argv[1];
    base_offset = argv[2];
    base_timestamp = argv[3];
    log_append_time = argv[4];
    last_delta = argv[5];
    if (ensure_initialised() < 0) {
        return NULL;
    }
    if (!PyLong_Check(count_obj)) {
        PyErr_Format(PyExc_TypeError, "count must be an int, not %.100s",
                     Py_TYPE(count_obj)->tp_name);
        return NULL;
    }
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    buf = (const unsigned char *)view.buf;
    end = view.len;

    requested = PyLong_AsLongLongAndOverflow(count_obj, &overflow);
    if (requested == -1 && PyErr_Occurred()) {
        goto error;
    }
    /* record.py: count * MIN_RECORD_SIZE > len(data), computed without overflow. A count
     * below zero decodes nothing, as range(count) does. */
    if (overflow > 0 || (overflow == 0 && requested > 0 && requested > end / MIN_RECORD_SIZE)) {
        PyErr_Format(corrupt_error, "record count %S cannot fit in %zd bytes of records",
                     count_obj, end);
        goto error;
    }
    count = (overflow < 0 || requested < 0) ? 0 : (Py_ssize_t)requested;
    if (parse_window(argv[6], argv[7], base_offset, &first_delta, &limit) < 0) {
        goto error;
    }

    base_offset_fits = exact_int64(base_offset, &base_offset_value);
    base_timestamp_fits = exact_int64(base_timestamp, &base_timestamp_value);
    /* Bounded by len(data) / 7 entries, checked above, and by the window's limit. Slots not
     * filled (records skipped below first_offset) are cut off at the end. */
    slots = (limit >= 0 && limit < count) ? limit : count;
    records = PyList_New(slots);
    if (records == NULL) {
        goto error;
    }
    i = 0;
    /* Records below the window: walked, not built. Offset deltas increase, so once one reaches
     * first_delta every later one does too; that record is walked again by decode_one. */
    if (first_delta > 0 &&
        !skip_below_window(buf, &pos, end, count, first_delta, &previous_delta, &i)) {
        goto error;
    }
    for (; i < count; i++) {
        PyObject *record = decode_one(buf, &pos, end, &previous_delta, base_offset,
                                      base_offset_fits, base_offset_value, base_timestamp,
                                      base_timestamp_fits, base_timestamp_value, log_append_time);
        if (record == NULL) {
            goto error;
        }
        PyList_SET_ITEM(records, taken, record); /* steals */
        taken += 1;
        if (taken == limit) {
            PyBuffer_Release(&view);
            return records; /* the window is full: the rest of the batch is not read */
        }
    }
    if (pos != end) {
        PyErr_Format(corrupt_error, "%zd bytes left after %zd records", end - pos, count);
        goto error;
    }
    /* Python's comparison, so last_offset_delta may be any int (or int-like) object. */
    previous = PyLong_FromLongLong(previous_delta);
    if (previous == NULL) {
        goto error;
    }
    exceeds = PyObject_RichCompareBool(previous, last_delta, Py_GT);
    if (exceeds < 0) {
        goto error;
    }
    if (exceeds) {
        PyErr_Format(corrupt_error, "offset delta %lld exceeds lastOffsetDelta %S",
                     (long long)previous_delta, last_delta);
        goto error;
    }
    Py_DECREF(previous);
    PyBuffer_Release(&view);
    /* Skipped records left slots at the end, all NULL: a shorter list (dealloc and every list
     * operation look at ob_size only). */
    Py_SET_SIZE(records, taken);
    return records;

error:
    Py_XDECREF(previous);
    Py_XDECREF(records); /* list dealloc skips the NULL slots not yet filled */
    PyBuffer_Release(&view);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* validate_records                                                                           */
/* ------------------------------------------------------------------------------------------ */

static const char *const validate_records_names[] = {"data", "count"};

PyDoc_STRVAR(validate_records_doc,
"validate_records(data, count)\n"
"--\n\n"
"C version of services.records.record.validate_records (the reference): check that exactly\n"
"``count`` well-formed records fill ``data`` (any contiguous buffer), with offset deltas\n"
"0 .. count - 1 in order, building nothing. Returns None; raises CorruptRecordError.");

static PyObject *
validate_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *argv[2];
    Py_buffer view;
    const unsigned char *buf;
    Py_ssize_t end, pos = 0, i, count;
    long long requested;
    int overflow;
    int64_t offset_delta;

    (void)module;
    if (parse_args("validate_records", args, nargs, kwnames, validate_records_names, 2, 2, argv) <
        0) {
        return NULL;
    }
    if (ensure_initialised() < 0) {
        return NULL;
    }
    if (!PyLong_Check(argv[1])) {
        PyErr_Format(PyExc_TypeError, "count must be an int, not %.100s",
                     Py_TYPE(argv[1])->tp_name);
        return NULL;
    }
    if (PyObject_GetBuffer(argv[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    buf = (const unsigned char *)view.buf;
    end = view.len;
    requested = PyLong_AsLongLongAndOverflow(argv[1], &overflow);
    if (requested == -1 && PyErr_Occurred()) {
        goto error;
    }
    /* record.py: count < 0 or count * MIN_RECORD_SIZE > len(data), without overflow. */
    if (overflow != 0 || requested < 0 || requested > end / MIN_RECORD_SIZE) {
        PyErr_Format(corrupt_error, "record count %S cannot fit in %zd bytes of records", argv[1],
                     end);
        goto error;
    }
    count = (Py_ssize_t)requested;
    for (i = 0; i < count; i++) {
        if (!walk_record(buf, &pos, end, i, &offset_delta)) {
            goto error;
        }
        if (offset_delta != i) {
            PyErr_Format(corrupt_error,
                         "record %zd has offset delta %lld; a producer's records must have "
                         "offset deltas 0..%zd in order",
                         i, (long long)offset_delta, count - 1);
            goto error;
        }
    }
    if (pos != end) {
        PyErr_Format(corrupt_error, "%zd bytes left after %zd records", end - pos, count);
        goto error;
    }
    PyBuffer_Release(&view);
    Py_RETURN_NONE;

error:
    PyBuffer_Release(&view);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* scan_producer_batches                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* The RecordBatch v2 header layout (format.py). */
#define BATCH_LENGTH_AT 8
#define MAGIC_AT 16
#define CRC_AT 17
#define ATTRIBUTES_AT 21
#define LAST_OFFSET_DELTA_AT 23
#define BASE_TIMESTAMP_AT 27
#define MAX_TIMESTAMP_AT 35
#define PRODUCER_ID_AT 43
#define PRODUCER_EPOCH_AT 51
#define BASE_SEQUENCE_AT 53
#define RECORD_COUNT_AT 57
#define RECORDS_AT 61
#define LOG_OVERHEAD_BYTES 12
#define MIN_BATCH_LENGTH_BYTES (RECORDS_AT - LOG_OVERHEAD_BYTES)
#define CODEC_MASK 0x07
#define TIMESTAMP_TYPE_BIT 0x08
#define TRANSACTIONAL_BIT 0x10
#define CONTROL_BIT 0x20

static inline uint64_t
be64(const unsigned char *p)
{
    return ((uint64_t)p[0] << 56) | ((uint64_t)p[1] << 48) | ((uint64_t)p[2] << 40) |
           ((uint64_t)p[3] << 32) | ((uint64_t)p[4] << 24) | ((uint64_t)p[5] << 16) |
           ((uint64_t)p[6] << 8) | (uint64_t)p[7];
}

static inline uint32_t
be32(const unsigned char *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static inline uint16_t
be16(const unsigned char *p)
{
    return (uint16_t)(((uint16_t)p[0] << 8) | (uint16_t)p[1]);
}

/* CRC-32C (Castagnoli, reflected 0x82F63B78), slicing by eight: ~1 byte a cycle, so a small
 * batch's CRC costs less than a call into the crc32c package would. */
static uint32_t crc32c_table[8][256];
static int crc32c_ready = 0;

static void
crc32c_init(void)
{
    uint32_t i, j, crc;

    for (i = 0; i < 256; i++) {
        crc = i;
        for (j = 0; j < 8; j++) {
            crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
        }
        crc32c_table[0][i] = crc;
    }
    for (i = 0; i < 256; i++) {
        crc = crc32c_table[0][i];
        for (j = 1; j < 8; j++) {
            crc = crc32c_table[0][crc & 0xFF] ^ (crc >> 8);
            crc32c_table[j][i] = crc;
        }
    }
    crc32c_ready = 1;
}

static uint32_t
crc32c_by_table(const unsigned char *p, Py_ssize_t n)
{
    uint32_t crc = 0xFFFFFFFFu;

    if (!crc32c_ready) {
        crc32c_init();
    }
    while (n >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
                             ((uint32_t)p[3] << 24));
        uint32_t hi = (uint32_t)p[4] | ((uint32_t)p[5] << 8) | ((uint32_t)p[6] << 16) |
                      ((uint32_t)p[7] << 24);
        crc = crc32c_table[7][lo & 0xFF] ^ crc32c_table[6][(lo >> 8) & 0xFF] ^
              crc32c_table[5][(lo >> 16) & 0xFF] ^ crc32c_table[4][lo >> 24] ^
              crc32c_table[3][hi & 0xFF] ^ crc32c_table[2][(hi >> 8) & 0xFF] ^
              crc32c_table[1][(hi >> 16) & 0xFF] ^ crc32c_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n-- > 0) {
        crc = crc32c_table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    }
    return crc ^ 0xFFFFFFFFu;
}

/* The same CRC with the SSE 4.2 crc32 instruction (x86-64), 8 bytes a step: about three times
 * the table's speed (a 50-record, 10 KB batch: 4.8 -> 1.4 us; the CRC was most of
 * scan_producer_batches, which is a storage node's check of every append). Chosen at run time:
 * a CPU without SSE 4.2 (or another architecture) uses the table. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CRC32C_HARDWARE 1

__attribute__((target("sse4.2"))) static uint32_t
crc32c_by_instruction(const unsigned char *p, Py_ssize_t n)
{
    uint64_t crc = 0xFFFFFFFFu;

    while (n > 0 && ((uintptr_t)p & 7) != 0) { /* to an 8-byte boundary */
        crc = __builtin_ia32_crc32qi((uint32_t)crc, *p++);
        n--;
    }
    while (n >= 8) {
        uint64_t word;
        memcpy(&word, p, 8); /* little-endian, as the reflected CRC consumes bytes */
        crc = __builtin_ia32_crc32di(crc, word);
        p += 8;
        n -= 8;
    }
    while (n-- > 0) {
        crc = __builtin_ia32_crc32qi((uint32_t)crc, *p++);
    }
    return (uint32_t)crc ^ 0xFFFFFFFFu;
}

/* 1: the CPU has the instruction, 0: it has not, -1: not asked yet. */
static int crc32c_hardware = -1;
#endif

static uint32_t
crc32c_of(const unsigned char *p, Py_ssize_t n)
{
#ifdef CRC32C_HARDWARE
    if (crc32c_hardware < 0) {
        __builtin_cpu_init();
        crc32c_hardware = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    }
    if (crc32c_hardware) {
        return crc32c_by_instruction(p, n);
    }
#endif
    return crc32c_by_table(p, n);
}

static PyObject *
crc32c_table_py(PyObject *module, PyObject *data)
{
    Py_buffer view;
    uint32_t crc;

    (void)module;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    crc = crc32c_by_table((const unsigned char *)view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

PyDoc_STRVAR(crc32c_table_doc,
"_crc32c_by_table(data)\n"
"--\n\n"
"crc32c(data) by the table alone, whatever the CPU has (so tests check both ways).");

PyDoc_STRVAR(crc32c_doc,
"crc32c(data)\n"
"--\n\n"
"CRC-32C of ``data`` (any contiguous buffer), as crc32c.crc32c computes it; the table\n"
"scan_producer_batches checks batches with (tested against the crc32c package).");

static PyObject *
crc32c_py(PyObject *module, PyObject *data)
{
    Py_buffer view;
    uint32_t crc;

    (void)module;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    crc = crc32c_of((const unsigned char *)view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

/* One batch at buf[pos] of a payload with ``remaining`` bytes from there: whether it passes every
 * check validate_producer_batches makes of an uncompressed batch (sizes, magic, CRC, structure,
 * the producer-batch header rules, every record). 1 if it does, its size in *size; 0 if not
 * (or if it is compressed): no exception is left set either way. */
static int
scan_one(const unsigned char *buf, Py_ssize_t remaining, long long max_message_bytes,
         long long segment_bytes, Py_ssize_t *size)
{
    const unsigned char *b = buf;
    int32_t batch_length, last_offset_delta, count, sequence;
    int16_t attributes, epoch;
    int64_t base_ts, max_ts, producer_id, offset_delta;
    Py_ssize_t n, pos, i;

    if (remaining < LOG_OVERHEAD_BYTES) {
        return 0;
    }
    batch_length = (int32_t)be32(b + BATCH_LENGTH_AT);
    if (batch_length < MIN_BATCH_LENGTH_BYTES) {
        return 0;
    }
    n = (Py_ssize_t)batch_length + LOG_OVERHEAD_BYTES;
    if (n > remaining || n > max_message_bytes || n > segment_bytes) {
        return 0;
    }
    if (b[MAGIC_AT] != 2) {
        return 0;
    }
    if (crc32c_of(b + ATTRIBUTES_AT, n - ATTRIBUTES_AT) != be32(b + CRC_AT)) {
        return 0;
    }
    attributes = (int16_t)be16(b + ATTRIBUTES_AT);
    last_offset_delta = (int32_t)be32(b + LAST_OFFSET_DELTA_AT);
    base_ts = (int64_t)be64(b + BASE_TIMESTAMP_AT);
    max_ts = (int64_t)be64(b + MAX_TIMESTAMP_AT);
    producer_id = (int64_t)be64(b + PRODUCER_ID_AT);
    epoch = (int16_t)be16(b + PRODUCER_EPOCH_AT);
    sequence = (int32_t)be32(b + BASE_SEQUENCE_AT);
    count = (int32_t)be32(b + RECORD_COUNT_AT);
    /* Compressed batches are validate_producer_batches' in Python (decompression, its bound). */
    if (attributes & CODEC_MASK) {
        return 0;
    }
    /* The structure (RecordBatchView._ensure_valid_structure) and the producer-batch rules
     * (validation._ensure_producer_batch): 0 < count == lastOffsetDelta + 1 implies both of
     * the structure's count rules. */
    if (count <= 0 || (int64_t)count != (int64_t)last_offset_delta + 1 ||
        (int64_t)count * MIN_RECORD_SIZE > (int64_t)(n - RECORDS_AT)) {
        return 0;
    }
    if ((attributes & (CONTROL_BIT | TIMESTAMP_TYPE_BIT)) || base_ts < -1 || max_ts < -1) {
        return 0;
    }
    if (!((producer_id == -1 && !(attributes & TRANSACTIONAL_BIT)) ||
          (producer_id >= 0 && epoch >= 0 && sequence >= 0))) {
        return 0;
    }
    /* Every record (validate_records): offset deltas 0 .. count - 1, filling the batch. */
    pos = RECORDS_AT;
    for (i = 0; i < count; i++) {
        if (!walk_record(buf, &pos, n, i, &offset_delta)) {
            PyErr_Clear();
            return 0;
        }
        if (offset_delta != i) {
            return 0;
        }
    }
    if (pos != n) {
        return 0;
    }
    *size = n;
    return 1;
}

static const char *const scan_producer_batches_names[] = {
    "data", "max_message_bytes", "segment_bytes",
};

PyDoc_STRVAR(scan_producer_batches_doc,
"scan_producer_batches(data, max_message_bytes, segment_bytes)\n"
"--\n\n"
"The fast path of storage_node.log.validation.validate_producer_batches (the reference) for\n"
"a payload of uncompressed batches: a list with one tuple per batch, (position, size,\n"
"record_count, last_offset_delta, max_timestamp, producer_id, producer_epoch, base_sequence,\n"
"is_transactional), when every batch passes every check the reference makes; None when any\n"
"would not, or one is compressed -- the reference then runs and raises with the reason (or\n"
"accepts the compressed batch). Never raises for bad data.");

static PyObject *
scan_producer_batches(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                      PyObject *kwnames)
{
    PyObject *argv[3], *out = NULL, *item;
    Py_buffer view;
    const unsigned char *buf, *b;
    Py_ssize_t end, pos = 0, size;
    long long max_message_bytes, segment_bytes;
    int64_t first_pid = -1, pid;
    int16_t first_epoch = -1, epoch;
    int first_txn = 0, txn, any_producer = 0, mixed = 0;

    (void)module;
    if (parse_args("scan_producer_batches", args, nargs, kwnames, scan_producer_batches_names, 3,
                   3, argv) < 0) {
        return NULL;
    }
    if (ensure_initialised() < 0) { /* walk_record's errors (cleared here) need the class */
        return NULL;
    }
    max_message_bytes = PyLong_AsLongLong(argv[1]);
    if (max_message_bytes == -1 && PyErr_Occurred()) {
        return NULL;
    }
    segment_bytes = PyLong_AsLongLong(argv[2]);
    if (segment_bytes == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (PyObject_GetBuffer(argv[0], &view, PyBUF_SIMPLE) < 0) {
        /* Not a contiguous buffer: the reference says what it makes of it. */
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    buf = (const unsigned char *)view.buf;
    end = view.len;
    if (end == 0) {
        goto slow;
    }
    out = PyList_New(0);
    if (out == NULL) {
        goto error;
    }
    while (pos < end) {
        if (!scan_one(buf + pos, end - pos, max_message_bytes, segment_bytes, &size)) {
            goto slow;
        }
        b = buf + pos;
        pid = (int64_t)be64(b + PRODUCER_ID_AT);
        epoch = (int16_t)be16(b + PRODUCER_EPOCH_AT);
        txn = (be16(b + ATTRIBUTES_AT) & TRANSACTIONAL_BIT) != 0;
        if (pos == 0) {
            first_pid = pid;
            first_epoch = epoch;
            first_txn = txn;
        }
        else if (pid != first_pid || epoch != first_epoch || txn != first_txn) {
            mixed = 1;
        }
        any_producer |= pid != -1;
        item = Py_BuildValue("(nniiLLiiO)", pos, size, (int)(int32_t)be32(b + RECORD_COUNT_AT),
                             (int)(int32_t)be32(b + LAST_OFFSET_DELTA_AT),
                             (long long)(int64_t)be64(b + MAX_TIMESTAMP_AT), (long long)pid,
                             (int)epoch, (int)(int32_t)be32(b + BASE_SEQUENCE_AT),
                             txn ? Py_True : Py_False);
        if (item == NULL) {
            goto error;
        }
        if (PyList_Append(out, item) < 0) {
            Py_DECREF(item);
            goto error;
        }
        Py_DECREF(item);
        pos += size;
    }
    /* validation._ensure_one_producer: an idempotent or transactional payload is one producer's. */
    if (mixed && any_producer) {
        goto slow;
    }
    PyBuffer_Release(&view);
    return out;

slow:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;

error:
    Py_XDECREF(out);
    PyBuffer_Release(&view);
    return NULL;
}

/* ------------------------------------------------------------------------------------------ */
/* append_record                                                                              */
/* ------------------------------------------------------------------------------------------ */

/* Bytes in the zigzag encoding whose unsigned form is ``raw``. */
static inline Py_ssize_t
unsigned_varint_size(uint64_t raw)
{
    Py_ssize_t size = 1;
    while (raw > 0x7F) {
        raw >>= 7;
        size++;
    }
    return size;
}

static inline uint64_t
zigzag64(int64_t value)
{
    return ((uint64_t)value << 1) ^ (uint64_t)(value >> 63); /* arithmetic shift */
}

static inline unsigned char *
write_unsigned_varint(unsigned char *out, uint64_t raw)
{
    while (raw > 0x7F) {
        *out++ = (unsigned char)((raw & 0x7F) | 0x80);
        raw >>= 7;
    }
    *out++ = (unsigned char)raw;
    return out;
}

/* A key or value: NULL data means null (written as length -1). */
typedef struct {
    const char *data;
    Py_ssize_t len;
    int has_view;
    Py_buffer view;
} blob;

/* Fill ``out`` from a key or value argument the way builder.py's _as_bytes would see it.
 * Returns 1, or 0 to decline (nothing to release, no exception set). Subclasses of bytes and
 * bytearray are declined because builder.py takes len() of them, which they may override. */
static int
get_blob(PyObject *obj, blob *out)
{
    out->has_view = 0;
    if (obj == Py_None) {
        out->data = NULL;
        out->len = -1;
        return 1;
    }
    if (PyBytes_CheckExact(obj)) {
        out->data = PyBytes_AS_STRING(obj);
        out->len = PyBytes_GET_SIZE(obj);
    }
    else if (PyBytes_Check(obj) || (PyByteArray_Check(obj) && !PyByteArray_CheckExact(obj))) {
        return 0;
    }
    else {
        /* A bytearray or any other contiguous buffer (memoryview, array): the same bytes as
         * memoryview(obj).tobytes(). A non-contiguous one fails here and is declined. */
        if (PyObject_GetBuffer(obj, &out->view, PyBUF_SIMPLE) < 0) {
            PyErr_Clear();
            return 0;
        }
        out->has_view = 1;
        /* An empty buffer may export a NULL pointer; NULL here would mean a null key/value. */
        out->data = out->view.buf != NULL ? (const char *)out->view.buf : "";
        out->len = out->view.len;
    }
    if (out->len > INT32_MAX) { /* builder.py: ValueError from encode_varint */
        if (out->has_view) {
            PyBuffer_Release(&out->view);
            out->has_view = 0;
        }
        return 0;
    }
    return 1;
}

static void
release_blob(blob *b)
{
    if (b->has_view) {
        PyBuffer_Release(&b->view);
        b->has_view = 0;
    }
}

/* A header value the fast path takes: None, or an exact bytes or bytearray other than the
 * builder's own buffer. Returns 1 and sets data/len (data NULL for None), or 0 to decline. */
static int
header_value(PyObject *value, PyObject *records, const char **data, Py_ssize_t *len)
{
    if (value == Py_None) {
        *data = NULL;
        *len = -1;
        return 1;
    }
    if (PyBytes_CheckExact(value)) {
        *data = PyBytes_AS_STRING(value);
        *len = PyBytes_GET_SIZE(value);
    }
    else if (PyByteArray_CheckExact(value) && value != records) {
        *data = PyByteArray_AS_STRING(value);
        *len = PyByteArray_GET_SIZE(value);
    }
    else {
        return 0;
    }
    return *len <= INT32_MAX;
}

/* A header pair the fast path takes: an exact 2-tuple or 2-list of (str, value). Sets the
 * UTF-8 key and the value, or returns 0 to decline (a key with lone surrogates, which
 * str.encode rejects, among others). */
static int
header_pair(PyObject *pair, PyObject *records, const char **key, Py_ssize_t *key_len,
            const char **value, Py_ssize_t *value_len)
{
    PyObject *key_obj, *value_obj;

    if (PyTuple_CheckExact(pair) && PyTuple_GET_SIZE(pair) == 2) {
        key_obj = PyTuple_GET_ITEM(pair, 0);
        value_obj = PyTuple_GET_ITEM(pair, 1);
    }
    else if (PyList_CheckExact(pair) && PyList_GET_SIZE(pair) == 2) {
        key_obj = PyList_GET_ITEM(pair, 0);
        value_obj = PyList_GET_ITEM(pair, 1);
    }
    else {
        return 0;
    }
    if (!PyUnicode_CheckExact(key_obj)) {
        return 0;
    }
    *key = PyUnicode_AsUTF8AndSize(key_obj, key_len);
    if (*key == NULL) {
        PyErr_Clear();
        return 0;
    }
    if (*key_len > INT32_MAX) {
        return 0;
    }
    return header_value(value_obj, records, value, value_len);
}

static inline Py_ssize_t
nullable_size(Py_ssize_t len)
{
    return len < 0 ? 1 : unsigned_varint_size((uint64_t)len << 1) + len;
}

static inline unsigned char *
write_nullable(unsigned char *out, const char *data, Py_ssize_t len)
{
    if (data == NULL) {
        *out++ = 0x01; /* zigzag(-1) */
        return out;
    }
    out = write_unsigned_varint(out, (uint64_t)len << 1);
    if (len) {
        memcpy(out, data, (size_t)len);
    }
    return out + len;
}

/* The bytes a record's key, value and headers take in its body (the header count included),
 * or -1 to decline: a header header_pair does not take, or more than INT32_MAX in all (sizes
 * are capped as they are added: no overflow). Nothing here runs Python code, so the pairs
 * cannot change before write_record_fields writes them. ``records``: as for header_pair. */
static Py_ssize_t
record_fields_size(const blob *key, const blob *value, PyObject *const *pairs,
                   Py_ssize_t header_count, PyObject *records)
{
    const char *hkey, *hvalue;
    Py_ssize_t hkey_len, hvalue_len, i;
    Py_ssize_t size = nullable_size(key->len) + nullable_size(value->len);

    if (size > INT32_MAX) {
        return -1;
    }
    if (header_count == 0) {
        return size + 1;
    }
    size += unsigned_varint_size((uint64_t)header_count << 1);
    for (i = 0; i < header_count; i++) {
        if (!header_pair(pairs[i], records, &hkey, &hkey_len, &hvalue, &hvalue_len)) {
            return -1;
        }
        size += unsigned_varint_size((uint64_t)hkey_len << 1) + hkey_len + nullable_size(hvalue_len);
        if (size > INT32_MAX) {
            return -1;
        }
    }
    return size;
}

/* Write what record_fields_size measured; returns the end. It cannot decline: the size pass
 * accepted the same objects (their UTF-8 is cached). */
static unsigned char *
write_record_fields(unsigned char *out, const blob *key, const blob *value,
                    PyObject *const *pairs, Py_ssize_t header_count, PyObject *records)
{
    const char *hkey, *hvalue;
    Py_ssize_t hkey_len, hvalue_len, i;

    out = write_nullable(out, key->data, key->len);
    out = write_nullable(out, value->data, value->len);
    if (header_count == 0) {
        *out++ = 0x00;
        return out;
    }
    out = write_unsigned_varint(out, (uint64_t)header_count << 1);
    for (i = 0; i < header_count; i++) {
        header_pair(pairs[i], records, &hkey, &hkey_len, &hvalue, &hvalue_len);
        out = write_nullable(out, hkey, hkey_len);
        out = write_nullable(out, hvalue, hvalue_len);
    }
    return out;
}

PyDoc_STRVAR(append_record_doc,
"append_record(records, timestamp, base_timestamp, offset_delta, key, value, headers)\n"
"--\n\n"
"Encode one record (length varint and body, as builder.py's RecordBatchBuilder.append does)\n"
"onto the bytearray ``records`` and return True; or write nothing and return False when an\n"
"argument is not of the common types or is out of range, leaving the record to the Python\n"
"path. ``timestamp - base_timestamp`` is the timestamp delta.");

static PyObject *
append_record(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *records, *headers;
    PyObject *const *pairs = NULL;
    blob key, value;
    int64_t timestamp, base_timestamp, timestamp_delta, offset_delta;
    Py_ssize_t header_count = 0, fields, body, total, old_size;
    unsigned char *out;

    (void)module;
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "append_record() takes 7 arguments (%zd given)", nargs);
        return NULL;
    }
    records = args[0];
    headers = args[6];
    if (!PyByteArray_CheckExact(records)) {
        PyErr_SetString(PyExc_TypeError, "append_record() needs a bytearray");
        return NULL;
    }
    /* Out-of-range timestamps, deltas and offset deltas are the Python path's to reject. */
    if (!exact_int64(args[1], &timestamp) || !exact_int64(args[2], &base_timestamp) ||
        __builtin_sub_overflow(timestamp, base_timestamp, &timestamp_delta) ||
        !exact_int64(args[3], &offset_delta) || offset_delta < 0 || offset_delta >= INT32_MAX) {
        Py_RETURN_FALSE;
    }
    if (headers != Py_None && !PyTuple_CheckExact(headers) && !PyList_CheckExact(headers)) {
        Py_RETURN_FALSE; /* a generator, a custom sequence, a falsy non-sequence ... */
    }
    if (!get_blob(args[4], &key)) {
        Py_RETURN_FALSE;
    }
    if (!get_blob(args[5], &value)) {
        release_blob(&key);
        Py_RETURN_FALSE;
    }
    /* The header items are borrowed only after the buffers above are taken: getting a buffer
     * is the one step that could run Python code (a Python-level __buffer__ in 3.12+). */
    if (headers != Py_None) {
        header_count = PySequence_Fast_GET_SIZE(headers);
        pairs = PySequence_Fast_ITEMS(headers);
        if (header_count > INT32_MAX) {
            goto decline;
        }
    }

    /* Pass 1: the body size. Sizes are capped at INT32_MAX as they are added, so the sums
     * cannot overflow a Py_ssize_t. (From here to the end nothing can run Python code: no GC
     * allocation, no callbacks, so ``headers`` and its items cannot change between the passes.)
     */
    fields = record_fields_size(&key, &value, pairs, header_count, records);
    if (fields < 0) {
        goto decline;
    }
    body = 1 + unsigned_varint_size(zigzag64(timestamp_delta)) +
           unsigned_varint_size((uint64_t)offset_delta << 1) + fields;
    if (body > INT32_MAX) {
        goto decline;
    }
    total = unsigned_varint_size((uint64_t)body << 1) + body;
    old_size = PyByteArray_GET_SIZE(records);
    if (total > PY_SSIZE_T_MAX - old_size) {
        goto decline;
    }
    /* Fails with BufferError while the bytearray is exported (for instance when the key is a
     * memoryview of it): the Python path then raises the same error at the same point. */
    if (PyByteArray_Resize(records, old_size + total) < 0) {
        PyErr_Clear();
        goto decline;
    }

    /* Pass 2: write. */
    out = (unsigned char *)PyByteArray_AS_STRING(records) + old_size;
    out = write_unsigned_varint(out, (uint64_t)body << 1);
    *out++ = 0x00; /* attributes */
    out = write_unsigned_varint(out, zigzag64(timestamp_delta));
    out = write_unsigned_varint(out, (uint64_t)offset_delta << 1);
    out = write_record_fields(out, &key, &value, pairs, header_count, records);
    release_blob(&key);
    release_blob(&value);
    if (out != (unsigned char *)PyByteArray_AS_STRING(records) + old_size + total) {
        /* Unreachable unless pass 1 and pass 2 disagree; never leave a torn record. */
        PyByteArray_Resize(records, old_size);
        PyErr_SetString(PyExc_SystemError, "append_record: size mismatch");
        return NULL;
    }
    Py_RETURN_TRUE;

decline:
    release_blob(&key);
    release_blob(&value);
    Py_RETURN_FALSE;
}

/* ------------------------------------------------------------------------------------------ */
/* murmur2                                                                                    */
/* ------------------------------------------------------------------------------------------ */

PyDoc_STRVAR(murmur2_doc,
"murmur2(data)\n"
"--\n\n"
"Kafka's Utils.murmur2 of the bytes-like ``data``: the signed 32-bit hash its default\n"
"partitioner takes of a key (services/partitioner.py is the reference). Per keyed record on\n"
"the producer's path, where the Python loop costs microseconds.");

static uint32_t murmur2_bytes(const unsigned char *bytes, Py_ssize_t length);

static PyObject *
murmur2(PyObject *module, PyObject *data)
{
    Py_buffer view;
    uint32_t h;

    (void)module;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    h = murmur2_bytes((const unsigned char *)view.buf, view.len);
    PyBuffer_Release(&view);
    return PyLong_FromLong((long)(int32_t)h);
}

/* ------------------------------------------------------------------------------------------ */
/* Columns: records decoded straight into Arrow buffers                                       */
/* ------------------------------------------------------------------------------------------ */

/* The buffers of an Arrow batch of records, in the order columns.py's COLUMN_BUFFERS names
 * them. Offsets buffers are int32 and start with a 0; validity bitmaps are LSB-first, one bit per
 * row (or header); integers are little-endian, as Arrow's IPC format and every platform this
 * builds on (x86-64, aarch64) are. Timestamps are milliseconds, as in the batch. */
enum {
    COL_OFFSET,          /* int64 per record */
    COL_TIMESTAMP,       /* int64 per record, ms */
    COL_TIMESTAMP_TYPE,  /* int32 per record */
    COL_KEY_OFFSETS,     /* int32 per record + 1 */
    COL_KEY_DATA,
    COL_KEY_VALIDITY,
    COL_VALUE_OFFSETS,
    COL_VALUE_DATA,
    COL_VALUE_VALIDITY,
    COL_HEADER_OFFSETS,  /* int32 per record + 1: where each record's headers start */
    COL_HKEY_OFFSETS,    /* int32 per header + 1 */
    COL_HKEY_DATA,
    COL_HVALUE_OFFSETS,
    COL_HVALUE_DATA,
    COL_HVALUE_VALIDITY,
    COL_COUNT
};
#define COL_COUNT_NO_HEADERS (COL_VALUE_VALIDITY + 1)

/* A buffer that grows by doubling, held in a bytes object so that take() hands it over without
 * a copy (cut to its length with _PyBytes_Resize: the only reference is ours until then). */
typedef struct {
    PyObject *bytes;
    unsigned char *data;
    Py_ssize_t len, cap;
    int zeroed; /* bitmaps: new capacity is zeroed, as their bits are written one by one */
} growbuf;

typedef struct {
    PyObject_HEAD
    int headers;
    int broken; /* an allocation failed inside a buffer: nothing in it can be trusted */
    Py_ssize_t rows, header_rows, key_nulls, value_nulls, hvalue_nulls;
    growbuf b[COL_COUNT];
} ColumnsObject;

/* Room for ``extra`` more bytes. On failure (MemoryError) the buffer is empty again. */
static int
gb_reserve(growbuf *g, Py_ssize_t extra)
{
    Py_ssize_t need, cap;

    if (extra > PY_SSIZE_T_MAX - g->len) {
        PyErr_NoMemory();
        return -1;
    }
    need = g->len + extra;
    if (need <= g->cap) {
        return 0;
    }
    cap = g->cap < 64 ? 64 : g->cap;
    while (cap < need) {
        cap = cap > PY_SSIZE_T_MAX / 2 ? need : cap * 2;
    }
    if (g->bytes == NULL) {
        g->bytes = PyBytes_FromStringAndSize(NULL, cap);
    }
    else if (_PyBytes_Resize(&g->bytes, cap) < 0) {
        g->bytes = NULL; /* _PyBytes_Resize freed it */
    }
    if (g->bytes == NULL) {
        g->data = NULL;
        g->len = g->cap = 0;
        return -1;
    }
    g->data = (unsigned char *)PyBytes_AS_STRING(g->bytes);
    if (g->zeroed) {
        memset(g->data + g->cap, 0, (size_t)(cap - g->cap));
    }
    g->cap = cap;
    return 0;
}

/* The first ``len`` bytes as a bytes object, and the buffer empty again. */
static PyObject *
gb_take(growbuf *g, Py_ssize_t len)
{
    PyObject *bytes = g->bytes;

    if (bytes == NULL || len == 0) {
        Py_XDECREF(bytes);
        bytes = PyBytes_FromStringAndSize(NULL, 0);
    }
    else if (_PyBytes_Resize(&bytes, len) < 0) {
        bytes = NULL;
    }
    g->bytes = NULL;
    g->data = NULL;
    g->len = g->cap = 0;
    return bytes;
}

static inline void
gb_put64(growbuf *g, int64_t v)
{
    memcpy(g->data + g->len, &v, 8);
    g->len += 8;
}

static inline void
gb_put32(growbuf *g, int32_t v)
{
    memcpy(g->data + g->len, &v, 4);
    g->len += 4;
}

static inline void
bit_put(growbuf *g, Py_ssize_t i, int valid)
{
    unsigned char *p = g->data + (i >> 3);
    if (valid) {
        *p |= (unsigned char)(1u << (i & 7));
    }
    else {
        *p &= (unsigned char)~(1u << (i & 7));
    }
}

/* Clear every bit from ``bits`` on: what a failed append wrote past the rows that stay. */
static void
bitmap_truncate(growbuf *g, Py_ssize_t bits)
{
    Py_ssize_t byte = bits >> 3;
    if (byte >= g->cap) {
        return;
    }
    g->data[byte] &= (unsigned char)((1u << (bits & 7)) - 1);
    memset(g->data + byte + 1, 0, (size_t)(g->cap - byte - 1));
}

/* Append ``size`` bytes to a binary column's data and its next end offset, which must fit an
 * int32 (Arrow's binary and string types): a batch of more than 2 GiB of keys, values or header
 * data is refused (the caller takes a batch before that). */
static int
put_binary(growbuf *offsets, growbuf *data, const unsigned char *src, Py_ssize_t size)
{
    if (size > INT32_MAX - data->len) {
        PyErr_SetString(PyExc_OverflowError,
                        "an Arrow batch holds at most 2 GiB of keys, values or header data");
        return -1;
    }
    if (gb_reserve(data, size) < 0 || gb_reserve(offsets, 4) < 0) {
        return -1;
    }
    if (size > 0) {
        memcpy(data->data + data->len, src, (size_t)size);
        data->len += size;
    }
    gb_put32(offsets, (int32_t)data->len);
    return 0;
}

static int
columns_reset(ColumnsObject *self)
{
    int i;
    self->rows = self->header_rows = 0;
    self->key_nulls = self->value_nulls = self->hvalue_nulls = 0;
    for (i = 0; i < COL_COUNT; i++) {
        self->b[i].len = 0;
        self->b[i].zeroed =
            i == COL_KEY_VALIDITY || i == COL_VALUE_VALIDITY || i == COL_HVALUE_VALIDITY;
    }
    /* Offsets buffers start with 0. */
    for (i = 0; i < COL_COUNT; i++) {
        if (i == COL_KEY_OFFSETS || i == COL_VALUE_OFFSETS || i == COL_HEADER_OFFSETS ||
            i == COL_HKEY_OFFSETS || i == COL_HVALUE_OFFSETS) {
            if (gb_reserve(&self->b[i], 4) < 0) {
                self->broken = 1;
                return -1;
            }
            gb_put32(&self->b[i], 0);
        }
    }
    self->broken = 0;
    return 0;
}

/* record.py's _decode_headers, into the header buffers. */
static int
columns_headers(ColumnsObject *self, const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t rend)
{
    int64_t count, size;
    Py_ssize_t p = *pos, i;
    growbuf *b = self->b;

    if (!read_varint(buf, &p, rend, VARINT_MAX_BYTES, &count)) {
        return -1;
    }
    if (count < 0 || 2 * count > rend - p) {
        PyErr_Format(corrupt_error, "header count %lld out of bounds", (long long)count);
        return -1;
    }
    /* Bitmaps keep len 0 and are written within their capacity: room for every bit so far plus
     * this record's headers. */
    if (self->headers &&
        gb_reserve(&b[COL_HVALUE_VALIDITY], (self->header_rows + (Py_ssize_t)count) / 8 + 1) < 0) {
        return -1;
    }
    for (i = 0; i < (Py_ssize_t)count; i++) {
        const unsigned char *key;
        if (!read_varint(buf, &p, rend, VARINT_MAX_BYTES, &size)) {
            return -1;
        }
        if (size < 0 || size > rend - p) {
            PyErr_Format(corrupt_error, "header key length %lld out of bounds", (long long)size);
            return -1;
        }
        key = buf + p;
        if (!check_header_key(key, (Py_ssize_t)size, self->rows)) {
            /* decode_headers' message, so the two paths read the same. */
            if (PyErr_ExceptionMatches(corrupt_error)) {
                PyErr_Clear();
                PyErr_SetString(corrupt_error, "header key is not UTF-8");
            }
            return -1;
        }
        p += (Py_ssize_t)size;
        if (self->headers &&
            put_binary(&b[COL_HKEY_OFFSETS], &b[COL_HKEY_DATA], key, (Py_ssize_t)size) < 0) {
            return -1;
        }
        if (!read_varint(buf, &p, rend, VARINT_MAX_BYTES, &size)) {
            return -1;
        }
        if (size >= 0) {
            if (size > rend - p) {
                PyErr_Format(corrupt_error, "header value length %lld out of bounds",
                             (long long)size);
                return -1;
            }
            if (self->headers) {
                if (put_binary(&b[COL_HVALUE_OFFSETS], &b[COL_HVALUE_DATA], buf + p,
                               (Py_ssize_t)size) < 0) {
                    return -1;
                }
                bit_put(&b[COL_HVALUE_VALIDITY], self->header_rows, 1);
            }
            p += (Py_ssize_t)size;
        }
        else if (size == -1) {
            if (self->headers) {
                if (put_binary(&b[COL_HVALUE_OFFSETS], &b[COL_HVALUE_DATA], NULL, 0) < 0) {
                    return -1;
                }
                bit_put(&b[COL_HVALUE_VALIDITY], self->header_rows, 0);
                self->hvalue_nulls += 1;
            }
        }
        else {
            PyErr_Format(corrupt_error, "negative header value length %lld", (long long)size);
            return -1;
        }
        if (self->headers) {
            self->header_rows += 1;
        }
    }
    *pos = p;
    return 0;
}

/* decode_one, into the buffers: the same checks in the same order, so the same inputs fail. The
 * fixed-width buffers have room for this record (reserved per batch). */
static int
columns_one(ColumnsObject *self, const unsigned char *buf, Py_ssize_t *pos, Py_ssize_t end,
            int64_t *previous_delta, int64_t base_offset, int64_t base_timestamp,
            int log_append, int64_t log_append_time, int32_t timestamp_type)
{
    Py_ssize_t p = *pos, rend;
    int64_t length, timestamp_delta, offset_delta, size, value;
    int size_bytes;
    growbuf *b = self->b;

    if (p >= end) {
        PyErr_SetString(corrupt_error, "record runs past the end of the batch");
        return -1;
    }
    if (!read_varint(buf, &p, end, VARINT_MAX_BYTES, &length)) {
        return -1;
    }
    if (length < 0) {
        PyErr_Format(corrupt_error, "negative record length %lld", (long long)length);
        return -1;
    }
    if (length > end - p) {
        PyErr_SetString(corrupt_error, "record runs past the end of the batch");
        return -1;
    }
    rend = p + (Py_ssize_t)length;
    if (p >= rend) {
        PyErr_SetString(corrupt_error, "record runs past the end of the batch");
        return -1;
    }
    p += 1;
    if (!read_varint(buf, &p, rend, VARLONG_MAX_BYTES, &timestamp_delta)) {
        return -1;
    }
    if (!read_varint(buf, &p, rend, VARINT_MAX_BYTES, &offset_delta)) {
        return -1;
    }
    if (offset_delta <= *previous_delta) {
        PyErr_Format(corrupt_error, "offset delta %lld does not increase (previous %lld)",
                     (long long)offset_delta, (long long)*previous_delta);
        return -1;
    }
    *previous_delta = offset_delta;
    /* key */
    if (!read_varint(buf, &p, rend, VARINT_MAX_BYTES, &size)) {
        return -1;
    }
    if (size >= 0) {
        if (size > rend - p) {
            PyErr_SetString(corrupt_error, "record runs past the end of the batch");
            return -1;
        }
        if (put_binary(&b[COL_KEY_OFFSETS], &b[COL_KEY_DATA], buf + p, (Py_ssize_t)size) < 0) {
            return -1;
        }
        bit_put(&b[COL_KEY_VALIDITY], self->rows, 1);
        p += (Py_ssize_t)size;
    }
    else if (size == -1) {
        if (put_binary(&b[COL_KEY_OFFSETS], &b[COL_KEY_DATA], NULL, 0) < 0) {
            return -1;
        }
        bit_put(&b[COL_KEY_VALIDITY], self->rows, 0);
        self->key_nulls += 1;
    }
    else {
        PyErr_Format(corrupt_error, "negative key length %lld", (long long)size);
        return -1;
    }
    /* value (a two-byte -1 is refused, as decode_one refuses it) */
    size_bytes = read_varint(buf, &p, rend, VARINT_MAX_BYTES, &size);
    if (!size_bytes) {
        return -1;
    }
    if (size >= 0) {
        if (size > rend - p) {
            PyErr_SetString(corrupt_error, "record runs past the end of the batch");
            return -1;
        }
        if (put_binary(&b[COL_VALUE_OFFSETS], &b[COL_VALUE_DATA], buf + p, (Py_ssize_t)size) <
            0) {
            return -1;
        }
        bit_put(&b[COL_VALUE_VALIDITY], self->rows, 1);
        p += (Py_ssize_t)size;
    }
    else if (size == -1 && size_bytes != 2) {
        if (put_binary(&b[COL_VALUE_OFFSETS], &b[COL_VALUE_DATA], NULL, 0) < 0) {
            return -1;
        }
        bit_put(&b[COL_VALUE_VALIDITY], self->rows, 0);
        self->value_nulls += 1;
    }
    else {
        PyErr_Format(corrupt_error, "negative value length %lld", (long long)size);
        return -1;
    }
    /* headers */
    if (p >= rend) {
        PyErr_SetString(corrupt_error, "record runs past the end of the batch");
        return -1;
    }
    if (buf[p] == 0) {
        p += 1;
    }
    else if (columns_headers(self, buf, &p, rend) < 0) {
        return -1;
    }
    if (self->headers) {
        if (self->header_rows > INT32_MAX) {
            PyErr_SetString(PyExc_OverflowError, "an Arrow batch holds at most 2**31 headers");
            return -1;
        }
        if (gb_reserve(&b[COL_HEADER_OFFSETS], 4) < 0) {
            return -1;
        }
        gb_put32(&b[COL_HEADER_OFFSETS], (int32_t)self->header_rows);
    }
    if (p != rend) {
        PyErr_Format(corrupt_error, "record body is %lld bytes but its fields take %lld",
                     (long long)length, (long long)(length + p - rend));
        return -1;
    }
    if (__builtin_add_overflow(base_offset, offset_delta, &value)) {
        PyErr_SetString(corrupt_error, "record offset out of range");
        return -1;
    }
    gb_put64(&b[COL_OFFSET], value);
    if (log_append) {
        value = log_append_time;
    }
    else if (__builtin_add_overflow(base_timestamp, timestamp_delta, &value)) {
        PyErr_SetString(corrupt_error, "record timestamp out of range");
        return -1;
    }
    gb_put64(&b[COL_TIMESTAMP], value);
    gb_put32(&b[COL_TIMESTAMP_TYPE], timestamp_type);
    self->rows += 1;
    *pos = p;
    return 0;
}

static const char *const columns_append_names[] = {
    "data", "count", "base_offset", "base_timestamp", "log_append_time", "last_offset_delta",
    "first_offset", "max_records",
};

PyDoc_STRVAR(columns_append_doc,
"append(data, count, base_offset, base_timestamp, log_append_time, last_offset_delta,\n"
"       first_offset=None, max_records=None)\n"
"--\n\n"
"Decode one batch's records into the columns: decode_records' arguments, checks and window\n"
"(columns.py's PyColumns.append is the reference). Returns how many records were added. On\n"
"an error nothing of this call stays in the columns.");

static int
as_int64(PyObject *obj, const char *name, int64_t *out)
{
    long long v;
    if (!PyLong_Check(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %.100s", name,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    v = PyLong_AsLongLong(obj);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

static PyObject *
columns_append(ColumnsObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *argv[8];
    Py_buffer view;
    const unsigned char *buf;
    Py_ssize_t end, pos = 0, i, count, taken = 0, limit;
    Py_ssize_t saved_len[COL_COUNT], saved_rows, saved_header_rows, saved_nulls[3];
    int64_t previous_delta = -1, base_offset, base_timestamp, log_append_time = 0, last_delta;
    int64_t first_delta, requested, timestamp_type;
    int log_append, k;

    if (parse_args("append", args, nargs, kwnames, columns_append_names, 6, 8, argv) < 0) {
        return NULL;
    }
    if (ensure_initialised() < 0) {
        return NULL;
    }
    if (self->broken) {
        PyErr_SetString(PyExc_MemoryError, "these columns lost their data to a failed allocation");
        return NULL;
    }
    if (as_int64(argv[1], "count", &requested) < 0 ||
        as_int64(argv[2], "base_offset", &base_offset) < 0 ||
        as_int64(argv[3], "base_timestamp", &base_timestamp) < 0 ||
        as_int64(argv[5], "last_offset_delta", &last_delta) < 0) {
        return NULL;
    }
    log_append = argv[4] != Py_None;
    if (log_append && as_int64(argv[4], "log_append_time", &log_append_time) < 0) {
        return NULL;
    }
    timestamp_type = log_append ? 1 : 0;
    if (PyObject_GetBuffer(argv[0], &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    buf = (const unsigned char *)view.buf;
    end = view.len;
    if (requested > 0 && requested > end / MIN_RECORD_SIZE) {
        PyErr_Format(corrupt_error, "record count %lld cannot fit in %zd bytes of records",
                     (long long)requested, end);
        PyBuffer_Release(&view);
        return NULL;
    }
    count = requested < 0 ? 0 : (Py_ssize_t)requested;
    if (parse_window(argv[6], argv[7], argv[2], &first_delta, &limit) < 0) {
        PyBuffer_Release(&view);
        return NULL;
    }
    for (k = 0; k < COL_COUNT; k++) {
        saved_len[k] = self->b[k].len;
    }
    saved_rows = self->rows;
    saved_header_rows = self->header_rows;
    saved_nulls[0] = self->key_nulls;
    saved_nulls[1] = self->value_nulls;
    saved_nulls[2] = self->hvalue_nulls;
    /* Fixed-width room for every record of the batch; variable data grows as it comes. */
    if (gb_reserve(&self->b[COL_OFFSET], 8 * count) < 0 ||
        gb_reserve(&self->b[COL_TIMESTAMP], 8 * count) < 0 ||
        gb_reserve(&self->b[COL_TIMESTAMP_TYPE], 4 * count) < 0 ||
        gb_reserve(&self->b[COL_KEY_VALIDITY], (self->rows + count) / 8 + 1 -
                                                   self->b[COL_KEY_VALIDITY].len) < 0 ||
        gb_reserve(&self->b[COL_VALUE_VALIDITY], (self->rows + count) / 8 + 1 -
                                                     self->b[COL_VALUE_VALIDITY].len) < 0) {
        goto error;
    }
    /* Bitmaps are written bit by bit within their capacity; their length is set by take(). */
    i = 0;
    if (first_delta > 0 &&
        !skip_below_window(buf, &pos, end, count, first_delta, &previous_delta, &i)) {
        goto error;
    }
    for (; i < count; i++) {
        if (columns_one(self, buf, &pos, end, &previous_delta, base_offset, base_timestamp,
                        log_append, log_append_time, (int32_t)timestamp_type) < 0) {
            goto error;
        }
        taken += 1;
        if (taken == limit) {
            PyBuffer_Release(&view);
            return PyLong_FromSsize_t(taken);
        }
    }
    if (pos != end) {
        PyErr_Format(corrupt_error, "%zd bytes left after %zd records", end - pos, count);
        goto error;
    }
    if (previous_delta > last_delta) {
        PyErr_Format(corrupt_error, "offset delta %lld exceeds lastOffsetDelta %lld",
                     (long long)previous_delta, (long long)last_delta);
        goto error;
    }
    PyBuffer_Release(&view);
    return PyLong_FromSsize_t(taken);

error:
    for (k = 0; k < COL_COUNT; k++) {
        if (saved_len[k] > self->b[k].cap) { /* a failed allocation emptied this buffer */
            self->broken = 1;
        }
        else {
            self->b[k].len = saved_len[k];
        }
    }
    self->rows = saved_rows;
    self->header_rows = saved_header_rows;
    self->key_nulls = saved_nulls[0];
    self->value_nulls = saved_nulls[1];
    self->hvalue_nulls = saved_nulls[2];
    bitmap_truncate(&self->b[COL_KEY_VALIDITY], saved_rows);
    bitmap_truncate(&self->b[COL_VALUE_VALIDITY], saved_rows);
    bitmap_truncate(&self->b[COL_HVALUE_VALIDITY], saved_header_rows);
    PyBuffer_Release(&view);
    return NULL;
}

PyDoc_STRVAR(columns_take_doc,
"take()\n"
"--\n\n"
"Everything appended since the last take, as (rows, buffers, null_counts), and start over:\n"
"buffers is a tuple of bytes in COLUMN_BUFFERS order (the header buffers only with headers),\n"
"null_counts is (keys, values, header values).");

static PyObject *
columns_take(ColumnsObject *self, PyObject *unused)
{
    PyObject *buffers, *result;
    int i, n = self->headers ? COL_COUNT : COL_COUNT_NO_HEADERS;

    (void)unused;
    if (self->broken) {
        PyErr_SetString(PyExc_MemoryError, "these columns lost their data to a failed allocation");
        return NULL;
    }
    buffers = PyTuple_New(n);
    if (buffers == NULL) {
        return NULL;
    }
    for (i = 0; i < n; i++) {
        Py_ssize_t len = self->b[i].len;
        PyObject *bytes;
        if (i == COL_KEY_VALIDITY || i == COL_VALUE_VALIDITY) {
            len = (self->rows + 7) / 8;
        }
        else if (i == COL_HVALUE_VALIDITY) {
            len = (self->header_rows + 7) / 8;
        }
        if (len > self->b[i].cap) { /* an empty bitmap never reserved: zero bytes */
            len = 0;
        }
        bytes = gb_take(&self->b[i], len);
        if (bytes == NULL) {
            Py_DECREF(buffers);
            self->broken = 1;
            return NULL;
        }
        PyTuple_SET_ITEM(buffers, i, bytes);
    }
    result = Py_BuildValue("(nN(nnn))", self->rows, buffers, self->key_nulls, self->value_nulls,
                           self->hvalue_nulls);
    for (i = n; i < COL_COUNT; i++) { /* header buffers of a Columns without headers */
        Py_XDECREF(gb_take(&self->b[i], 0));
    }
    if (columns_reset(self) < 0) {
        Py_XDECREF(result);
        return NULL;
    }
    return result;
}

static Py_ssize_t
columns_len(ColumnsObject *self)
{
    return self->rows;
}

static PyObject *
columns_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"include_headers", NULL};
    int headers = 0;
    ColumnsObject *self;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$p:Columns", kwlist, &headers)) {
        return NULL;
    }
    self = (ColumnsObject *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->headers = headers;
    /* tp_alloc zero-fills: every growbuf starts empty. */
    if (columns_reset(self) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void
columns_dealloc(ColumnsObject *self)
{
    int i;
    for (i = 0; i < COL_COUNT; i++) {
        Py_XDECREF(self->b[i].bytes);
    }
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
columns_include_headers(ColumnsObject *self, void *closure)
{
    (void)closure;
    return PyBool_FromLong(self->headers);
}

static PyMethodDef columns_methods[] = {
    {"append", (PyCFunction)(void (*)(void))columns_append, METH_FASTCALL | METH_KEYWORDS,
     columns_append_doc},
    {"take", (PyCFunction)columns_take, METH_NOARGS, columns_take_doc},
    {NULL, NULL, 0, NULL},
};

static PyObject *
columns_last_offset(ColumnsObject *self, void *closure)
{
    int64_t last;
    (void)closure;
    if (self->rows == 0) {
        Py_RETURN_NONE;
    }
    memcpy(&last, self->b[COL_OFFSET].data + self->b[COL_OFFSET].len - 8, 8);
    return PyLong_FromLongLong(last);
}

static PyGetSetDef columns_getset[] = {
    {"include_headers", (getter)columns_include_headers, NULL, "whether headers are kept", NULL},
    {"last_offset", (getter)columns_last_offset, NULL,
     "the offset of the last record appended since the last take(), or None", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods columns_as_sequence = {
    .sq_length = (lenfunc)columns_len,
};

PyDoc_STRVAR(columns_doc,
"Columns(*, include_headers=False)\n"
"--\n\n"
"C version of services.records.columns.PyColumns (the reference): records of any number of\n"
"batches decoded straight into Arrow buffers, without a Python object per record.");

static PyTypeObject ColumnsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "services.records._speedups.Columns",
    .tp_basicsize = sizeof(ColumnsObject),
    .tp_dealloc = (destructor)columns_dealloc,
    .tp_as_sequence = &columns_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = columns_doc,
    .tp_methods = columns_methods,
    .tp_getset = columns_getset,
    .tp_new = columns_new,
};

/* ------------------------------------------------------------------------------------------ */
/* encode_columns and partition_keys: the Spark sink's Arrow batches into records             */
/* ------------------------------------------------------------------------------------------ */

/* One Arrow binary (or string) column as the buffer protocol gives it: validity may be absent
 * (no nulls); offsets absent means the column is absent, every item null. Offset 0 only: the
 * caller passes arrays that start at their buffers' start. */
typedef struct {
    Py_buffer validity, offsets, data;
    int has_validity, has_offsets, has_data;
    Py_ssize_t count;
} arrow_binary;

static void
arrow_binary_release(arrow_binary *a)
{
    if (a->has_validity) {
        PyBuffer_Release(&a->validity);
    }
    if (a->has_offsets) {
        PyBuffer_Release(&a->offsets);
    }
    if (a->has_data) {
        PyBuffer_Release(&a->data);
    }
    a->has_validity = a->has_offsets = a->has_data = 0;
}

/* Take (validity, offsets, data) -- any of them None -- for ``count`` items, checking that the
 * buffers are large enough and the offsets increase within the data: the bytes come from
 * another library, and a bad offset must be an exception, not a read out of bounds. */
static int
arrow_binary_get(PyObject *obj, Py_ssize_t count, const char *what, arrow_binary *a)
{
    PyObject *items[3];
    const int32_t *offsets;
    Py_ssize_t i;

    memset(a, 0, sizeof(*a));
    a->count = count;
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) != 3) {
        PyErr_Format(PyExc_TypeError, "%s must be a (validity, offsets, data) tuple", what);
        return -1;
    }
    for (i = 0; i < 3; i++) {
        items[i] = PyTuple_GET_ITEM(obj, i);
    }
    if (items[1] == Py_None) {
        return 0; /* the column is absent: every item is null */
    }
    if (items[0] != Py_None) {
        if (PyObject_GetBuffer(items[0], &a->validity, PyBUF_SIMPLE) < 0) {
            goto error;
        }
        a->has_validity = 1;
        if (a->validity.len < (count + 7) / 8) {
            PyErr_Format(PyExc_ValueError, "%s validity bitmap is too short", what);
            goto error;
        }
    }
    if (PyObject_GetBuffer(items[1], &a->offsets, PyBUF_SIMPLE) < 0) {
        goto error;
    }
    a->has_offsets = 1;
    if (items[2] == Py_None) {
        PyErr_Format(PyExc_TypeError, "%s has offsets but no data", what);
        goto error;
    }
    if (PyObject_GetBuffer(items[2], &a->data, PyBUF_SIMPLE) < 0) {
        goto error;
    }
    a->has_data = 1;
    if (a->offsets.len / 4 < count + 1) {
        PyErr_Format(PyExc_ValueError, "%s offsets buffer is too short", what);
        goto error;
    }
    offsets = (const int32_t *)a->offsets.buf;
    if (offsets[0] < 0) {
        PyErr_Format(PyExc_ValueError, "%s offsets are out of bounds", what);
        goto error;
    }
    for (i = 0; i < count; i++) {
        if (offsets[i + 1] < offsets[i]) {
            PyErr_Format(PyExc_ValueError, "%s offsets decrease at item %zd", what, i);
            goto error;
        }
    }
    if (offsets[count] > a->data.len) {
        PyErr_Format(PyExc_ValueError, "%s offsets run past the data", what);
        goto error;
    }
    return 0;

error:
    arrow_binary_release(a);
    return -1;
}

static inline int
arrow_is_null(const arrow_binary *a, Py_ssize_t i)
{
    if (!a->has_offsets) {
        return 1;
    }
    if (!a->has_validity) {
        return 0;
    }
    return !(((const unsigned char *)a->validity.buf)[i >> 3] & (1u << (i & 7)));
}

static inline const unsigned char *
arrow_item(const arrow_binary *a, Py_ssize_t i, Py_ssize_t *size)
{
    const int32_t *offsets = (const int32_t *)a->offsets.buf;
    *size = offsets[i + 1] - offsets[i];
    return (const unsigned char *)a->data.buf + offsets[i];
}

static inline Py_ssize_t
zigzag_size(int64_t v)
{
    return unsigned_varint_size(((uint64_t)v << 1) ^ (uint64_t)(v >> 63));
}

static inline unsigned char *
put_zigzag(unsigned char *out, int64_t v)
{
    uint64_t raw = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    while (raw > 0x7F) {
        *out++ = (unsigned char)((raw & 0x7F) | 0x80);
        raw >>= 7;
    }
    *out++ = (unsigned char)raw;
    return out;
}

/* A nullable length-prefixed field's size: its length varint and its bytes. */
static inline Py_ssize_t
field_size(const arrow_binary *a, Py_ssize_t i)
{
    Py_ssize_t size;
    if (arrow_is_null(a, i)) {
        return 1;
    }
    (void)arrow_item(a, i, &size);
    return zigzag_size(size) + size;
}

static inline unsigned char *
put_field(unsigned char *out, const arrow_binary *a, Py_ssize_t i)
{
    Py_ssize_t size;
    const unsigned char *item;
    if (arrow_is_null(a, i)) {
        return put_zigzag(out, -1);
    }
    item = arrow_item(a, i, &size);
    out = put_zigzag(out, size);
    memcpy(out, item, (size_t)size);
    return out + size;
}

static const char *const encode_columns_names[] = {
    "count", "keys", "values", "header_offsets", "header_keys", "header_values", "rows",
};

PyDoc_STRVAR(encode_columns_doc,
"encode_columns(count, keys, values, header_offsets=None, header_keys=None, header_values=None,\n"
"               rows=None)\n"
"--\n\n"
"The records part of a RecordBatch v2 for rows of Arrow columns of ``count`` rows, as bytes:\n"
"offset deltas 0, 1, ..., timestamp deltas 0, attributes 0. ``keys`` and ``values`` are\n"
"(validity, offsets, data) buffer tuples of binary arrays starting at offset 0 (validity None\n"
"without nulls; offsets None for an absent column: all null). ``header_offsets`` (int32, count\n"
"+ 1) splits the header pairs -- ``header_keys`` (never null) and ``header_values`` -- by\n"
"row. ``rows`` (int32 row numbers) selects the rows to encode, in that order; all rows\n"
"without it. services.records.columns.py_encode_columns is the reference.");

/* One record's body size (everything after its length varint). */
static inline Py_ssize_t
record_body_size(const arrow_binary *keys, const arrow_binary *values, const int32_t *hoffsets,
                 const arrow_binary *hkeys, const arrow_binary *hvalues, Py_ssize_t row,
                 Py_ssize_t delta)
{
    Py_ssize_t body = 2 + zigzag_size(delta) + field_size(keys, row) + field_size(values, row);
    if (hoffsets != NULL) {
        Py_ssize_t h;
        body += zigzag_size(hoffsets[row + 1] - hoffsets[row]);
        for (h = hoffsets[row]; h < hoffsets[row + 1]; h++) {
            body += field_size(hkeys, h) + field_size(hvalues, h);
        }
    }
    else {
        body += 1;
    }
    return body;
}

static PyObject *
encode_columns(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *argv[7], *result = NULL;
    arrow_binary keys, values, hkeys, hvalues;
    Py_buffer hoffsets_view, rows_view;
    const int32_t *hoffsets = NULL, *rows = NULL;
    int have_hoffsets = 0, have_rows = 0;
    Py_ssize_t count, records, total = 0, i, nheaders = 0;
    unsigned char *out;

    (void)module;
    memset(&keys, 0, sizeof(keys));
    memset(&values, 0, sizeof(values));
    memset(&hkeys, 0, sizeof(hkeys));
    memset(&hvalues, 0, sizeof(hvalues));
    if (parse_args("encode_columns", args, nargs, kwnames, encode_columns_names, 3, 7, argv) < 0) {
        return NULL;
    }
    count = PyLong_AsSsize_t(argv[0]);
    if (count == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (count < 0 || count > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "count %zd out of range", count);
        return NULL;
    }
    if (arrow_binary_get(argv[1], count, "keys", &keys) < 0 ||
        arrow_binary_get(argv[2], count, "values", &values) < 0) {
        goto done;
    }
    records = count;
    if (argv[6] != NULL && argv[6] != Py_None) {
        if (PyObject_GetBuffer(argv[6], &rows_view, PyBUF_SIMPLE) < 0) {
            goto done;
        }
        have_rows = 1;
        rows = (const int32_t *)rows_view.buf;
        records = rows_view.len / 4;
        for (i = 0; i < records; i++) {
            if (rows[i] < 0 || rows[i] >= count) {
                PyErr_Format(PyExc_ValueError, "row %d out of range for %zd rows", rows[i], count);
                goto done;
            }
        }
    }
    if (argv[3] != NULL && argv[3] != Py_None) {
        if (PyObject_GetBuffer(argv[3], &hoffsets_view, PyBUF_SIMPLE) < 0) {
            goto done;
        }
        have_hoffsets = 1;
        if (hoffsets_view.len / 4 < count + 1) {
            PyErr_SetString(PyExc_ValueError, "header offsets buffer is too short");
            goto done;
        }
        hoffsets = (const int32_t *)hoffsets_view.buf;
        if (hoffsets[0] < 0) {
            PyErr_SetString(PyExc_ValueError, "header offsets are out of bounds");
            goto done;
        }
        for (i = 0; i < count; i++) {
            if (hoffsets[i + 1] < hoffsets[i]) {
                PyErr_Format(PyExc_ValueError, "header offsets decrease at row %zd", i);
                goto done;
            }
        }
        nheaders = hoffsets[count];
        if (argv[4] == NULL || argv[5] == NULL ||
            arrow_binary_get(argv[4], nheaders, "header keys", &hkeys) < 0 ||
            arrow_binary_get(argv[5], nheaders, "header values", &hvalues) < 0) {
            if (!PyErr_Occurred()) {
                PyErr_SetString(PyExc_TypeError, "header_offsets needs header_keys and header_values");
            }
            goto done;
        }
        if (!hkeys.has_offsets) {
            PyErr_SetString(PyExc_ValueError, "header keys cannot be absent");
            goto done;
        }
        for (i = hoffsets[0]; i < nheaders; i++) {
            if (arrow_is_null(&hkeys, i)) {
                PyErr_Format(PyExc_ValueError, "header %zd has a null key", i);
                goto done;
            }
        }
    }
    /* Sizes first: one allocation, then one pass writing. */
    for (i = 0; i < records; i++) {
        Py_ssize_t body = record_body_size(&keys, &values, hoffsets, &hkeys, &hvalues,
                                           rows != NULL ? rows[i] : i, i);
        if (body > INT32_MAX || total > PY_SSIZE_T_MAX - body - VARINT_MAX_BYTES) {
            PyErr_SetString(PyExc_OverflowError, "the records exceed a batch's int32 length");
            goto done;
        }
        total += zigzag_size(body) + body;
    }
    result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL) {
        goto done;
    }
    out = (unsigned char *)PyBytes_AS_STRING(result);
    for (i = 0; i < records; i++) {
        Py_ssize_t row = rows != NULL ? rows[i] : i;
        out = put_zigzag(out, record_body_size(&keys, &values, hoffsets, &hkeys, &hvalues, row, i));
        *out++ = 0; /* attributes */
        *out++ = 0; /* timestamp delta: every record has the batch's timestamp */
        out = put_zigzag(out, i);
        out = put_field(out, &keys, row);
        out = put_field(out, &values, row);
        if (hoffsets != NULL) {
            Py_ssize_t h;
            out = put_zigzag(out, hoffsets[row + 1] - hoffsets[row]);
            for (h = hoffsets[row]; h < hoffsets[row + 1]; h++) {
                out = put_field(out, &hkeys, h);
                out = put_field(out, &hvalues, h);
            }
        }
        else {
            *out++ = 0;
        }
    }
    assert(out == (unsigned char *)PyBytes_AS_STRING(result) + total);

done:
    arrow_binary_release(&keys);
    arrow_binary_release(&values);
    arrow_binary_release(&hkeys);
    arrow_binary_release(&hvalues);
    if (have_hoffsets) {
        PyBuffer_Release(&hoffsets_view);
    }
    if (have_rows) {
        PyBuffer_Release(&rows_view);
    }
    if (PyErr_Occurred()) {
        Py_CLEAR(result);
    }
    return result;
}

/* Kafka's Utils.murmur2: seed 0x9747b28c, every product wrapping at 32 bits (unsigned here, the
 * same bits), >>> an unsigned shift. */
static uint32_t
murmur2_bytes(const unsigned char *bytes, Py_ssize_t length)
{
    const uint32_t m = 0x5bd1e995;
    uint32_t h = 0x9747b28cu ^ (uint32_t)length, k;
    Py_ssize_t tail = length & ~(Py_ssize_t)3, i;

    for (i = 0; i < tail; i += 4) {
        k = (uint32_t)bytes[i] | (uint32_t)bytes[i + 1] << 8 | (uint32_t)bytes[i + 2] << 16 |
            (uint32_t)bytes[i + 3] << 24;
        k *= m;
        k ^= k >> 24;
        k *= m;
        h *= m;
        h ^= k;
    }
    switch (length & 3) {
    case 3:
        h ^= (uint32_t)bytes[tail + 2] << 16;
        /* fall through */
    case 2:
        h ^= (uint32_t)bytes[tail + 1] << 8;
        /* fall through */
    case 1:
        h ^= (uint32_t)bytes[tail];
        h *= m;
    }
    h ^= h >> 13;
    h *= m;
    h ^= h >> 15;
    return h;
}

PyDoc_STRVAR(partition_keys_doc,
"partition_keys(count, keys, partition_count)\n"
"--\n\n"
"Kafka's default partition of each of ``count`` keys -- toPositive(murmur2(key)) %\n"
"partition_count -- as int32 bytes, -1 for a null key. ``keys`` is a (validity, offsets,\n"
"data) tuple as encode_columns takes it. services.partitioner.partition_for_key is the\n"
"reference.");

static PyObject *
partition_keys(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    arrow_binary keys;
    Py_ssize_t count, partitions, i;
    PyObject *result;
    int32_t *out;

    (void)module;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "partition_keys() takes 3 arguments (%zd given)", nargs);
        return NULL;
    }
    count = PyLong_AsSsize_t(args[0]);
    if (count == -1 && PyErr_Occurred()) {
        return NULL;
    }
    partitions = PyLong_AsSsize_t(args[2]);
    if (partitions == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (count < 0 || partitions < 1 || partitions > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "count must be >= 0 and partition_count in 1 .. 2**31-1");
        return NULL;
    }
    if (arrow_binary_get(args[1], count, "keys", &keys) < 0) {
        return NULL;
    }
    result = PyBytes_FromStringAndSize(NULL, count * 4);
    if (result != NULL) {
        out = (int32_t *)PyBytes_AS_STRING(result);
        for (i = 0; i < count; i++) {
            if (arrow_is_null(&keys, i)) {
                out[i] = -1;
            }
            else {
                Py_ssize_t size;
                const unsigned char *key = arrow_item(&keys, i, &size);
                out[i] = (int32_t)((murmur2_bytes(key, size) & 0x7FFFFFFFu) % (uint32_t)partitions);
            }
        }
    }
    arrow_binary_release(&keys);
    return result;
}

/* ------------------------------------------------------------------------------------------ */
/* module                                                                                     */
/* ------------------------------------------------------------------------------------------ */

PyDoc_STRVAR(init_doc,
"init(record_type, corrupt_error)\n"
"--\n\n"
"Set the Record class that decode_records instantiates (a tuple subclass with no instance\n"
"dict, like a NamedTuple) and the exception class for malformed data. record.py calls it on\n"
"import; calling it again replaces both.");

static PyObject *
init(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyTypeObject *type;

    (void)module;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "init() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    if (!PyType_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "record_type must be a class");
        return NULL;
    }
    type = (PyTypeObject *)args[0];
    /* tp_alloc + PyTuple_SET_ITEM is only right for the plain tuple layout. */
    if (!PyType_IsSubtype(type, &PyTuple_Type) || type->tp_basicsize != PyTuple_Type.tp_basicsize ||
        type->tp_itemsize != PyTuple_Type.tp_itemsize || type->tp_dictoffset != 0) {
        PyErr_SetString(PyExc_TypeError,
                        "record_type must be a tuple subclass without instance attributes");
        return NULL;
    }
    if (!PyExceptionClass_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "corrupt_error must be an exception class");
        return NULL;
    }
    Py_XSETREF(record_type, (PyTypeObject *)Py_NewRef(args[0]));
    Py_XSETREF(corrupt_error, Py_NewRef(args[1]));
    Py_RETURN_NONE;
}

/* ---- h14-sdk-consume ---- */
/* ------------------------------------------------------------------------------------------ */
/* as_consumer_records: a batch's decoded Records made the consumer's ConsumerRecords         */
/* ------------------------------------------------------------------------------------------ */

#define CONSUMER_RECORD_FIELDS 8

PyDoc_STRVAR(as_consumer_records_doc,
"as_consumer_records(records, consumer_type, topic, partition, timestamp_type)\n"
"--\n\n"
"C version of gateway.client.fetcher.py_as_consumer_records (the reference): replace each\n"
"Record of the list ``records`` (a 5-tuple: offset, timestamp, key, value, headers), in place,\n"
"by a ``consumer_type`` tuple (topic, partition, offset, timestamp, timestamp_type, key, value,\n"
"headers); ``consumer_type`` must be a tuple subclass without instance attributes (a\n"
"NamedTuple). Returns None. A record holding only atomic fields (strings, ints, bytes, None,\n"
"headers that are) is left untracked by the garbage collector, as the collector leaves such\n"
"plain tuples itself: a poll's thousand records then cost its collections nothing to walk,\n"
"and never pile up in the old generation to trigger full collections.");

/* Whether the collector could find a reference cycle through ``op``. A plain tuple of plain
 * tuples of atomic objects (a record's headers: (key, value) pairs) cannot hold one: it is
 * untracked here, as the collector would untrack it on its first pass (_PyTuple_MaybeUntrack). */
static int
may_hold_cycle(PyObject *op)
{
    Py_ssize_t i, j;

    if (!PyObject_IS_GC(op) || !PyObject_GC_IsTracked(op)) {
        return 0;
    }
    if (!PyTuple_CheckExact(op)) {
        return 1;
    }
    for (i = 0; i < PyTuple_GET_SIZE(op); i++) {
        PyObject *item = PyTuple_GET_ITEM(op, i);
        if (!PyObject_IS_GC(item) || !PyObject_GC_IsTracked(item)) {
            continue;
        }
        if (!PyTuple_CheckExact(item)) {
            return 1;
        }
        for (j = 0; j < PyTuple_GET_SIZE(item); j++) {
            PyObject *inner = PyTuple_GET_ITEM(item, j);
            if (PyObject_IS_GC(inner) && PyObject_GC_IsTracked(inner)) {
                return 1;
            }
        }
    }
    for (i = 0; i < PyTuple_GET_SIZE(op); i++) {
        PyObject *item = PyTuple_GET_ITEM(op, i);
        if (PyObject_IS_GC(item) && PyObject_GC_IsTracked(item)) {
            PyObject_GC_UnTrack(item);
        }
    }
    PyObject_GC_UnTrack(op);
    return 0;
}

/* Replace each Record of the list ``records`` by a ``type`` tuple, as as_consumer_records
 * documents. ``type`` was checked by the caller. Returns 0, or -1 with an exception set. */
static int
records_to_consumer(PyObject *records, PyTypeObject *type, PyObject *topic, PyObject *partition,
                    PyObject *timestamp_type)
{
    Py_ssize_t i;

    /* The list's length is read each time: nothing called here runs Python code, but stay
     * within it whatever happens. */
    for (i = 0; i < PyList_GET_SIZE(records); i++) {
        PyObject *record = PyList_GET_ITEM(records, i);
        PyObject *fields[CONSUMER_RECORD_FIELDS];
        PyObject *made;
        int k, atomic = 1;

        if (!PyTuple_Check(record) || PyTuple_GET_SIZE(record) != RECORD_FIELDS) {
            PyErr_Format(PyExc_TypeError, "records[%zd] is not a 5-field Record but %.100s", i,
                         Py_TYPE(record)->tp_name);
            return -1;
        }
        fields[0] = topic;
        fields[1] = partition;
        fields[2] = PyTuple_GET_ITEM(record, 0);
        fields[3] = PyTuple_GET_ITEM(record, 1);
        fields[4] = timestamp_type;
        fields[5] = PyTuple_GET_ITEM(record, 2);
        fields[6] = PyTuple_GET_ITEM(record, 3);
        fields[7] = PyTuple_GET_ITEM(record, 4);
        made = type->tp_alloc(type, CONSUMER_RECORD_FIELDS);
        if (made == NULL) {
            return -1;
        }
#if PY_VERSION_HEX >= 0x030E0000
        ((PyTupleObject *)made)->ob_hash = -1; /* see decode_one */
#endif
        for (k = 0; k < CONSUMER_RECORD_FIELDS; k++) {
            if (atomic && may_hold_cycle(fields[k])) {
                atomic = 0;
            }
            PyTuple_SET_ITEM(made, k, Py_NewRef(fields[k]));
        }
        if (atomic && PyObject_GC_IsTracked(made)) {
            /* Nothing it holds can lead back to it but its class, which outlives every record. */
            PyObject_GC_UnTrack(made);
        }
        /* The list's reference to the Record goes (usually its last: the Record is freed). */
        PyList_SET_ITEM(records, i, made);
        Py_DECREF(record);
    }
    return 0;
}

/* ``type`` as a class tp_alloc can fill like a tuple (as init checks record_type), or NULL with
 * a TypeError. */
static PyTypeObject *
consumer_type_of(PyObject *type)
{
    PyTypeObject *t;

    if (!PyType_Check(type)) {
        PyErr_SetString(PyExc_TypeError, "consumer_type must be a class");
        return NULL;
    }
    t = (PyTypeObject *)type;
    if (!PyType_IsSubtype(t, &PyTuple_Type) || t->tp_basicsize != PyTuple_Type.tp_basicsize ||
        t->tp_itemsize != PyTuple_Type.tp_itemsize || t->tp_dictoffset != 0) {
        PyErr_SetString(PyExc_TypeError,
                        "consumer_type must be a tuple subclass without instance attributes");
        return NULL;
    }
    return t;
}

static PyObject *
as_consumer_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyTypeObject *type;

    (void)module;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "as_consumer_records() takes 5 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    if (!PyList_Check(args[0])) {
        PyErr_Format(PyExc_TypeError, "records must be a list, not %.100s",
                     Py_TYPE(args[0])->tp_name);
        return NULL;
    }
    type = consumer_type_of(args[1]);
    if (type == NULL) {
        return NULL;
    }
    if (records_to_consumer(args[0], type, args[2], args[3], args[4]) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(decode_consumer_records_doc,
"decode_consumer_records(data, count, base_offset, base_timestamp, log_append_time,\n"
"                        last_offset_delta, first_offset, consumer_type, topic, partition,\n"
"                        timestamp_type)\n"
"--\n\n"
"decode_records(data, count, base_offset, base_timestamp, log_append_time, last_offset_delta,\n"
"first_offset) followed by as_consumer_records(records, consumer_type, topic, partition,\n"
"timestamp_type): the same records, the same errors. The garbage collector does not run in\n"
"between (a batch's thousand Records, short-lived, would otherwise make it walk them and move\n"
"them to older generations). No Python code runs in between, so no other thread sees the\n"
"pause either (were one to run, it would only find a collection put off).");

static PyObject *
decode_consumer_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyTypeObject *type;
    PyObject *records;
    int collecting, failed;

    if (nargs != 11) {
        PyErr_Format(PyExc_TypeError, "decode_consumer_records() takes 11 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    type = consumer_type_of(args[7]);
    if (type == NULL) {
        return NULL;
    }
    collecting = PyGC_Disable();
    records = decode_records(module, args, 7, NULL);
    failed = records == NULL || records_to_consumer(records, type, args[8], args[9], args[10]) < 0;
    if (collecting) {
        PyGC_Enable();
    }
    if (failed) {
        Py_XDECREF(records);
        return NULL;
    }
    return records;
}

/* ---- h16-sdk-produce ---- */
/* ------------------------------------------------------------------------------------------ */
/* encode_record_request: a one-record batch and the produce request frame around it          */
/* ------------------------------------------------------------------------------------------ */

static inline unsigned char *
put_be32(unsigned char *out, uint32_t v)
{
    out[0] = (unsigned char)(v >> 24);
    out[1] = (unsigned char)(v >> 16);
    out[2] = (unsigned char)(v >> 8);
    out[3] = (unsigned char)v;
    return out + 4;
}

static inline unsigned char *
put_be64(unsigned char *out, uint64_t v)
{
    put_be32(out, (uint32_t)(v >> 32));
    return put_be32(out + 4, (uint32_t)v);
}

PyDoc_STRVAR(encode_record_request_doc,
"encode_record_request(prefix, partition, timestamp, key, value, headers)\n"
"--\n\n"
"C version of gateway.client.sealed.py_encode_record_request (the reference): the produce\n"
"request frame ``prefix`` starts (a bytes object: its first 4 bytes are overwritten with the\n"
"frame's size; then kind, correlation id, acks, timeout, topic and a partition count of 1)\n"
"followed by ``partition``, the length and bytes of an uncompressed RecordBatch v2 holding the\n"
"one record (base offset 0, no producer id, CREATE_TIME, as RecordBatchBuilder builds it) and\n"
"an empty trace context: a new bytearray. None (nothing done) when an argument is not of the\n"
"common types append_record takes, or out of range: the Python reference then encodes it, or\n"
"raises.");

static PyObject *
encode_record_request(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *prefix, *headers, *frame;
    PyObject *const *pairs = NULL;
    blob key, value;
    int64_t timestamp, partition;
    Py_ssize_t header_count = 0, fields, body, record, batch, total, prefix_len;
    unsigned char *start, *out, *batch_at;

    (void)module;
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "encode_record_request() takes 6 arguments (%zd given)",
                     nargs);
        return NULL;
    }
    prefix = args[0];
    headers = args[5];
    if (!PyBytes_CheckExact(prefix) || PyBytes_GET_SIZE(prefix) < 4) {
        PyErr_SetString(PyExc_TypeError, "encode_record_request() needs a bytes prefix of 4+ bytes");
        return NULL;
    }
    prefix_len = PyBytes_GET_SIZE(prefix);
    if (!exact_int64(args[1], &partition) || partition < 0 || partition > INT32_MAX ||
        !exact_int64(args[2], &timestamp)) {
        Py_RETURN_NONE;
    }
    if (headers != Py_None && !PyTuple_CheckExact(headers) && !PyList_CheckExact(headers)) {
        Py_RETURN_NONE;
    }
    if (!get_blob(args[3], &key)) {
        Py_RETURN_NONE;
    }
    if (!get_blob(args[4], &value)) {
        release_blob(&key);
        Py_RETURN_NONE;
    }
    /* As in append_record: the header items are borrowed once the buffers are taken. */
    if (headers != Py_None) {
        header_count = PySequence_Fast_GET_SIZE(headers);
        pairs = PySequence_Fast_ITEMS(headers);
        if (header_count > INT32_MAX) {
            goto decline;
        }
    }

    /* Pass 1: sizes (capped as they are added: no overflow). The record's timestamp and
     * offset deltas are 0: one byte each, like its attributes. */
    fields = record_fields_size(&key, &value, pairs, header_count, NULL);
    if (fields < 0 || fields > INT32_MAX - 3) {
        goto decline;
    }
    body = 3 + fields;
    record = unsigned_varint_size((uint64_t)body << 1) + body;
    batch = RECORDS_AT + record;
    if (batch > INT32_MAX - prefix_len - 10) {
        goto decline; /* the frame's size (an int32) could not say it */
    }
    total = prefix_len + 8 + batch + 2;
    frame = PyByteArray_FromStringAndSize(NULL, total);
    if (frame == NULL) {
        release_blob(&key);
        release_blob(&value);
        return NULL;
    }

    /* Pass 2: write. */
    start = (unsigned char *)PyByteArray_AS_STRING(frame);
    memcpy(start, PyBytes_AS_STRING(prefix), (size_t)prefix_len);
    put_be32(start, (uint32_t)(total - 4));
    out = put_be32(start + prefix_len, (uint32_t)partition);
    out = put_be32(out, (uint32_t)batch);
    batch_at = out;
    out = put_be64(out, 0);                                   /* baseOffset */
    out = put_be32(out, (uint32_t)(batch - LOG_OVERHEAD_BYTES)); /* batchLength */
    out = put_be32(out, 0xFFFFFFFFu);                          /* partitionLeaderEpoch -1 */
    *out++ = 2;                                                /* magic */
    out += 4;                                                  /* crc, below */
    *out++ = 0;                                                /* attributes */
    *out++ = 0;
    out = put_be32(out, 0);                                    /* lastOffsetDelta */
    out = put_be64(out, (uint64_t)timestamp);                  /* baseTimestamp */
    out = put_be64(out, (uint64_t)timestamp);                  /* maxTimestamp */
    out = put_be64(out, UINT64_MAX);                           /* producerId -1 */
    *out++ = 0xFF;                                             /* producerEpoch -1 */
    *out++ = 0xFF;
    out = put_be32(out, 0xFFFFFFFFu);                          /* baseSequence -1 */
    out = put_be32(out, 1);                                    /* recordCount */
    out = write_unsigned_varint(out, (uint64_t)body << 1);
    *out++ = 0x00; /* attributes */
    *out++ = 0x00; /* timestampDelta */
    *out++ = 0x00; /* offsetDelta */
    out = write_record_fields(out, &key, &value, pairs, header_count, NULL);
    *out++ = 0x00; /* an empty trace context */
    *out++ = 0x00;
    release_blob(&key);
    release_blob(&value);
    if (out != start + total) {
        Py_DECREF(frame);
        PyErr_SetString(PyExc_SystemError, "encode_record_request: size mismatch");
        return NULL;
    }
    put_be32(batch_at + CRC_AT,
             crc32c_of(batch_at + ATTRIBUTES_AT, batch - ATTRIBUTES_AT));
    return frame;

decline:
    release_blob(&key);
    release_blob(&value);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(untrack_doc,
"untrack(obj)\n"
"--\n\n"
"Stop the garbage collector tracking ``obj`` (nothing if it is not tracked); returns None.\n"
"Only for objects that can no longer be part of a reference cycle: everything they refer to,\n"
"and will ever refer to, leads back to none of them (gateway/client/futures.py: a produced\n"
"record's settled result and future). The collector then never walks them.");

static PyObject *
untrack(PyObject *module, PyObject *obj)
{
    (void)module;
    if (PyObject_IS_GC(obj) && PyObject_GC_IsTracked(obj)) {
        PyObject_GC_UnTrack(obj);
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(time_ms_doc,
"time_ms()\n"
"--\n\n"
"The system clock in whole milliseconds since the epoch: ``time.time_ns() // 1_000_000``\n"
"(CLOCK_REALTIME, as ``time_ns``), without the nanoseconds' big integer and its division\n"
"(~0.1-0.3 us in Python; the producer reads the clock once a record).");

static PyObject *
time_ms(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    struct timespec now;
    if (clock_gettime(CLOCK_REALTIME, &now) != 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    /* Floor division, as Python's: before 1970 tv_sec is negative and tv_nsec still >= 0. */
    return PyLong_FromLongLong((long long)now.tv_sec * 1000 + now.tv_nsec / 1000000);
}

PyDoc_STRVAR(track_doc,
"track(obj)\n"
"--\n\n"
"Have the garbage collector track ``obj`` again (nothing if it is tracked, or not a container\n"
"object); returns None. Undoes :func:`untrack` once ``obj`` may be part of a cycle again\n"
"(gateway/client/futures.py: a record future someone hangs a callback on).");

static PyObject *
track(PyObject *module, PyObject *obj)
{
    (void)module;
    if (PyObject_IS_GC(obj) && !PyObject_GC_IsTracked(obj)) {
        PyObject_GC_Track(obj);
    }
    Py_RETURN_NONE;
}

static PyMethodDef speedups_methods[] = {
    {"init", (PyCFunction)(void (*)(void))init, METH_FASTCALL, init_doc},
    {"decode_records", (PyCFunction)(void (*)(void))decode_records, METH_FASTCALL | METH_KEYWORDS,
     decode_records_doc},
    {"validate_records", (PyCFunction)(void (*)(void))validate_records,
     METH_FASTCALL | METH_KEYWORDS, validate_records_doc},
    {"append_record", (PyCFunction)(void (*)(void))append_record, METH_FASTCALL,
     append_record_doc},
    {"murmur2", (PyCFunction)murmur2, METH_O, murmur2_doc},
    {"scan_producer_batches", (PyCFunction)(void (*)(void))scan_producer_batches,
     METH_FASTCALL | METH_KEYWORDS, scan_producer_batches_doc},
    {"crc32c", (PyCFunction)crc32c_py, METH_O, crc32c_doc},
    {"_crc32c_by_table", (PyCFunction)crc32c_table_py, METH_O, crc32c_table_doc},
    {"encode_columns", (PyCFunction)(void (*)(void))encode_columns, METH_FASTCALL | METH_KEYWORDS,
     encode_columns_doc},
    {"partition_keys", (PyCFunction)(void (*)(void))partition_keys, METH_FASTCALL,
     partition_keys_doc},
    {"as_consumer_records", (PyCFunction)(void (*)(void))as_consumer_records, METH_FASTCALL,
     as_consumer_records_doc},
    {"decode_consumer_records", (PyCFunction)(void (*)(void))decode_consumer_records,
     METH_FASTCALL, decode_consumer_records_doc},
    {"encode_record_request", (PyCFunction)(void (*)(void))encode_record_request, METH_FASTCALL,
     encode_record_request_doc},
    {"untrack", (PyCFunction)untrack, METH_O, untrack_doc},
    {"track", (PyCFunction)track, METH_O, track_doc},
    {"time_ms", (PyCFunction)time_ms, METH_NOARGS, time_ms_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    "services.records._speedups",
    "C versions of the RecordBatch v2 per-record loops; services/records/record.py and\n"
    "builder.py are the reference (and of Kafka's murmur2: services/partitioner.py). Use\n"
    "through services.records and services.partitioner, not directly.",
    -1, /* state lives in C globals: no sub-interpreters */
    speedups_methods,
    NULL,
    NULL,
    NULL,
    NULL,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    PyObject *module;

    if (PyType_Ready(&ColumnsType) < 0) {
        return NULL;
    }
    module = PyModule_Create(&speedups_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "Columns", (PyObject *)&ColumnsType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
