/* _native, part 1: an interpreter of the network op list (client_lib/protocol/netops.py).
 *
 * The inference role's "native" backend (daemon/inference/netnative.py) lowers a spec's op
 * list -- THE description of the maths, which numpy, ONNX and torch interpret too -- into a
 * straight-line program over float32 registers, and this module runs it for a batch of N
 * rows. It exists for one reason: a batch-1 forward pass of a small MLP costs ~13-20 us in
 * numpy or onnxruntime, nearly all of it per-call overhead, and a few us here.
 *
 * Program layout (every instruction is INSN_WORDS int32 words):
 *
 *   word:   0      1     2     3     4     5     6     7
 *         +------+-----+-----+-----+-----+-----+-----+-----+
 *         | code | out |  x  | p0  | p1  | i0  | i1  | i2  |
 *         +------+-----+-----+-----+-----+-----+-----+-----+
 *
 *   out, x      register numbers (a register is [N, width] float32, row-major)
 *   p0, p1      offsets into the constants (float32: weights, biases, immediates)
 *   i0..i2      op-specific integers (see the OP_* comments)
 *
 * Registers 0..n_inputs-1 are the inputs (copied in by run()); the caller checks widths and
 * op arguments once when it builds the program (netnative.py), and the constructor here
 * checks every register number and constant range again, so a bad program is a ValueError,
 * never a stray read.
 */
#include "native.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define INSN_WORDS 8
#define MAX_ROWS (1 << 20) /* rows of one run (the role's batches are at most 4,096) */

enum {
    OP_COPY = 1,      /* out[:, i1:i1+i2] = x[:, i0:i0+i2]        (Cast, Flatten, Concat, Slice) */
    OP_SCALE = 2,     /* out = x * c[p0]                                                        */
    OP_NORMALIZE = 3, /* out = (x - c[p0:]) / c[p1:]                                            */
    OP_ONEHOT = 4,    /* out[:, j] = x[:, c[p0+j]] == c[p1+j]    (columns, values as floats)    */
    OP_LINEAR = 5,    /* out = x @ c[p0:] ([in, out], transposed) + c[p1:]                      */
    OP_TANH = 6,
    OP_RELU = 7,
    OP_TILE = 8,      /* out[n, :] = c[p0:]                                                     */
    OP_CLIP = 9,      /* out = min(max(x, c[p0]), c[p0+1])                                      */
    OP_MASK = 10,     /* out[:, j] = reg(i0)[:, i1+j] != 0 ? x[:, j] : c[p0]                    */
    OP_LSTM = 11,     /* out = the LSTM step of x and state reg(i0) [h | c], hidden size i1;     */
    OP_GRU = 12,      /* ... the GRU step (state [h]). c[p0:] = W_ih^T [in, G*H] then b_ih,     */
                      /* c[p1:] = W_hh^T [H, G*H] then b_hh (G = 4 | 3, PyTorch's gate order);  */
                      /* reg(i2) [N, 2*G*H] is scratch for the gates (recurrent.py's maths)     */
};


static int check_consts(const Program *p, int32_t at, Py_ssize_t count)
{
    return at >= 0 && count >= 0 && (Py_ssize_t)at + count <= p->n_consts;
}

static int check_reg(const Program *p, int32_t r)
{
    return r >= 0 && r < p->n_regs;
}

