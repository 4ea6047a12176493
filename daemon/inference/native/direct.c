/* _native, part 4: the common frames of direct connections in native code (direct.py).
 *
 * A C client, or client_lib with server-side inference, sends one plain step per message on
 * its direct connection: a STEP_BATCH of one entry {episode_id, observation, reward} or a
 * STEP of the same fields. direct.py spent ~40 us of Python on each (recv, frame split,
 * decode, Front's checks, the lane write, the answer's check, encode, send); here a few.
 *
 * A connection is *fast* (owned here) only while it is idle and clean: direct.py hands it
 * over (`promote`) with the episodes it may step here -- open, started, no LOG_RETURNS
 * reward waiting -- and takes it back (`demote`, reported in the lists `service` and
 * `answer` return) at the first thing this file does not do: any other message or form
 * (a start or end, several entries, an unknown key, a string escape, a number outside its
 * Box, a frame larger than BUF_BYTES), an EOF, a reset, an error status in the answer, a
 * reply the socket does not take at once, a client that floods a connection it has not
 * read the reply of. The bytes read and not consumed go back untouched, as does a request
 * in flight, so direct.py carries on exactly where this file stopped: what is accepted
 * here is what Front.begin would accept and do for that message, and a property test
 * (tests/unit/test_direct_native.py) holds both paths to the same lane writes and replies.
 *
 * Every lane byte offset comes from shm/lanes.py's LaneLayout dtype through `add_policy`'s
 * layout tuple (the P_ names of declared.h). The lane areas are the role's own (private memfds);
 * req_seq is stored last, with release order, as LaneArea.publish does.
 */
#include "native.h"

#include <errno.h>
#include <float.h>
#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>

#define MAX_POLICIES 64
#define MAX_CACHED DIRECT_MAX_EPISODES  /* episodes a fast connection may step (declared.h) */
#define BUF_BYTES 16384    /* a fast connection's input; a larger frame is direct.py's */
#define OUT_BYTES 256
#define MAX_NUMBER_CHARS 32
#define MAX_INT_DIGITS 15  /* an integer token's value is exact in a double */

typedef struct {
    Py_buffer lanes;       /* the area's lanes, writable */
    Py_buffer requests;    /* the area header's requests counter (one u64), writable */
    Py_ssize_t at[N_POLICY];
    double low[MAX_OBS], high[MAX_OBS];  /* Box.small_float_bounds: inside strictly */
    int set;
} Policy;

typedef struct {
    char id[MAX_ID];
    int len, policy, evaluate;
    Py_ssize_t lane;
} Cached;

typedef struct {
    int fd;
    int waiting, wait_ep, wait_batch;  /* a published request (cached[wait_ep]; its reply's form) */
    int in_ready;                       /* listed in ready: frames buffered after a reply */
    double last_seen, frame_since;
    Py_ssize_t handled;                 /* messages since promote */
    size_t len;
    int n_cached;
    Cached cached[MAX_CACHED];
    char buf[BUF_BYTES];
} Conn;

typedef struct {
    PyObject_HEAD
    Policy policy[MAX_POLICIES];
    Conn **conns;          /* by fd; NULL: not fast */
    int n_conns;           /* length of conns */
    int *waitq, n_wait;    /* fds with a published request */
    int *readyq, n_ready;  /* fds with bytes to look at before their socket says so */
    Py_ssize_t max_message_bytes;
    uint64_t published;    /* bit per policy: a request published since `service` returned it */
    Py_ssize_t messages, replies;
    PyObject *demoted;     /* the list being filled by the current call */
    locale_t c_locale;
} Direct;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);  /* (time.monotonic's clock) */
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define FIELD(row, p, k, type) ((type *)((row) + (p)->at[k]))

/* ----------------------------------------------------------------- the fast grammar */
typedef struct {
    const char *p, *end;
    locale_t loc;
} Parser;

