/* _native, part 3: the lane scan of a serving turn (policy_lanes.py PolicyLanes.pending).
 *
 * Each turn the inference role looks for requests in the areas whose request counter moved:
 * a lane is pending when its req_seq differs from its resp_seq. In numpy that is a few calls
 * per area (~1.5 us each, whatever its size), and with 64 lone clients a turn looks at ~24
 * areas; here it is one call that walks each area's lanes (one cache line per lane, in
 * address order).
 *
 *   pending_lanes(lanes, req_at, resp_at, starts, counts, slots, out) -> n
 *
 *   lanes          a region's lanes (C-contiguous records of lanes.itemsize bytes)
 *   req_at/resp_at byte offsets of the u32 req_seq / resp_seq words in a lane record
 *   starts/counts  int64 per header slot: the slot's first lane and its own lanes
 *   slots          int64: the slots to look at, in this order
 *   out            int64, room for every lane looked at: the pending lanes, slot by slot,
 *                  each slot's in lane order; n of them
 *
 * Every slot, range and offset is checked first, and out must not overlap the other buffers
 * (ValueError; nothing written). The lanes
 * belong to clients that may write them at any time: each word is read once (relaxed; a
 * request seen later is found by the next scan, as in numpy).
 */
#include "native.h"

#include <string.h>

/* A C-contiguous int64 view (0), or -1 with an exception set. */
static int int64_view(PyObject *obj, Py_buffer *view, int writable, const char *what)
{
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (view->itemsize != 8 || !view->format || (strcmp(view->format, "q") && strcmp(view->format, "l"))) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s: expected an int64 array", what);
        return -1;
    }
    return 0;
}

/* Whether two buffers share a byte (out must not: it is written while the others are read). */
static int overlap(const Py_buffer *a, const Py_buffer *b)
{
    const uintptr_t pa = (uintptr_t)a->buf, pb = (uintptr_t)b->buf;
    return a->len > 0 && b->len > 0 && pa < pb + (uintptr_t)b->len && pb < pa + (uintptr_t)a->len;
}

/* Lanes to look at in all (-1 with ValueError when a slot or range is out of bounds). */
static Py_ssize_t checked_total(const int64_t *starts, const int64_t *counts, Py_ssize_t n_slots,
                                const int64_t *slots, Py_ssize_t n, Py_ssize_t n_lanes)
{
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t s = slots[i];
        if (s < 0 || s >= n_slots || starts[s] < 0 || counts[s] < 0 || starts[s] > n_lanes
            || counts[s] > n_lanes - starts[s]) {
            PyErr_Format(PyExc_ValueError, "slot %lld or its lanes are out of bounds", (long long)s);
            return -1;
        }
        if (counts[s] > PY_SSIZE_T_MAX - total) {
            PyErr_SetString(PyExc_ValueError, "too many lanes to look at");
            return -1;
        }
        total += (Py_ssize_t)counts[s];
    }
    return total;
}

static Py_ssize_t scan(const char *lanes, Py_ssize_t lane_bytes, Py_ssize_t req_at, Py_ssize_t resp_at,
                       const int64_t *starts, const int64_t *counts, const int64_t *slots, Py_ssize_t n,
                       int64_t *out)
{
    Py_ssize_t found = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t first = starts[slots[i]], end = first + counts[slots[i]];
        for (int64_t lane = first; lane < end; lane++) {
            const char *row = lanes + lane * lane_bytes;
            uint32_t req, resp;
            memcpy(&req, row + req_at, 4);
            memcpy(&resp, row + resp_at, 4);
            if (req != resp)
                out[found++] = lane;
        }
    }
    return found;
}

PyObject *native_pending_lanes(PyObject *module, PyObject *args)
{
    (void)module;
    PyObject *lanes_obj, *objs[4];
    Py_ssize_t req_at, resp_at;
    if (!PyArg_ParseTuple(args, "OnnOOOO", &lanes_obj, &req_at, &resp_at, &objs[0], &objs[1], &objs[2], &objs[3]))
        return NULL;
    static const char *names[4] = {"starts", "counts", "slots", "out"};
    Py_buffer lanes, v[4];
    if (PyObject_GetBuffer(lanes_obj, &lanes, PyBUF_C_CONTIGUOUS | PyBUF_ND) < 0)
        return NULL;
    int got = 0;
    while (got < 4 && int64_view(objs[got], &v[got], got == 3, names[got]) == 0)
        got++;
    Py_ssize_t found = -1;
    if (got == 4) {
        const Py_ssize_t lane_bytes = lanes.ndim == 1 ? lanes.itemsize : 0;
        const Py_ssize_t n_lanes = lane_bytes ? lanes.len / lane_bytes : 0, n_slots = v[0].len / 8;
        Py_ssize_t total = -1;
        if (lanes.ndim != 1 || lane_bytes < 4 || req_at < 0 || resp_at < 0 || req_at > lane_bytes - 4
            || resp_at > lane_bytes - 4 || v[1].len != v[0].len)
            PyErr_SetString(PyExc_ValueError, "lanes: a 1-d record array holding both seq words; "
                                              "starts and counts: one entry per slot");
        else
            total = checked_total(v[0].buf, v[1].buf, n_slots, v[2].buf, v[2].len / 8, n_lanes);
        if (total >= 0 && (overlap(&v[3], &v[0]) || overlap(&v[3], &v[1]) || overlap(&v[3], &v[2])
                           || overlap(&v[3], &lanes))) {
            PyErr_SetString(PyExc_ValueError, "out: must not share memory with the other arguments");
            total = -1;
        }
        if (total > v[3].len / 8)
            PyErr_Format(PyExc_ValueError, "out: room for %zd lanes needed", total);
        else if (total >= 0)
            found = scan(lanes.buf, lane_bytes, req_at, resp_at, v[0].buf, v[1].buf, v[2].buf, v[2].len / 8,
                         v[3].buf);
    }
    for (int i = 0; i < got; i++)
        PyBuffer_Release(&v[i]);
    PyBuffer_Release(&lanes);
    return found < 0 ? NULL : PyLong_FromSsize_t(found);
}