/* One instruction's arguments against the registers and constants (at construction). */
static int valid_insn(const Program *p, const int32_t *w)
{
    int32_t code = w[0], out = w[1], x = w[2];
    if (!check_reg(p, out) || out < p->n_inputs)
        return 0;
    Py_ssize_t wo = p->width[out];
    if (code == OP_TILE)
        return check_consts(p, w[3], wo);
    if (!check_reg(p, x) || x == out) /* (no op reads the register it writes: memcpy, restrict) */
        return 0;
    Py_ssize_t wx = p->width[x];
    switch (code) {
    case OP_COPY:
        return w[5] >= 0 && w[6] >= 0 && w[7] >= 0 && (Py_ssize_t)w[5] + w[7] <= wx
               && (Py_ssize_t)w[6] + w[7] <= wo;
    case OP_SCALE:
        return wx == wo && check_consts(p, w[3], 1);
    case OP_NORMALIZE:
        return wx == wo && check_consts(p, w[3], wo) && check_consts(p, w[4], wo);
    case OP_ONEHOT:
        if (!check_consts(p, w[3], wo) || !check_consts(p, w[4], wo))
            return 0;
        for (Py_ssize_t j = 0; j < wo; j++) {
            float col = p->consts[w[3] + j];
            if (!(col >= 0 && col < (float)wx))
                return 0;
        }
        return 1;
    case OP_LINEAR:
        return check_consts(p, w[3], wx * wo) && check_consts(p, w[4], wo);
    case OP_TANH:
    case OP_RELU:
        return wx == wo;
    case OP_CLIP:
        return wx == wo && check_consts(p, w[3], 2);
    case OP_LSTM:
    case OP_GRU: {
        const Py_ssize_t h = w[6], g = (code == OP_LSTM ? 4 : 3) * h;
        const int32_t st = w[5], sc = w[7];
        return h > 0 && check_reg(p, st) && check_reg(p, sc) && st != out && sc != out && sc != x && sc != st
               && sc >= p->n_inputs && wo == (code == OP_LSTM ? 2 : 1) * h && p->width[st] == wo
               && p->width[sc] == 2 * g && check_consts(p, w[3], (wx + 1) * g) && check_consts(p, w[4], (h + 1) * g);
    }
    case OP_MASK:
        return wx == wo && check_reg(p, w[5]) && w[5] != out && w[6] >= 0
               && (Py_ssize_t)w[6] + wo <= p->width[w[5]] && check_consts(p, w[3], 1);
    default:
        return 0;
    }
}

/* tanh in float32 without a libm call (glibc's tanhf and expm1f cost ~10-15 ns each and do
 * not vectorise; a 64-wide hidden layer has 64 of them per row), branch-free so the loop
 * over a layer vectorises: |x| < 0.25 an odd Taylor polynomial (next term < 3e-9), else
 * 1 - 2 / (e^2x + 1) with e^2x = 2^k * p(r), |r| <= ln2/2, p the degree-6 Taylor polynomial
 * (relative error < 2e-7). Clamped to +-9, beyond which tanh is +-1 in float32. Absolute
 * error < 3e-7 (tests/unit/test_netnative.py); NaN stays NaN. Only unsigned integer
 * arithmetic on bit patterns: no undefined behaviour for any input. */
static inline float fast_tanh(float x)
{
    const float a = x < -9.0f ? -9.0f : x > 9.0f ? 9.0f : x;
    const float y = 2.0f * a;
    const float t = y * 1.44269504f + 12582912.0f; /* + 1.5 * 2^23: round(y / ln2) in the low bits */
    const float kf = t - 12582912.0f;
    const float r = (y - kf * 0.693359375f) + kf * 2.12194440e-4f; /* y - k ln2, ln2 split in two */
    const float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120
                    + r * (1.0f / 720))))));
    uint32_t tb, sb;
    float scale;
    memcpy(&tb, &t, sizeof tb);
    sb = ((tb - 0x4B400000u) + 127u) << 23; /* 2^k as a float's bits */
    memcpy(&scale, &sb, sizeof scale);
    const float big = 1.0f - 2.0f / (p * scale + 1.0f);
    const float a2 = a * a;
    const float small = a * (1.0f + a2 * (-1.0f / 3 + a2 * (2.0f / 15 + a2 * (-17.0f / 315
                        + a2 * (62.0f / 2835)))));
    return fabsf(a) < 0.25f ? small : big;
}

/* out[r, :wo] = x[r, :in] @ wt + b for n rows, rows ldx and ldo floats apart. Four rows at
 * a time share each row of W^T as it is read (a 64-wide LSTM's weights are ~70 kB: read
 * once per row they made a batch of 64 memory-bound); every output sums in the same order
 * either way (b, then i = 0, 1, ...), so the blocking changes no result. */