static void ws(Parser *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

static int eat(Parser *s, char c)
{
    ws(s);
    if (s->p < s->end && *s->p == c) {
        s->p++;
        return 1;
    }
    return 0;
}

/* A string of printable ASCII without escapes (anything else: -1, declined). */
static int string(Parser *s, const char **out, int *len)
{
    ws(s);
    if (s->p >= s->end || *s->p != '"')
        return -1;
    const char *start = ++s->p;
    while (s->p < s->end && *s->p != '"') {
        unsigned char c = (unsigned char)*s->p;
        if (c < 0x20 || c > 0x7e || c == '\\')
            return -1;
        s->p++;
    }
    if (s->p >= s->end)
        return -1;
    *out = start;
    *len = (int)(s->p - start);
    s->p++;
    return 0;
}

static int digits(Parser *s)
{
    const char *start = s->p;
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9')
        s->p++;
    return (int)(s->p - start);
}

/* A JSON number, finite as a double; an integer token only while exact (-0 is 0, as
 * Python's int). -1: not a number of that kind (declined). */
static int number(Parser *s, double *out)
{
    ws(s);
    const char *start = s->p;
    if (s->p < s->end && *s->p == '-')
        s->p++;
    if (s->p >= s->end || *s->p < '0' || *s->p > '9')
        return -1;
    int whole = (*s->p == '0') ? (s->p++, 1) : digits(s), integer = 1;
    if (s->p < s->end && *s->p == '.') {
        s->p++;
        if (digits(s) == 0)
            return -1;
        integer = 0;
    }
    if (s->p < s->end && (*s->p == 'e' || *s->p == 'E')) {
        s->p++;
        if (s->p < s->end && (*s->p == '+' || *s->p == '-'))
            s->p++;
        if (digits(s) == 0)
            return -1;
        integer = 0;
    }
    char tmp[MAX_NUMBER_CHARS + 1];
    size_t n = (size_t)(s->p - start);
    if (n > MAX_NUMBER_CHARS || (integer && whole > MAX_INT_DIGITS))
        return -1;
    memcpy(tmp, start, n);
    tmp[n] = '\0';
    double v = strtod_l(tmp, NULL, s->loc);
    if (!isfinite(v))
        return -1;
    *out = integer ? v + 0.0 : v;
    return 0;
}

/* false (a flag Front reads as absent); true or anything else: -1. */
static int false_flag(Parser *s)
{
    ws(s);
    if (s->end - s->p >= 5 && memcmp(s->p, "false", 5) == 0) {
        s->p += 5;
        return 0;
    }
    return -1;
}

static int observation(Parser *s, double *obs, int *n)
{
    if (!eat(s, '['))
        return -1;
    *n = 0;
    if (eat(s, ']'))
        return -1;
    do {
        if (*n >= MAX_OBS || number(s, &obs[(*n)++]) != 0)
            return -1;
    } while (eat(s, ','));
    return eat(s, ']') ? 0 : -1;
}

typedef struct {
    int batch;               /* STEP_BATCH (else STEP) */
    const char *id;
    int id_len;
    double reward;
    double obs[MAX_OBS];
    int n_obs;
} Step;

enum { K_TYPE = 1, K_STEPS = 2, K_ID = 4, K_REWARD = 8, K_OBS = 16, K_TERM = 32, K_TRUNC = 64 };

static int key_bit(const char *k, int len)
{
    static const struct { const char *name; int bit; } keys[] = {
        {"type", K_TYPE}, {KEY_STEPS, K_STEPS}, {KEY_EPISODE_ID, K_ID}, {KEY_REWARD, K_REWARD},
        {KEY_OBSERVATION, K_OBS}, {KEY_TERMINATED, K_TERM}, {KEY_TRUNCATED, K_TRUNC},
    };
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if ((int)strlen(keys[i].name) == len && memcmp(keys[i].name, k, (size_t)len) == 0)
            return keys[i].bit;
    return 0;
}

static int object(Parser *s, Step *st, int allowed, int *seen);

/* One member's value (its key's bit given). */
static int member(Parser *s, Step *st, int bit)
{
    const char *v;
    int len;
    switch (bit) {
    case K_TYPE:
        if (string(s, &v, &len) != 0)
            return -1;
        if (len == (int)sizeof MSG_STEP_BATCH - 1 && memcmp(v, MSG_STEP_BATCH, sizeof MSG_STEP_BATCH - 1) == 0)
            st->batch = 1;
        else if (!(len == (int)sizeof MSG_STEP - 1 && memcmp(v, MSG_STEP, sizeof MSG_STEP - 1) == 0))
            return -1;
        return 0;
    case K_STEPS: {
        int seen = 0;
        if (!eat(s, '[') || object(s, st, K_ID | K_REWARD | K_OBS, &seen) != 0 || !eat(s, ']'))
            return -1;  /* (one entry, exactly its three keys: a plain step) */
        return seen == (K_ID | K_REWARD | K_OBS) ? 0 : -1;
    }
    case K_ID:
        if (string(s, &st->id, &st->id_len) != 0 || st->id_len < 1 || st->id_len > MAX_ID)
            return -1;
        return 0;
    case K_REWARD:  /* (beyond float32's range: Python's path refuses it) */
        return number(s, &st->reward) != 0 || fabs(st->reward) > FLT_MAX ? -1 : 0;
    case K_OBS:
        return observation(s, st->obs, &st->n_obs);
    default:
        return false_flag(s);
    }
}

/* An object of the `allowed` keys, each at most once (`seen`: the ones given). */
static int object(Parser *s, Step *st, int allowed, int *seen)
{
    if (!eat(s, '{'))
        return -1;
    do {
        const char *k;
        int len;
        if (string(s, &k, &len) != 0 || !eat(s, ':'))
            return -1;
        int bit = key_bit(k, len);
        if (!(bit & allowed) || (bit & *seen))
            return -1;
        *seen |= bit;
        if (member(s, st, bit) != 0)
            return -1;
    } while (eat(s, ','));
    return eat(s, '}') ? 0 : -1;
}

/* The body as a plain step (0), or -1: declined. */
static int parse_step(const char *body, size_t n, locale_t loc, Step *st)
{
    Parser s = {body, body + n, loc};
    int seen = 0;
    memset(st, 0, sizeof *st);
    if (object(&s, st, K_TYPE | K_STEPS | K_ID | K_REWARD | K_OBS | K_TERM | K_TRUNC, &seen) != 0)
        return -1;
    ws(&s);
    if (s.p != s.end)
        return -1;
    int want = st->batch ? (K_TYPE | K_STEPS) : (K_TYPE | K_ID | K_REWARD | K_OBS);
    int extra = st->batch ? 0 : (K_TERM | K_TRUNC);
    return (seen & ~extra) == want ? 0 : -1;
}

/* ----------------------------------------------------------------- connections */
static Conn *conn_of(Direct *d, int fd)
{
    return (fd >= 0 && fd < d->n_conns) ? d->conns[fd] : NULL;
}

static void unlist(int *q, int *n, int fd)
{
    for (int i = 0; i < *n; i++)
        if (q[i] == fd) {
            q[i] = q[--*n];
            return;
        }
}

/* (A queue holds an fd at most once -- the waiting and in_ready flags -- so the capacity of
 * the conns table is enough: no allocation.) */
static void push(int *q, int *n, int fd)
{
    q[(*n)++] = fd;
}

/* Give the connection back to direct.py: (fd, unread bytes, unsent reply, (episode_id,
 * batch) of a request in flight or None, eof, gone, error or None, last_seen, frame_since,
 * messages handled here) appended to d->demoted; the connection is forgotten here. */
static int demote(Direct *d, Conn *c, const char *out, size_t out_len, int eof, int gone,
                  const char *error)
{
    PyObject *inflight = Py_None;
    Py_INCREF(Py_None);
    if (c->waiting) {
        Py_DECREF(Py_None);
        Cached *e = &c->cached[c->wait_ep];
        inflight = Py_BuildValue("(s#O)", e->id, (Py_ssize_t)e->len, c->wait_batch ? Py_True : Py_False);
        if (inflight == NULL)
            return -1;
    }
    PyObject *item = Py_BuildValue("(iy#y#NOOzddn)", c->fd, c->buf, (Py_ssize_t)c->len, out ? out : "",
                                   (Py_ssize_t)out_len, inflight, eof ? Py_True : Py_False,
                                   gone ? Py_True : Py_False, error, c->last_seen, c->frame_since,
                                   c->handled);
    if (item == NULL)
        return -1;
    int r = PyList_Append(d->demoted, item);
    Py_DECREF(item);
    if (r != 0)
        return -1;
    unlist(d->waitq, &d->n_wait, c->fd);
    unlist(d->readyq, &d->n_ready, c->fd);
    d->conns[c->fd] = NULL;
    PyMem_Free(c);
    return 0;
}

static Cached *find_episode(Conn *c, const char *id, int len, int *index)
{
    for (int i = 0; i < c->n_cached; i++)
        if (c->cached[i].len == len && memcmp(c->cached[i].id, id, (size_t)len) == 0) {
            *index = i;
            return &c->cached[i];
        }
    return NULL;
}

/* The step into its episode's lane and published (0), or -1: declined, nothing written. */
static int publish(Direct *d, Conn *c, const Step *st)
{
    int index;
    Cached *e = find_episode(c, st->id, st->id_len, &index);
    if (e == NULL)
        return -1;
    Policy *p = &d->policy[e->policy];
    if (st->n_obs != (int)p->at[P_OBS_FLOATS] || e->lane < 0 || e->lane >= p->at[P_CAPACITY])
        return -1;
    for (int i = 0; i < st->n_obs; i++)
        if (!(p->low[i] < st->obs[i] && st->obs[i] < p->high[i]))
            return -1;
    char *row = (char *)p->lanes.buf + e->lane * p->at[P_BYTES];
    uint32_t *req = FIELD(row, p, P_REQ_SEQ, uint32_t), *resp = FIELD(row, p, P_RESP_SEQ, uint32_t);
    uint32_t seq = *req;
    if (seq != __atomic_load_n(resp, __ATOMIC_ACQUIRE))
        return -1;  /* (a request still in flight: never for an idle connection) */
    float *obs = FIELD(row, p, P_OBS, float);
    for (int i = 0; i < st->n_obs; i++)
        obs[i] = (float)st->obs[i];
    *FIELD(row, p, P_OP, uint8_t) = (uint8_t)p->at[P_OP_STEP];
    *FIELD(row, p, P_FLAGS, uint8_t) = e->evaluate ? (uint8_t)p->at[P_EVALUATE] : 0;
    *FIELD(row, p, P_REWARD, float) = (float)(0.0 + st->reward);
    *FIELD(row, p, P_GROUP, uint32_t) = 0;
    *FIELD(row, p, P_GROUP_SIZE, uint16_t) = 0;
    __atomic_store_n(req, seq + 1, __ATOMIC_RELEASE);
    *(uint64_t *)p->requests.buf += 1;
    d->published |= (uint64_t)1 << e->policy;
    c->waiting = 1;
    c->wait_ep = index;
    c->wait_batch = st->batch;
    push(d->waitq, &d->n_wait, c->fd);
    return 0;
}

/* Look at the buffered bytes: publish the first frame if it is a plain step, demote at
 * anything else. 0, or -1 with an exception set. */
static int advance(Direct *d, Conn *c)
{
    if (c->waiting)
        return 0;
    if (c->len < 8) {
        c->frame_since = c->len ? (c->frame_since ? c->frame_since : now_s()) : 0.0;
        return 0;
    }
    size_t n = 0;
    for (int i = 0; i < 8; i++) {
        if (c->buf[i] < '0' || c->buf[i] > '9')
            return demote(d, c, NULL, 0, 0, 0, NULL);  /* (direct.py words the error) */
        n = 10 * n + (size_t)(c->buf[i] - '0');
    }
    if ((Py_ssize_t)n > d->max_message_bytes || n + 8 > BUF_BYTES)
        return demote(d, c, NULL, 0, 0, 0, NULL);
    if (c->len < n + 8) {
        c->frame_since = c->frame_since ? c->frame_since : now_s();
        return 0;
    }
    c->frame_since = 0.0;
    Step st;
    if (parse_step(c->buf + 8, n, d->c_locale, &st) != 0 || publish(d, c, &st) != 0)
        return demote(d, c, NULL, 0, 0, 0, NULL);
    memmove(c->buf, c->buf + 8 + n, c->len - 8 - n);
    c->len -= 8 + n;
    c->handled++;
    d->messages++;
    return 0;
}

static int read_conn(Direct *d, Conn *c)
{
    if (c->len == BUF_BYTES)  /* (a client sending ahead of its replies: direct.py's limits) */
        return demote(d, c, NULL, 0, 0, 0, NULL);
    ssize_t got = recv(c->fd, c->buf + c->len, BUF_BYTES - c->len, MSG_DONTWAIT);
    if (got > 0) {
        c->len += (size_t)got;
        c->last_seen = now_s();
        return advance(d, c);
    }
    if (got == 0)
        return demote(d, c, NULL, 0, 1, 0, NULL);
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
        return 0;
    if (errno == ECONNRESET)
        return demote(d, c, NULL, 0, 1, 1, NULL);
    return demote(d, c, NULL, 0, 0, 0, strerror(errno));
}

/* ----------------------------------------------------------------- Python methods */
static void Direct_dealloc(Direct *self)
{
    for (int i = 0; i < MAX_POLICIES; i++)
        if (self->policy[i].set) {
            PyBuffer_Release(&self->policy[i].lanes);
            PyBuffer_Release(&self->policy[i].requests);
        }
    for (int fd = 0; fd < self->n_conns; fd++)
        PyMem_Free(self->conns[fd]);
    PyMem_Free(self->conns);
    PyMem_Free(self->waitq);
    PyMem_Free(self->readyq);
    if (self->c_locale != (locale_t)0)
        freelocale(self->c_locale);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int Direct_init(Direct *self, PyObject *args, PyObject *kwds)
{
    static char *kw[] = {"max_message_bytes", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n", kw, &self->max_message_bytes))
        return -1;
    if (self->c_locale == (locale_t)0)
        self->c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
    if (self->c_locale == (locale_t)0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    return 0;
}

static int check_layout(Policy *p, Py_ssize_t index)
{
    Py_ssize_t bytes = p->at[P_BYTES], n_obs = p->at[P_OBS_FLOATS];
    if (index < 0 || index >= MAX_POLICIES || bytes <= 0 || n_obs < 1 || n_obs > MAX_OBS
        || p->at[P_CAPACITY] < 0 || p->lanes.len < p->at[P_CAPACITY] * bytes || p->requests.len < 8
        || p->lanes.readonly || p->requests.readonly || p->at[P_OBS] < 0
        || p->at[P_OBS] + 4 * n_obs > bytes || p->at[P_ACTION] < 0 || p->at[P_ACTION] + 4 > bytes
        || p->at[P_WEIGHTS_SEQ_NO] < 0 || p->at[P_WEIGHTS_SEQ_NO] + 8 > bytes) {
        PyErr_SetString(PyExc_ValueError, "DirectNative.add_policy: a layout that does not fit");
        return -1;
    }
    for (int k = P_REQ_SEQ; k <= P_GROUP; k++)
        if (p->at[k] < 0 || p->at[k] + 4 > bytes) {
            PyErr_SetString(PyExc_ValueError, "DirectNative.add_policy: a field outside the lane");
            return -1;
        }
    return 0;
}

static PyObject *Direct_add_policy(Direct *self, PyObject *args)
{
    Py_ssize_t index;
    PyObject *lanes, *requests, *layout, *low, *high;
    if (!PyArg_ParseTuple(args, "nOOO!OO", &index, &lanes, &requests, &PyTuple_Type, &layout, &low, &high))
        return NULL;
    if (index < 0 || index >= MAX_POLICIES || self->policy[index].set || PyTuple_GET_SIZE(layout) != N_POLICY) {
        PyErr_SetString(PyExc_ValueError, "DirectNative.add_policy: a bad index or layout tuple");
        return NULL;
    }
    Policy *p = &self->policy[index];
    for (int k = 0; k < N_POLICY; k++)
        if ((p->at[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(layout, k))) == -1 && PyErr_Occurred())
            return NULL;
    Py_buffer lo, hi;
    if (PyObject_GetBuffer(low, &lo, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0)
        return NULL;
    if (PyObject_GetBuffer(high, &hi, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
        PyBuffer_Release(&lo);
        return NULL;
    }
    int ok = lo.len == hi.len && lo.len == 8 * p->at[P_OBS_FLOATS] && lo.len <= 8 * MAX_OBS
             && strcmp(lo.format, "d") == 0 && strcmp(hi.format, "d") == 0;
    if (ok) {
        memcpy(p->low, lo.buf, (size_t)lo.len);
        memcpy(p->high, hi.buf, (size_t)hi.len);
    }
    PyBuffer_Release(&lo);
    PyBuffer_Release(&hi);
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "DirectNative.add_policy: low/high must be float64 [obs floats]");
        return NULL;
    }
    if (PyObject_GetBuffer(lanes, &p->lanes, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0)
        return NULL;
    if (PyObject_GetBuffer(requests, &p->requests, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) {
        PyBuffer_Release(&p->lanes);
        return NULL;
    }
    if (check_layout(p, index) != 0) {
        PyBuffer_Release(&p->lanes);
        PyBuffer_Release(&p->requests);
        return NULL;
    }
    p->set = 1;
    Py_RETURN_NONE;
}

static int cache_episode(Direct *self, Conn *c, PyObject *item)
{
    const char *id;
    Py_ssize_t len, policy, lane;
    int evaluate;
    if (!PyArg_ParseTuple(item, "s#nnp", &id, &len, &policy, &lane, &evaluate))
        return -1;
    if (policy < 0 || policy >= MAX_POLICIES || !self->policy[policy].set) {
        PyErr_SetString(PyExc_ValueError, "DirectNative.promote: an unknown policy index");
        return -1;
    }
    if (len < 1 || len > MAX_ID || lane < 0 || lane >= self->policy[policy].at[P_CAPACITY])
        return 0;  /* (not steppable here: its messages are declined) */
    Cached *e = &c->cached[c->n_cached++];
    memcpy(e->id, id, (size_t)len);
    e->len = (int)len;
    e->policy = (int)policy;
    e->lane = lane;
    e->evaluate = evaluate;
    return 0;
}

/* promote(fd, episodes, last_seen): own the idle connection fd, whose episodes
 * ((episode_id, policy_index, lane, evaluate) each, at most MAX_CACHED) may be stepped here;
 * last_seen: direct.py's clock of its last activity (the idle timeout runs on). */
static PyObject *Direct_promote(Direct *self, PyObject *args)
{
    int fd;
    PyObject *episodes;
    double last_seen;
    if (!PyArg_ParseTuple(args, "iO!d", &fd, &PyList_Type, &episodes, &last_seen))
        return NULL;
    if (PyList_GET_SIZE(episodes) > MAX_CACHED) {
        PyErr_SetString(PyExc_ValueError, "DirectNative.promote: more episodes than DIRECT_MAX_EPISODES");
        return NULL;
    }
    if (fd < 0 || conn_of(self, fd) != NULL) {
        PyErr_SetString(PyExc_ValueError, "DirectNative.promote: a bad or already fast descriptor");
        return NULL;
    }
    if (fd >= self->n_conns) {
        int n = fd + 64;
        Conn **grown = PyMem_Realloc(self->conns, sizeof(Conn *) * (size_t)n);
        if (grown == NULL)
            return PyErr_NoMemory();
        memset(grown + self->n_conns, 0, sizeof(Conn *) * (size_t)(n - self->n_conns));
        self->conns = grown;
        int *waitq = PyMem_Realloc(self->waitq, sizeof(int) * (size_t)n);
        if (waitq == NULL)
            return PyErr_NoMemory();
        self->waitq = waitq;
        int *readyq = PyMem_Realloc(self->readyq, sizeof(int) * (size_t)n);
        if (readyq == NULL)
            return PyErr_NoMemory();
        self->readyq = readyq;
        self->n_conns = n;
    }
    Conn *c = PyMem_Calloc(1, sizeof(Conn));
    if (c == NULL)
        return PyErr_NoMemory();
    c->fd = fd;
    c->last_seen = last_seen;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(episodes); i++)
        if (cache_episode(self, c, PyList_GET_ITEM(episodes, i)) != 0) {
            PyMem_Free(c);
            return NULL;
        }
    self->conns[fd] = c;
    Py_RETURN_NONE;
}

static PyObject *take_demoted(Direct *self)
{
    PyObject *out = self->demoted;
    self->demoted = NULL;
    return out;
}

/* service(events) -> (events for direct.py, demoted, published policy bits, messages).
 * Called once per turn of the role's loop with its epoll events. An exception (no memory, an
 * event that is not an (int, int) tuple) loses the connections given back so far: the role
 * then ends and restarts, as for any exception in its loop. */
static PyObject *Direct_service(Direct *self, PyObject *args)
{
    PyObject *events;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &events))
        return NULL;
    PyObject *rest = PyList_New(0);
    if (rest == NULL || (self->demoted = PyList_New(0)) == NULL) {
        Py_XDECREF(rest);
        return NULL;
    }
    Py_ssize_t before = self->messages;
    while (self->n_ready > 0) {  /* (frames read before a reply went out) */
        Conn *c = conn_of(self, self->readyq[--self->n_ready]);
        if (c != NULL && c->in_ready && (c->in_ready = 0, advance(self, c) != 0))
            goto fail;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(events); i++) {
        PyObject *ev = PyList_GET_ITEM(events, i);
        int fd;
        unsigned int mask;
        if (!PyArg_ParseTuple(ev, "iI", &fd, &mask))
            goto fail;
        Conn *c = conn_of(self, fd);
        if (c != NULL && mask != EPOLLIN && demote(self, c, NULL, 0, 0, 0, NULL) != 0)
            goto fail;  /* (HUP, ERR: direct.py reads what they mean) */
        if (c == NULL || mask != EPOLLIN) {
            if (PyList_Append(rest, ev) != 0)
                goto fail;
        } else if (read_conn(self, c) != 0) {
            goto fail;
        }
    }
    uint64_t published = self->published;
    self->published = 0;
    return Py_BuildValue("(NNKn)", rest, take_demoted(self), (unsigned long long)published,
                         self->messages - before);
fail:
    Py_DECREF(rest);
    Py_CLEAR(self->demoted);
    return NULL;
}

/* The reply frame of an answered plain step (header + body, its length returned): ACTIONS of
 * one entry for a STEP_BATCH, ACTION for a STEP. fastpath.py checks at start that it decodes
 * equal to the Python codec's reply (`format_reply`). */
static int format_reply(char *out, int batch, const char *id, int id_len, long long a, long long seq)
{
    int n = batch
        ? snprintf(out + 8, OUT_BYTES - 8, "{\"type\":\"" MSG_ACTIONS "\",\"" KEY_ACTIONS "\":[%lld],\"" KEY_WEIGHTS_SEQ_NOS "\":[%lld]}", a, seq)
        : snprintf(out + 8, OUT_BYTES - 8, "{\"type\":\"" MSG_ACTION "\",\"" KEY_EPISODE_ID "\":\"%.*s\",\"" KEY_ACTION "\":%lld,"
                   "\"" KEY_WEIGHTS_SEQ_NO "\":%lld}", id_len, id, a, seq);
    char head[9];
    snprintf(head, sizeof head, "%08d", n);
    memcpy(out, head, 8);
    return n + 8;
}

/* The answered request's reply sent (1), still waiting (0), demoted (0), or -1 (error). */
static int answer_one(Direct *self, Conn *c)
{
    Cached *e = &c->cached[c->wait_ep];
    Policy *p = &self->policy[e->policy];
    char *row = (char *)p->lanes.buf + e->lane * p->at[P_BYTES];
    if (*FIELD(row, p, P_REQ_SEQ, uint32_t) != __atomic_load_n(FIELD(row, p, P_RESP_SEQ, uint32_t), __ATOMIC_ACQUIRE))
        return 0;
    float action = *FIELD(row, p, P_ACTION, float);
    if (*FIELD(row, p, P_STATUS, int32_t) != (int32_t)p->at[P_STATUS_OK] || !(fabsf(action) < 1e15f))
        return demote(self, c, NULL, 0, 0, 0, NULL);  /* (direct.py words the refusal) */
    long long a = (long long)nearbyint((double)action) + (long long)p->at[P_ACTION_START];
    long long seq = (long long)*FIELD(row, p, P_WEIGHTS_SEQ_NO, int64_t);
    char out[OUT_BYTES];
    int n = format_reply(out, c->wait_batch, e->id, e->len, a, seq) - 8;
    c->waiting = 0;
    c->last_seen = now_s();  /* (the reply's time, sent whole or not, as direct.py's _reply) */
    ssize_t sent = send(c->fd, out, (size_t)n + 8, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (sent == n + 8) {
        self->replies++;
        if (c->len > 0 && !c->in_ready) {
            c->in_ready = 1;
            push(self->readyq, &self->n_ready, c->fd);
        }
        return 1;
    }
    if (sent >= 0)  /* (direct.py sends the rest when the socket takes it) */
        return demote(self, c, out + sent, (size_t)(n + 8 - sent), 0, 0, NULL);
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
        return demote(self, c, out, (size_t)n + 8, 0, 0, NULL);
    return demote(self, c, NULL, 0, 0, 1, NULL);  /* (closed or reset: replies go nowhere) */
}

/* answer() -> (demoted, replies): after a serving turn, the replies of answered requests
 * (an exception: as for service). */
static PyObject *Direct_answer(Direct *self, PyObject *Py_UNUSED(ignored))
{
    if ((self->demoted = PyList_New(0)) == NULL)
        return NULL;
    Py_ssize_t before = self->replies;
    for (int i = self->n_wait - 1; i >= 0; i--) {
        if (i >= self->n_wait)
            continue;  /* (a demote reordered the list's tail) */
        Conn *c = conn_of(self, self->waitq[i]);
        if (c == NULL || !c->waiting) {
            self->waitq[i] = self->waitq[--self->n_wait];
            continue;
        }
        int r = answer_one(self, c);
        if (r < 0) {
            Py_CLEAR(self->demoted);
            return NULL;
        }
        if (r == 1)
            unlist(self->waitq, &self->n_wait, c->fd);
    }
    return Py_BuildValue("(Nn)", take_demoted(self), self->replies - before);
}

/* times(fd) -> (last_seen, frame_since, waiting) of a fast connection (expire). */
static PyObject *Direct_times(Direct *self, PyObject *args)
{
    int fd;
    if (!PyArg_ParseTuple(args, "i", &fd))
        return NULL;
    Conn *c = conn_of(self, fd);
    if (c == NULL) {
        PyErr_SetString(PyExc_KeyError, "DirectNative.times: not a fast connection");
        return NULL;
    }
    return Py_BuildValue("(ddO)", c->last_seen, c->frame_since, c->waiting ? Py_True : Py_False);
}

/* drop(fd): forget a fast connection (direct.py closes it). */
static PyObject *Direct_drop(Direct *self, PyObject *args)
{
    int fd;
    if (!PyArg_ParseTuple(args, "i", &fd))
        return NULL;
    Conn *c = conn_of(self, fd);
    if (c != NULL) {
        unlist(self->waitq, &self->n_wait, fd);
        unlist(self->readyq, &self->n_ready, fd);
        self->conns[fd] = NULL;
        PyMem_Free(c);
    }
    Py_RETURN_NONE;
}

/* format_reply(batch, episode_id, action, weights_seq_no) -> bytes: the frame answer() sends
 * (for the check against the Python codec). */
static PyObject *Direct_format_reply(Direct *Py_UNUSED(self), PyObject *args)
{
    int batch;
    const char *id;
    Py_ssize_t id_len;
    long long a, seq;
    if (!PyArg_ParseTuple(args, "py#LL", &batch, &id, &id_len, &a, &seq))
        return NULL;
    if (id_len > MAX_ID) {
        PyErr_SetString(PyExc_ValueError, "DirectNative.format_reply: episode id too long");
        return NULL;
    }
    char out[OUT_BYTES];
    int n = format_reply(out, batch, id, (int)id_len, a, seq);
    return PyBytes_FromStringAndSize(out, n);
}

/* parse(body) -> (batch, episode_id, reward, observation) of a plain step, or None where the
 * grammar declines the body (for the check against the Python codec). */
static PyObject *Direct_parse(Direct *self, PyObject *args)
{
    const char *body;
    Py_ssize_t n;
    Step st;
    if (!PyArg_ParseTuple(args, "y#", &body, &n))
        return NULL;
    if (self->c_locale == (locale_t)0) {
        PyErr_SetString(PyExc_RuntimeError, "DirectNative.parse: not initialised");
        return NULL;
    }
    if (parse_step(body, (size_t)n, self->c_locale, &st) != 0)
        Py_RETURN_NONE;
    PyObject *obs = PyTuple_New(st.n_obs);
    if (obs == NULL)
        return NULL;
    for (int i = 0; i < st.n_obs; i++) {
        PyObject *x = PyFloat_FromDouble(st.obs[i]);
        if (x == NULL) {
            Py_DECREF(obs);
            return NULL;
        }
        PyTuple_SET_ITEM(obs, i, x);
    }
    return Py_BuildValue("(Oy#dN)", st.batch ? Py_True : Py_False, st.id, (Py_ssize_t)st.id_len, st.reward, obs);
}

static PyObject *Direct_state(Direct *self, void *Py_UNUSED(closure))
{
    return Py_BuildValue("(ii)", self->n_wait, self->n_ready);
}

static PyGetSetDef Direct_getset[] = {
    {"state", (getter)Direct_state, NULL, "(fast connections waiting for an answer, with frames to look at)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Direct_methods[] = {
    {"add_policy", (PyCFunction)Direct_add_policy, METH_VARARGS,
     "add_policy(index, lanes, requests, layout, low, high): a policy's direct lane area."},
    {"promote", (PyCFunction)Direct_promote, METH_VARARGS,
     "promote(fd, [(episode_id, policy_index, lane, evaluate)], last_seen): own an idle connection."},
    {"service", (PyCFunction)Direct_service, METH_VARARGS,
     "service(events) -> (events left, demoted, published policy bits, messages)."},
    {"answer", (PyCFunction)Direct_answer, METH_NOARGS, "answer() -> (demoted, replies)."},
    {"times", (PyCFunction)Direct_times, METH_VARARGS, "times(fd) -> (last_seen, frame_since, waiting)."},
    {"drop", (PyCFunction)Direct_drop, METH_VARARGS, "drop(fd): forget a fast connection."},
    {"format_reply", (PyCFunction)Direct_format_reply, METH_VARARGS,
     "format_reply(batch, episode_id, action, weights_seq_no) -> bytes: the reply frame answer() sends."},
    {"parse", (PyCFunction)Direct_parse, METH_VARARGS,
     "parse(body) -> (batch, episode_id, reward, observation) of a plain step, or None: declined."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject NativeDirectType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "rlinkd.daemon.inference._native.DirectNative",
    .tp_basicsize = sizeof(Direct),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "DirectNative(max_message_bytes): direct connections' plain steps (direct.py).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Direct_init,
    .tp_dealloc = (destructor)Direct_dealloc,
    .tp_methods = Direct_methods,
    .tp_getset = Direct_getset,
};
