/* _native, part 2: a lone serving request's whole turn in native code (lonestep.py).
 *
 * The common requests of lone clients -- the START of an episode on a closed lane, a STEP or
 * the END of an open one, a flat float32 observation inside its Box, one Discrete action --
 * cost the Python path of the inference role (Requests.read, the obs check,
 * LaneBook.apply_one, the forward pass, the draw, LaneBook.remember_one, the answer) ~40 us
 * each; here a few. Anything else is *declined* (nothing changed) and the Python path serves
 * it, so this file implements those cases of LaneBook.apply_one + remember_one and must
 * agree with them exactly (tests/unit/test_lonestep.py compares both on random request
 * sequences).
 *
 * Every byte offset comes from the numpy dtypes (shm/lanes.py LaneLayout, shm/records.py
 * StepLayout: the one declaration of each layout) through the `layout` tuple, in the order
 * of the L_ / R_ / K_ names below; the constructor checks each field fits its record.
 *
 * Shared memory: the lane belongs to a client that may scribble on it at any time. The
 * request (op, reward, seq, observation) is read once, the observation into the forward
 * pass's input row, and only that copy is checked and used; resp_seq is stored last, with
 * release order, as LaneArea.answer does.
 */
#include "native.h"

#include <math.h>
#include <string.h>

/* The layout tuple's L_, R_ and K_ indexes: declared.h (lonestep.LONE_LAYOUT). */
enum { B_OPEN, B_EVALUATE, B_SLOT, B_PENDING, B_HAS_PENDING, B_FRAGMENT_STEPS, B_RET, B_LENGTH, N_BOOK };
static const Py_ssize_t BOOK_ITEM[N_BOOK] = {1, 1, 8, 0, 1, 8, 8, 8}; /* (0: R_BYTES) */

typedef struct {
    PyObject_HEAD
    Py_ssize_t at[N_LAYOUT];
    float *low, *high;        /* [K_OBS_FLOATS]: served here only strictly inside */
    Py_buffer book[N_BOOK];   /* LaneBook's arrays (bind) */
    Py_ssize_t capacity;      /* lanes the book covers; 0: not bound */
    int ready;                /* __init__ succeeded */
    int busy;                 /* inside step(): bind() and step() refuse (re-entrancy) */
} LoneStep;

static void release_book(LoneStep *self)
{
    if (self->capacity > 0)
        for (int i = 0; i < N_BOOK; i++)
            PyBuffer_Release(&self->book[i]);
    self->capacity = 0;
}