static void linear(const float *restrict x, Py_ssize_t ldx, float *restrict out, Py_ssize_t ldo, Py_ssize_t n,
                   Py_ssize_t in, Py_ssize_t wo, const float *restrict wt, const float *restrict b)
{
    Py_ssize_t r = 0;
    for (; r + 4 <= n; r += 4) {
        const float *x0 = x + r * ldx, *x1 = x0 + ldx, *x2 = x1 + ldx, *x3 = x2 + ldx;
        float *o0 = out + r * ldo, *o1 = o0 + ldo, *o2 = o1 + ldo, *o3 = o2 + ldo;
        for (Py_ssize_t j = 0; j < wo; j++)
            o0[j] = o1[j] = o2[j] = o3[j] = b[j];
        for (Py_ssize_t i = 0; i < in; i++) {
            const float a0 = x0[i], a1 = x1[i], a2 = x2[i], a3 = x3[i];
            const float *wi = wt + i * wo; /* row i of W^T: contiguous over the outputs */
            for (Py_ssize_t j = 0; j < wo; j++) {
                const float wj = wi[j];
                o0[j] += a0 * wj;
                o1[j] += a1 * wj;
                o2[j] += a2 * wj;
                o3[j] += a3 * wj;
            }
        }
    }
    for (; r < n; r++) {
        const float *xr = x + r * ldx;
        float *o = out + r * ldo;
        memcpy(o, b, (size_t)wo * sizeof(float));
        for (Py_ssize_t i = 0; i < in; i++) {
            const float xi = xr[i];
            const float *wi = wt + i * wo;
            for (Py_ssize_t j = 0; j < wo; j++)
                o[j] += xi * wi[j];
        }
    }
}

static inline float sigmoid(float x)
{
    return 0.5f * (fast_tanh(0.5f * x) + 1.0f); /* (as recurrent.py: no overflow) */
}

/* OP_LSTM / OP_GRU over n rows (see the enum): the gates of x and of h into the scratch
 * register, [ih | hh] per row, then the cell's element-wise maths into out. */
static void recurrent(const Program *p, const int32_t *w, Py_ssize_t n, const float *x, float *out)
{
    const int lstm = w[0] == OP_LSTM;
    const Py_ssize_t h = w[6], g = (lstm ? 4 : 3) * h, wx = p->width[w[2]], ws = p->width[w[5]];
    const float *s = p->arena + n * p->offset[w[5]], *c = p->consts;
    float *gates = p->arena + n * p->offset[w[7]];
    linear(x, wx, gates, 2 * g, n, wx, g, c + w[3], c + w[3] + wx * g);
    linear(s, ws, gates + g, 2 * g, n, h, g, c + w[4], c + w[4] + h * g); /* (h: the first H columns) */
    for (Py_ssize_t r = 0; r < n; r++) {
        const float *gi = gates + r * 2 * g, *gh = gi + g, *sr = s + r * ws;
        float *o = out + r * ws;
        if (lstm) {
            for (Py_ssize_t j = 0; j < h; j++) {
                const float i = sigmoid(gi[j] + gh[j]), f = sigmoid(gi[h + j] + gh[h + j]);
                const float cn = f * sr[h + j] + i * fast_tanh(gi[2 * h + j] + gh[2 * h + j]);
                o[h + j] = cn;
                o[j] = sigmoid(gi[3 * h + j] + gh[3 * h + j]) * fast_tanh(cn);
            }
        } else {
            for (Py_ssize_t j = 0; j < h; j++) {
                const float rg = sigmoid(gi[j] + gh[j]), z = sigmoid(gi[h + j] + gh[h + j]);
                const float nn = fast_tanh(gi[2 * h + j] + rg * gh[2 * h + j]);
                o[j] = (1.0f - z) * nn + z * sr[j];
            }
        }
    }
}

/* Run every instruction over n rows; registers live in the arena (n * width each). */
void native_execute(Program *p, Py_ssize_t n)
{
    const float *c = p->consts;
    for (Py_ssize_t k = 0; k < p->n_insns; k++) {
        const int32_t *w = p->code + k * INSN_WORDS;
        Py_ssize_t wo = p->width[w[1]];
        float *out = p->arena + n * p->offset[w[1]];
        Py_ssize_t wx = w[0] == OP_TILE ? 0 : p->width[w[2]];
        const float *x = w[0] == OP_TILE ? NULL : p->arena + n * p->offset[w[2]];
        Py_ssize_t total = n * wo;
        switch (w[0]) {
        case OP_COPY:
            for (Py_ssize_t r = 0; r < n; r++)
                memcpy(out + r * wo + w[6], x + r * wx + w[5], (size_t)w[7] * sizeof(float));
            break;
        case OP_SCALE:
            for (Py_ssize_t i = 0; i < total; i++)
                out[i] = x[i] * c[w[3]];
            break;
        case OP_NORMALIZE:
            for (Py_ssize_t r = 0; r < n; r++)
                for (Py_ssize_t j = 0; j < wo; j++)
                    out[r * wo + j] = (x[r * wo + j] - c[w[3] + j]) / c[w[4] + j];
            break;
        case OP_ONEHOT:
            for (Py_ssize_t r = 0; r < n; r++)
                for (Py_ssize_t j = 0; j < wo; j++)
                    out[r * wo + j] = x[r * wx + (Py_ssize_t)c[w[3] + j]] == c[w[4] + j] ? 1.0f : 0.0f;
            break;
        case OP_LINEAR:
            linear(x, wx, out, wo, n, wx, wo, c + w[3], c + w[4]);
            break;
        case OP_LSTM:
        case OP_GRU:
            recurrent(p, w, n, x, out);
            break;
        case OP_TANH:
            for (Py_ssize_t i = 0; i < total; i++)
                out[i] = fast_tanh(x[i]);
            break;
        case OP_RELU:
            for (Py_ssize_t i = 0; i < total; i++)
                out[i] = x[i] < 0.0f ? 0.0f : x[i]; /* (NaN stays NaN, as in np.maximum) */
            break;
        case OP_TILE:
            for (Py_ssize_t r = 0; r < n; r++)
                memcpy(out + r * wo, c + w[3], (size_t)wo * sizeof(float));
            break;
        case OP_CLIP:
            for (Py_ssize_t i = 0; i < total; i++) { /* (NaN stays NaN, as in np.clip) */
                float v = x[i];
                out[i] = v < c[w[3]] ? c[w[3]] : v > c[w[3] + 1] ? c[w[3] + 1] : v;
            }
            break;
        case OP_MASK: {
            const float *m = p->arena + n * p->offset[w[5]];
            Py_ssize_t wm = p->width[w[5]];
            for (Py_ssize_t r = 0; r < n; r++)
                for (Py_ssize_t j = 0; j < wo; j++)
                    out[r * wo + j] = m[r * wm + w[6] + j] != 0.0f ? x[r * wo + j] : c[w[3]];
            break;
        }
        }
    }
}

static int copy_array(PyObject *obj, const char *what, Py_ssize_t itemsize, void **dst, Py_ssize_t *count)
{
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS) < 0)
        return -1;
    if (view.len % itemsize) {
        PyErr_Format(PyExc_ValueError, "%s: %zd bytes is not a whole number of items", what, view.len);
        PyBuffer_Release(&view);
        return -1;
    }
    *dst = PyMem_Malloc(view.len ? (size_t)view.len : 1);
    if (*dst == NULL) {
        PyBuffer_Release(&view);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(*dst, view.buf, (size_t)view.len);
    *count = view.len / itemsize;
    PyBuffer_Release(&view);
    return 0;
}