static void LoneStep_dealloc(LoneStep *self)
{
    release_book(self);
    PyMem_Free(self->low);
    PyMem_Free(self->high);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int read_floats(PyObject *obj, Py_ssize_t count, float **dst)
{
    Py_buffer view;
    if (PyObject_GetBuffer(obj, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    int ok = view.len == count * (Py_ssize_t)sizeof(float) && view.format && !strcmp(view.format, "f");
    if (ok && (*dst = PyMem_Malloc((size_t)(count ? count : 1) * sizeof(float))) != NULL)
        memcpy(*dst, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    if (!ok)
        PyErr_Format(PyExc_ValueError, "bounds: expected %zd float32 values", count);
    else if (*dst == NULL)
        PyErr_NoMemory();
    return ok && *dst ? 0 : -1;
}

/* Every field inside its record: [at, at + size) within [0, bytes). */
static int layout_fits(const Py_ssize_t *at)
{
    const Py_ssize_t obs = at[K_OBS_FLOATS] * 4, dist = at[K_DIST] * 4;
    const Py_ssize_t lane[][2] = {{L_REQ_SEQ, 4}, {L_RESP_SEQ, 4}, {L_OP, 1}, {L_FLAGS, 1}, {L_REWARD, 4}, {L_STATUS, 4},
                                  {L_WEIGHTS_SEQ_NO, 8}, {L_LOGP, 4}, {L_ACTION, 4}, {L_OBS, obs}};
    const Py_ssize_t rec[][2] = {{R_FLAGS, 1}, {R_STREAM_ID, 4}, {R_WEIGHTS_SEQ_NO, 8}, {R_REWARD, 4}, {R_LOGP, 4},
                                 {R_OBS, obs}, {R_ACTION, 4}, {R_DIST, dist}};
    if (at[K_OBS_FLOATS] < 1 || at[K_DIST] < 1 || at[L_BYTES] < 1 || at[R_BYTES] < 1 || at[L_REQ_SEQ] % 4
        || at[L_RESP_SEQ] % 4)
        return 0;
    for (size_t i = 0; i < sizeof lane / sizeof lane[0]; i++)
        if (at[lane[i][0]] < 0 || at[lane[i][0]] + lane[i][1] > at[L_BYTES])
            return 0;
    for (size_t i = 0; i < sizeof rec / sizeof rec[0]; i++)
        if (at[rec[i][0]] < 0 || at[rec[i][0]] + rec[i][1] > at[R_BYTES])
            return 0;
    return 1;
}

static int LoneStep_init(LoneStep *self, PyObject *args, PyObject *kwds)
{
    static char *names[] = {"layout", "low", "high", NULL};
    PyObject *layout, *low, *high;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!OO", names, &PyTuple_Type, &layout, &low, &high))
        return -1;
    if (self->low != NULL || PyTuple_GET_SIZE(layout) != N_LAYOUT) {
        PyErr_Format(PyExc_ValueError, "layout: a tuple of %d offsets and sizes (initialised once)", N_LAYOUT);
        return -1;
    }
    for (int i = 0; i < N_LAYOUT; i++) {
        self->at[i] = PyLong_AsSsize_t(PyTuple_GET_ITEM(layout, i));
        if (self->at[i] == -1 && PyErr_Occurred())
            return -1;
    }
    if (!layout_fits(self->at)) {
        PyErr_SetString(PyExc_ValueError, "layout: a field lies outside its lane or record");
        return -1;
    }
    if (read_floats(low, self->at[K_OBS_FLOATS], &self->low) < 0
        || read_floats(high, self->at[K_OBS_FLOATS], &self->high) < 0)
        return -1;
    self->ready = 1;
    return 0;
}

/* bind(open, evaluate, slot, pending, has_pending, fragment_steps, ret, length): LaneBook's
 * arrays (again after every LaneBook.grow, which replaces them). */
static PyObject *LoneStep_bind(LoneStep *self, PyObject *args)
{
    if (!self->ready || self->busy)
        return PyErr_Format(PyExc_RuntimeError, "LoneStep %s", self->ready ? "in use" : "not initialised");
    if (!PyTuple_Check(args) || PyTuple_GET_SIZE(args) != N_BOOK)
        return PyErr_Format(PyExc_TypeError, "bind takes the book's %d arrays", N_BOOK);
    release_book(self);
    Py_buffer views[N_BOOK];
    Py_ssize_t capacity = -1;
    for (int i = 0; i < N_BOOK; i++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(args, i), &views[i], PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
            while (i-- > 0)
                PyBuffer_Release(&views[i]);
            return NULL;
        }
        Py_ssize_t item = BOOK_ITEM[i] ? BOOK_ITEM[i] : self->at[R_BYTES];
        if (i == 0)
            capacity = views[0].len;
        if (views[i].len != capacity * item) {
            for (int j = 0; j <= i; j++)
                PyBuffer_Release(&views[j]);
            return PyErr_Format(PyExc_ValueError, "book array %d: %zd bytes for %zd lanes", i, views[i].len, capacity);
        }
    }
    memcpy(self->book, views, sizeof views);
    self->capacity = capacity > 0 ? capacity : 0;
    if (self->capacity == 0)
        for (int i = 0; i < N_BOOK; i++)
            PyBuffer_Release(&self->book[i]);
    Py_RETURN_NONE;
}

#define AT(base, off, type) (*(type *)((char *)(base) + (off)))

/* The categorical draw of distributions.categorical_one, in the same double arithmetic:
 * the index the inverse CDF gives at u (u < 0: the mode), and its log-probability. */
static Py_ssize_t categorical(const float *logits, Py_ssize_t n, double u, double *logp)
{
    double top = logits[0], total = 0.0;
    for (Py_ssize_t i = 1; i < n; i++)
        if (logits[i] > top)
            top = logits[i];
    for (Py_ssize_t i = 0; i < n; i++)
        total += exp((double)logits[i] - top);
    Py_ssize_t a = 0;
    if (u < 0) {
        while ((double)logits[a] != top)
            a++;
    } else {
        double target = u * total, acc = exp((double)logits[0] - top);
        while (acc <= target && a < n - 1) {
            a++;
            acc += exp((double)logits[a] - top);
        }
        while (a > 0 && exp((double)logits[a] - top) == 0.0) /* (rounding past the last positive weight) */
            a--;
    }
    *logp = (double)logits[a] - top - log(total);
    return a;
}

/* What serving one lane did, beyond its answer: step records written to `out` (at most 2),
 * train steps among them, and an event the caller must act on before going further. */
enum { EV_NONE, EV_EVAL_END, EV_START, EV_END };
typedef struct {
    int records, steps, event;
    double ret;               /* EV_EVAL_END: the episode's return, length, last version */
    int64_t length, last_seq;
    int64_t slot;             /* EV_END: the agent slot to give back */
} Served;

/* The answer's common part: status OK, the version; resp_seq last (release). */
static void answer(const Py_ssize_t *at, char *row, uint32_t req_seq, long long seq_no)
{
    const int32_t status = 0;
    const int64_t seq64 = seq_no;
    memcpy(row + at[L_STATUS], &status, sizeof status);
    memcpy(row + at[L_WEIGHTS_SEQ_NO], &seq64, sizeof seq64);
    __atomic_store_n(&AT(row, at[L_RESP_SEQ], uint32_t), req_seq, __ATOMIC_RELEASE);
}

/* LaneBook.apply_one for a STEP or END: the reward completes the pending step (a training
 * lane's step record into `out`). */
static void complete_pending(LoneStep *self, Py_ssize_t lane, float reward, char *out, Served *s)
{
    const Py_ssize_t *at = self->at;
    AT(self->book[B_RET].buf, lane * 8, double) += reward;
    AT(self->book[B_LENGTH].buf, lane * 8, int64_t) += 1;
    if (!AT(self->book[B_EVALUATE].buf, lane, uint8_t) && AT(self->book[B_HAS_PENDING].buf, lane, uint8_t)) {
        memcpy(out, (char *)self->book[B_PENDING].buf + lane * at[R_BYTES], (size_t)at[R_BYTES]);
        memcpy(out + at[R_REWARD], &reward, sizeof reward);
        AT(self->book[B_FRAGMENT_STEPS].buf, lane * 8, int64_t) += 1;
        s->records = s->steps = 1;
    }
    AT(self->book[B_HAS_PENDING].buf, lane, uint8_t) = 0;
}

/* LaneBook.apply_one + _close for an END: the final record of a training episode (its
 * slot to give back: EV_END), the return of an evaluation one (EV_EVAL_END). */
static void end_episode(LoneStep *self, Py_ssize_t lane, const float *x, int flags, float reward, char *out,
                        Served *s)
{
    const Py_ssize_t *at = self->at;
    complete_pending(self, lane, reward, out, s);
    const int64_t slot = AT(self->book[B_SLOT].buf, lane * 8, int64_t);
    if (AT(self->book[B_EVALUATE].buf, lane, uint8_t)) {
        s->event = EV_EVAL_END;
        s->ret = AT(self->book[B_RET].buf, lane * 8, double);
        s->length = AT(self->book[B_LENGTH].buf, lane * 8, int64_t);
        memcpy(&s->last_seq, (char *)self->book[B_PENDING].buf + lane * at[R_BYTES] + at[R_WEIGHTS_SEQ_NO],
               sizeof s->last_seq);
    } else {
        char *final = out + s->records * at[R_BYTES];
        const int64_t none = -1;
        const uint32_t stream = (uint32_t)slot;
        memset(final, 0, (size_t)at[R_BYTES]);
        memcpy(final + at[R_OBS], x, (size_t)at[K_OBS_FLOATS] * sizeof(float));
        AT(final, at[R_FLAGS], uint8_t) = (uint8_t)(at[K_FINAL_OBS] | (flags & at[K_TERMINATED] ? at[K_REC_TERMINATED] : 0)
                                                   | (flags & at[K_TRUNCATED] ? at[K_REC_TRUNCATED] : 0));
        memcpy(final + at[R_STREAM_ID], &stream, sizeof stream);
        memcpy(final + at[R_WEIGHTS_SEQ_NO], &none, sizeof none);
        s->records += 1;
        s->event = EV_END;
        s->slot = slot;
    }
    AT(self->book[B_OPEN].buf, lane, uint8_t) = 0;
    AT(self->book[B_SLOT].buf, lane * 8, int64_t) = -1;
    AT(self->book[B_FRAGMENT_STEPS].buf, lane * 8, int64_t) = 0;
}

/* LaneBook._start_one without the slot (a training episode's: the caller takes it, EV_START). */
static void start_episode(LoneStep *self, Py_ssize_t lane, int evaluate, Served *s)
{
    AT(self->book[B_OPEN].buf, lane, uint8_t) = 1;
    AT(self->book[B_EVALUATE].buf, lane, uint8_t) = (uint8_t)evaluate;
    AT(self->book[B_RET].buf, lane * 8, double) = 0.0;
    AT(self->book[B_LENGTH].buf, lane * 8, int64_t) = 0;
    AT(self->book[B_FRAGMENT_STEPS].buf, lane * 8, int64_t) = 0;
    s->event = evaluate ? EV_NONE : EV_START;
}

/* The action for the observation in the program's input row, if the logits allow it: 0
 * with *a, *logp (drawn through random() unless `evaluate`: the mode), -1 declined (nothing
 * changed), -2 an exception is set. */
static int choose(LoneStep *self, Program *p, int evaluate, PyObject *random, Py_ssize_t *a, double *logp)
{
    native_execute(p, 1);
    const float *logits = p->arena + p->offset[p->output];
    int finite_top = 0;
    for (Py_ssize_t i = 0; i < self->at[K_DIST]; i++) {
        if (isnan(logits[i]) || logits[i] == INFINITY)
            return -1; /* (diverged weights: the Python path decides) */
        finite_top |= isfinite(logits[i]);
    }
    if (!finite_top)
        return -1;
    double u = -1.0;
    if (!evaluate) {
        self->busy = p->busy = 1; /* (random(), the float() of what it returns and that */
        PyObject *drawn = PyObject_CallNoArgs(random); /* object's release are any Python: */
        u = drawn ? PyFloat_AsDouble(drawn) : -1.0;    /* none may rebind or rerun) */
        Py_XDECREF(drawn);
        self->busy = p->busy = 0;
        if (PyErr_Occurred() || !(u >= 0.0 && u < 1.0)) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "random() must return a float in [0, 1)");
            return -2;
        }
    }
    *a = categorical(logits, self->at[K_DIST], u, logp);
    return 0;
}

/* LaneBook.remember_one: the answered request is the lane's pending step; then the answer. */
static void remember_and_answer(LoneStep *self, Program *p, char *row, Py_ssize_t lane, uint32_t req_seq,
                                long long seq_no, Py_ssize_t a, double logp)
{
    const Py_ssize_t *at = self->at;
    char *const pending = (char *)self->book[B_PENDING].buf + lane * at[R_BYTES];
    const float action = (float)a, logp32 = (float)logp;
    const int64_t seq64 = seq_no;
    const uint32_t stream = (uint32_t)AT(self->book[B_SLOT].buf, lane * 8, int64_t);
    memcpy(pending + at[R_OBS], p->arena + p->offset[0], (size_t)at[K_OBS_FLOATS] * sizeof(float));
    memcpy(pending + at[R_ACTION], &action, sizeof action);
    memcpy(pending + at[R_LOGP], &logp32, sizeof logp32);
    memcpy(pending + at[R_DIST], p->arena + p->offset[p->output], (size_t)at[K_DIST] * sizeof(float));
    memcpy(pending + at[R_WEIGHTS_SEQ_NO], &seq64, sizeof seq64);
    memcpy(pending + at[R_STREAM_ID], &stream, sizeof stream);
    AT(pending, at[R_FLAGS], uint8_t) = (uint8_t)at[K_STEP_FLAGS];
    AT(self->book[B_HAS_PENDING].buf, lane, uint8_t) = 1;
    memcpy(row + at[L_ACTION], &action, sizeof action);
    memcpy(row + at[L_LOGP], &logp32, sizeof logp32);
    answer(at, row, req_seq, seq_no);
}

/* One lane's request, if it is the common case: a START on a closed lane, a STEP or an END
 * of an open episode, the observation strictly inside the Box. -1 declined (nothing
 * changed), 0 served (`s`: what it wrote to `out`, room for 2 records, and its event), -2
 * an exception is set (nothing changed but the forward pass's arena). The caller checked
 * the program against the layout, the lane against the book and the lanes' buffer, and made
 * room for one arena row. */
static int serve_lane(LoneStep *self, Program *p, char *row, Py_ssize_t lane, PyObject *random,
                      long long seq_no, char *out, Served *s)
{
    const Py_ssize_t *at = self->at;
    float *x = p->arena + p->offset[0]; /* (n = 1: a register starts at its offset) */
    const uint32_t req_seq = __atomic_load_n(&AT(row, at[L_REQ_SEQ], uint32_t), __ATOMIC_ACQUIRE);
    const int op = AT(row, at[L_OP], uint8_t), flags = AT(row, at[L_FLAGS], uint8_t);
    float reward;
    memcpy(&reward, row + at[L_REWARD], sizeof reward);
    memcpy(x, row + at[L_OBS], (size_t)at[K_OBS_FLOATS] * sizeof(float));
    const int is_open = AT(self->book[B_OPEN].buf, lane, uint8_t) != 0, starting = op == at[K_OP_START];
    if (starting ? is_open : !is_open || (op != at[K_OP_STEP] && op != at[K_OP_END]))
        return -1; /* (a restart or a lost episode: the Python path) */
    for (Py_ssize_t i = 0; i < at[K_OBS_FLOATS]; i++)
        if (!(self->low[i] < x[i] && x[i] < self->high[i])) /* (NaN fails too) */
            return -1;
    *s = (Served){0};
    if (op == at[K_OP_END] && AT(self->book[B_EVALUATE].buf, lane, uint8_t)
        && AT(self->book[B_SLOT].buf, lane * 8, int64_t) >= 0)
        return -1; /* (an evaluation lane holding a slot: never made here; Python gives it back) */
    if (op == at[K_OP_END]) {
        end_episode(self, lane, x, flags, reward, out, s);
        answer(at, row, req_seq, seq_no);
        return 0;
    }
    const int evaluate = starting ? (flags & at[K_EVALUATE]) != 0 : AT(self->book[B_EVALUATE].buf, lane, uint8_t);
    Py_ssize_t a;
    double logp;
    const int chosen = choose(self, p, evaluate, random, &a, &logp);
    if (chosen < 0)
        return chosen;
    if (starting)
        start_episode(self, lane, evaluate, s);
    else
        complete_pending(self, lane, reward, out, s);
    remember_and_answer(self, p, row, lane, req_seq, seq_no, a, logp);
    return 0;
}

/* The checks step() and serve() share: initialised, not in use, the program's widths this
 * layout's, one arena row. 0, or -1 with an exception set. */
static int usable(LoneStep *self, Program *p)
{
    const Py_ssize_t *at = self->at;
    if (!self->ready || self->busy || !p->ready || p->busy) {
        PyErr_SetString(PyExc_RuntimeError, "LoneStep or Program not initialised, or in use");
        return -1;
    }
    if (p->n_inputs != 1 || p->state_output != -1 /* (a recurrent program: its state is kept in Python) */
        || p->width[0] != at[K_OBS_FLOATS] || p->width[p->output] != at[K_DIST]) {
        PyErr_SetString(PyExc_ValueError, "the program's input/output widths are not this layout's");
        return -1;
    }
    return native_ensure_arena(p, 1);
}

/* Writable C-contiguous views of lanes and out (0), or -1 with an exception set. */
static int two_views(PyObject *lanes_obj, Py_buffer *lanes, PyObject *out_obj, Py_buffer *out)
{
    if (PyObject_GetBuffer(lanes_obj, lanes, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0)
        return -1;
    if (PyObject_GetBuffer(out_obj, out, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(lanes);
        return -1;
    }
    return 0;
}

/* serve(program, lanes, order, start, random, seq_no, out, max_steps): serve the lanes
 * order[start:] (of `lanes`, a region's lanes, as bytes), in order, where they are the common
 * case (serve_lane), until one is declined, `max_steps` train steps were completed (a sample
 * boundary: the caller hands them on before going further), `out` (records, one per row)
 * has no room for two more, or an episode started or ended (its event); `random()` gives
 * each draw (called only to explore). Returns (next, records, steps, declined, event):
 * order[start:next] were served, out[:records] holds the records they wrote, `steps` of
 * them train steps; if `declined`, order[next] is a lane declined with nothing changed;
 * `event` is None, (1, return, length, version): the evaluation episode of order[next - 1]
 * ended, (2, 0, 0, 0): a training episode started on it (the caller gives it a slot), or
 * (3, slot, 0, 0): a training episode ended on it (the caller gives its slot back). */
static PyObject *LoneStep_serve(LoneStep *self, PyObject *args)
{
    PyObject *prog_obj, *lanes_obj, *order_obj, *random, *out_obj;
    Py_ssize_t start, max_steps;
    long long seq_no;
    if (!PyArg_ParseTuple(args, "O!OOnOLOn", &NativeProgramType, &prog_obj, &lanes_obj, &order_obj, &start,
                          &random, &seq_no, &out_obj, &max_steps))
        return NULL;
    Program *p = (Program *)prog_obj;
    if (usable(self, p) < 0)
        return NULL;
    Py_buffer order;
    if (PyObject_GetBuffer(order_obj, &order, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    Py_buffer lanes, out;
    if (two_views(lanes_obj, &lanes, out_obj, &out) < 0) {
        PyBuffer_Release(&order);
        return NULL;
    }
    const Py_ssize_t *at = self->at, room = out.len / at[R_BYTES];
    const int ok = order.itemsize == 8 && order.format && !(strcmp(order.format, "q") && strcmp(order.format, "l"))
                   && out.len % at[R_BYTES] == 0 && room >= 2 && start >= 0 && start <= order.len / 8
                   && max_steps >= 1;
    const Py_ssize_t n = ok ? order.len / 8 : 0;
    const int64_t *lane_at = order.buf;
    Py_ssize_t next = start, records = 0, steps = 0;
    int declined = 0, failed = !ok;
    Served s = {0};
    if (!ok)
        PyErr_SetString(PyExc_ValueError, "serve: order is int64 lanes, out whole records (at least 2), "
                                          "start in order, max_steps >= 1");
    for (; !failed && next < n && steps < max_steps && records + 2 <= room; next++) {
        const int64_t lane = lane_at[next];
        if (lane < 0 || lane >= self->capacity || (lane + 1) * at[L_BYTES] > lanes.len) {
            PyErr_Format(PyExc_IndexError, "lane %lld: past the book or the lanes", (long long)lane);
            failed = 1;
            break;
        }
        const int r = serve_lane(self, p, (char *)lanes.buf + lane * at[L_BYTES], lane, random, seq_no,
                                 (char *)out.buf + records * at[R_BYTES], &s);
        if (r < 0) {
            failed = r == -2;
            declined = r == -1;
            break;
        }
        records += s.records;
        steps += s.steps;
        if (s.event != EV_NONE) { /* (the caller acts on it before going on) */
            next++;
            break;
        }
    }
    PyBuffer_Release(&order);
    PyBuffer_Release(&lanes);
    PyBuffer_Release(&out);
    if (failed)
        return NULL;
    if (s.event == EV_EVAL_END)
        return Py_BuildValue("nnnO(idLL)", next, records, steps, Py_False, EV_EVAL_END, s.ret, (long long)s.length,
                             (long long)s.last_seq);
    if (s.event != EV_NONE)
        return Py_BuildValue("nnnO(iLii)", next, records, steps, Py_False, s.event, (long long)s.slot, 0, 0);
    return Py_BuildValue("nnnOO", next, records, steps, declined ? Py_True : Py_False, Py_None);
}

static PyMethodDef LoneStep_methods[] = {
    {"bind", (PyCFunction)LoneStep_bind, METH_VARARGS,
     "bind(open, evaluate, slot, pending, has_pending, fragment_steps, ret, length): LaneBook's arrays."},
    {"serve", (PyCFunction)LoneStep_serve, METH_VARARGS,
     "serve(program, lanes, order, start, random, seq_no, out, max_steps) -> (next, records, steps, declined, "
     "event): the lanes order[start:] served natively until one is declined, max_steps train steps are "
     "completed, out is full or an episode started or ended."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject NativeLoneStepType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rlinkd.daemon.inference._native.LoneStep",
    .tp_basicsize = sizeof(LoneStep),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "LoneStep(layout, low, high): a lone STEP request served natively (lonestep.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)LoneStep_init,
    .tp_dealloc = (destructor)LoneStep_dealloc,
    .tp_methods = LoneStep_methods,
};