static void Program_dealloc(Program *self)
{
    PyMem_Free(self->code);
    PyMem_Free(self->consts);
    PyMem_Free(self->width);
    PyMem_Free(self->offset);
    PyMem_Free(self->arena);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Program_init(Program *self, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"code", "consts", "widths", "n_inputs", "output", "state_output", NULL};
    PyObject *code, *consts, *widths;
    Py_ssize_t n_code, n_inputs;
    int output, state_output = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOni|i", names, &code, &consts, &widths, &n_inputs, &output,
                                     &state_output))
        return -1;
    if (self->code != NULL || self->consts != NULL || self->width != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Program is initialised once");
        return -1;
    }
    self->n_inputs = n_inputs;
    self->output = output;
    self->state_output = state_output;
    if (copy_array(code, "code", 4, (void **)&self->code, &n_code) < 0
        || copy_array(consts, "consts", 4, (void **)&self->consts, &self->n_consts) < 0
        || copy_array(widths, "widths", 4, (void **)&self->width, &self->n_regs) < 0)
        return -1;
    if (n_code % INSN_WORDS || self->n_inputs < 0 || self->n_inputs > self->n_regs
        || !check_reg(self, self->output) || (self->state_output != -1 && !check_reg(self, self->state_output))) {
        PyErr_SetString(PyExc_ValueError, "malformed program (code length, inputs or outputs)");
        return -1;
    }
    self->n_insns = n_code / INSN_WORDS;
    self->offset = PyMem_Malloc((size_t)(self->n_regs ? self->n_regs : 1) * sizeof(Py_ssize_t));
    if (self->offset == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->row_floats = 0;
    for (Py_ssize_t r = 0; r < self->n_regs; r++) {
        if (self->width[r] <= 0 || self->width[r] > (1 << 24)) {
            PyErr_Format(PyExc_ValueError, "register %zd: width %d", r, self->width[r]);
            return -1;
        }
        self->offset[r] = self->row_floats;
        self->row_floats += self->width[r];
    }
    for (Py_ssize_t k = 0; k < self->n_insns; k++)
        if (!valid_insn(self, self->code + k * INSN_WORDS)) {
            PyErr_Format(PyExc_ValueError, "instruction %zd (op %d) does not fit the registers/constants",
                         k, self->code[k * INSN_WORDS]);
            return -1;
        }
    self->ready = 1;
    return 0;
}

int native_ensure_arena(Program *self, Py_ssize_t rows)
{
    if (rows <= self->arena_rows)
        return 0;
    if (rows > MAX_ROWS || self->row_floats > PY_SSIZE_T_MAX / (Py_ssize_t)sizeof(float) / rows) {
        PyErr_Format(PyExc_ValueError, "%zd rows: more than this program runs at once", rows);
        return -1;
    }
    float *arena = PyMem_Realloc(self->arena, (size_t)(rows * self->row_floats) * sizeof(float));
    if (arena == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->arena = arena;
    self->arena_rows = rows;
    return 0;
}

/* Register `reg`'s n rows into the writable float32 buffer `obj` (0, or -1 with an exception set). */
static int copy_out(Program *self, int32_t reg, Py_ssize_t n, PyObject *obj, const char *what)
{
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0)
        return -1;
    Py_ssize_t want = n * self->width[reg] * (Py_ssize_t)sizeof(float);
    int ok = view.len == want && view.format && !strcmp(view.format, "f");
    if (ok)
        memcpy(view.buf, self->arena + n * self->offset[reg], (size_t)want);
    PyBuffer_Release(&view);
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "%s: expected %zd float32 values", what, want / 4);
        return -1;
    }
    return 0;
}

/* run(n, inputs, out[, state_out]): inputs a sequence of n_inputs C-contiguous float32
 * buffers of n * width floats each; out a writable one of n * width(output) floats;
 * state_out (given exactly when the program has a state_output) the same for that. */
static PyObject *Program_run(Program *self, PyObject *args)
{
    Py_ssize_t n;
    PyObject *inputs, *out, *state_out = NULL;
    if (!PyArg_ParseTuple(args, "nOO|O", &n, &inputs, &out, &state_out))
        return NULL;
    if (!self->ready || self->busy) {
        PyErr_SetString(PyExc_RuntimeError, self->ready ? "Program is in use by a LoneStep" : "Program not initialised");
        return NULL;
    }
    if (n < 0 || !PyTuple_Check(inputs) || PyTuple_GET_SIZE(inputs) != self->n_inputs
        || (state_out != NULL) != (self->state_output != -1)) {
        PyErr_SetString(PyExc_ValueError, "run(n, inputs: tuple of n_inputs buffers, out"
                                          "[, state_out: exactly for a program with a state output])");
        return NULL;
    }
    if (native_ensure_arena(self, n > 0 ? n : 1) < 0) /* (never a NULL arena, even for n = 0) */
        return NULL;
    for (Py_ssize_t r = 0; r < self->n_inputs; r++) {
        Py_buffer view;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(inputs, r), &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
            return NULL;
        int ok = view.len == n * self->width[r] * (Py_ssize_t)sizeof(float) && view.format && !strcmp(view.format, "f");
        if (ok)
            memcpy(self->arena + n * self->offset[r], view.buf, (size_t)view.len);
        PyBuffer_Release(&view);
        if (!ok) {
            PyErr_Format(PyExc_ValueError, "input %zd: expected %zd float32 values", r, n * self->width[r]);
            return NULL;
        }
    }
    native_execute(self, n);
    if (copy_out(self, self->output, n, out, "out") < 0
        || (state_out != NULL && copy_out(self, self->state_output, n, state_out, "state_out") < 0))
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef Program_methods[] = {
    {"run", (PyCFunction)Program_run, METH_VARARGS,
     "run(n, inputs, out[, state_out]): the program over n rows; inputs a tuple of float32 "
     "buffers (one per input register, n * width values), out (and state_out, for a program "
     "with a state output) a writable float32 buffer."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject NativeProgramType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rlinkd.daemon.inference._native.Program",
    .tp_basicsize = sizeof(Program),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Program(code, consts, widths, n_inputs, output, state_output=-1): a lowered op list "
              "(netnative.py); state_output: a recurrent step's second output register.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Program_init,
    .tp_dealloc = (destructor)Program_dealloc,
    .tp_methods = Program_methods,
};

static PyMethodDef module_functions[] = {
    {"pending_lanes", native_pending_lanes, METH_VARARGS,
     "pending_lanes(lanes, req_at, resp_at, starts, counts, slots, out) -> n: the lanes of "
     "those slots with a request not answered (scan.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native",
    "The inference role's native code: the op-list interpreter (netnative.py), the lone step "
    "(lonestep.py), the lane scan (policy_lanes.py) and direct connections' plain steps (direct.py).", -1,
    module_functions, NULL, NULL, NULL, NULL,
};

/* The opcodes, exported: netnative.py reads them from here (one declaration). */
static int add_opcodes(PyObject *m)
{
    static const struct { const char *name; int code; } ops[] = {
        {"OP_COPY", OP_COPY}, {"OP_SCALE", OP_SCALE}, {"OP_NORMALIZE", OP_NORMALIZE},
        {"OP_ONEHOT", OP_ONEHOT}, {"OP_LINEAR", OP_LINEAR}, {"OP_TANH", OP_TANH},
        {"OP_RELU", OP_RELU}, {"OP_TILE", OP_TILE}, {"OP_CLIP", OP_CLIP}, {"OP_MASK", OP_MASK},
        {"OP_LSTM", OP_LSTM}, {"OP_GRU", OP_GRU},
    };
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (PyModule_AddIntConstant(m, ops[i].name, ops[i].code) < 0)
            return -1;
    return 0;
}

PyMODINIT_FUNC PyInit__native(void)
{
    if (PyType_Ready(&NativeProgramType) < 0 || PyType_Ready(&NativeLoneStepType) < 0
        || PyType_Ready(&NativeDirectType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&NativeProgramType);
    Py_INCREF(&NativeLoneStepType);
    Py_INCREF(&NativeDirectType);
    if (PyModule_AddObject(m, "Program", (PyObject *)&NativeProgramType) < 0
        || PyModule_AddObject(m, "LoneStep", (PyObject *)&NativeLoneStepType) < 0
        || PyModule_AddObject(m, "DirectNative", (PyObject *)&NativeDirectType) < 0
        || PyModule_AddIntConstant(m, "INSN_WORDS", INSN_WORDS) < 0 || add_opcodes(m) < 0
        || PyModule_AddIntConstant(m, "DIRECT_MAX_EPISODES", DIRECT_MAX_EPISODES) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
