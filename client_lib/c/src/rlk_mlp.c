/* rlk_mlp.c - the actor network interpreted from its description (contract in rlk_mlp.h). */
#include "rlk_mlp.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlk_declared.h"  /* RLK_DIST_NAME */

#define MAX_CONCAT 16

typedef enum { OP_INPUT, OP_FLATTEN, OP_NORMALIZE, OP_LINEAR, OP_TANH, OP_RELU, OP_SLICE, OP_TILE,
               OP_CLIP, OP_CONCAT, OP_STATE, OP_LSTM, OP_GRU } op_kind;

typedef struct {
    char name[RLK_MLP_NAME_CHARS];
    size_t offset, size, rows, cols;  /* rows x cols: a matrix [out, in]; a vector has rows 1 */
} param;

typedef struct {
    char name[RLK_MLP_NAME_CHARS];
    size_t width, scratch;  /* scratch: offset of its [max_rows, width] block */
} value;

typedef struct {
    op_kind kind;
    int out, x, xs[MAX_CONCAT], n_xs;
    int p1, p2;             /* weight & bias, mean & std, or the tiled param (p1); a cell's _ih pair */
    int p3, p4, state;      /* a cell: weight_hh & bias_hh, the state value it reads */
    size_t start, stop;     /* Slice */
    size_t hidden;          /* a cell: H */
    float low, high;        /* Clip */
} op;

struct rlk_mlp {
    op ops[RLK_MLP_MAX_OPS];
    param params[RLK_MLP_MAX_PARAMS];
    value *values;          /* [RLK_MLP_MAX_OPS] (each op makes one value) */
    int n_ops, n_params, n_values, input, output, state_in, state_out, max_rows;
    size_t n_floats, obs_size, dist_size;
    size_t gate_floats, gates;  /* the cell's gates: floats per row, scratch offset of [max_rows, gate_floats] */
    float *scratch;
    uint64_t fingerprint;   /* FNV-1a of the description's JSON text */
};

typedef struct {
    const char *s;
    const rlk_jtok *t;
    rlk_mlp *m;
    char *err;
    size_t cap;
} parser;

static rlk_status bad(parser *p, rlk_status st, const char *fmt, const char *detail) {
    snprintf(p->err, p->cap, fmt, detail);
    return st;
}

/* A string field of object token obj into out; -1 when missing or too long. */
static int str_field(parser *p, int obj, const char *key, char *out, size_t cap) {
    int v = rlk_json_get(p->s, p->t, obj, key);
    if (v < 0 || p->t[v].type != RLK_J_STRING || (size_t)p->t[v].len >= cap) return -1;
    return rlk_json_str(p->s, &p->t[v], out, cap);
}

/* A non-negative integer field (<= max) of object token obj; -1 when missing or bad. */
static int size_field(parser *p, int obj, const char *key, size_t max, size_t *out) {
    double v;
    int t = rlk_json_get(p->s, p->t, obj, key);
    if (t < 0 || rlk_json_num(p->s, &p->t[t], &v) != 0 || !(v >= 0 && v <= (double)max) || v != floor(v)) return -1;
    *out = (size_t)v;
    return 0;
}

/* ------------------------------------------------------------------ params */
static int find_param(const rlk_mlp *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0) return i;
    return -1;
}

/* One [name, [dims...]] entry; a rank > 2 tensor is a [dims[0], prod(rest)] matrix. */
static rlk_status read_param(parser *p, int entry) {
    rlk_mlp *m = p->m;
    param *q = &m->params[m->n_params];
    const rlk_jtok *t = p->t;
    if (t[entry].type != RLK_J_ARRAY || t[entry].count != 2) return bad(p, RLK_E_PROTOCOL, "%s", "a malformed parameter entry");
    int name = entry + 1, shape = t[name].next;
    if (t[name].type != RLK_J_STRING || (size_t)t[name].len >= sizeof q->name || t[shape].type != RLK_J_ARRAY)
        return bad(p, RLK_E_PROTOCOL, "%s", "a malformed parameter entry");
    rlk_json_str(p->s, &t[name], q->name, sizeof q->name);
    q->rows = 1;
    q->cols = 1;
    for (int k = 0, i = shape + 1; k < t[shape].count; k++, i = t[i].next) {
        double d;
        if (rlk_json_num(p->s, &t[i], &d) != 0 || !(d >= 1 && d <= RLK_MLP_MAX_PARAM_FLOATS) || d != floor(d))
            return bad(p, RLK_E_PROTOCOL, "parameter %s has a bad dimension", q->name);
        if (k == 0 && t[shape].count > 1) q->rows = (size_t)d;
        else q->cols *= (size_t)d;
        if (q->rows * q->cols > RLK_MLP_MAX_PARAM_FLOATS) return bad(p, RLK_E_LIMIT, "parameter %s is too large", q->name);
    }
    q->size = q->rows * q->cols;
    q->offset = m->n_floats;
    m->n_floats += q->size;
    if (m->n_floats > RLK_MLP_MAX_PARAM_FLOATS) return bad(p, RLK_E_LIMIT, "%s", "the weight vector is too large");
    if (find_param(m, q->name) >= 0) return bad(p, RLK_E_PROTOCOL, "parameter %s is declared twice", q->name);
    m->n_params++;
    return RLK_OK;
}

static rlk_status read_params(parser *p, int arr) {
    if (arr < 0 || p->t[arr].type != RLK_J_ARRAY || p->t[arr].count < 1)
        return bad(p, RLK_E_PROTOCOL, "%s", "the network has no parameter list");
    if (p->t[arr].count > RLK_MLP_MAX_PARAMS) return bad(p, RLK_E_LIMIT, "%s", "the network has too many parameters");
    for (int k = 0, i = arr + 1; k < p->t[arr].count; k++, i = p->t[i].next) {
        rlk_status st = read_param(p, i);
        if (st != RLK_OK) return st;
    }
    return RLK_OK;
}

/* ------------------------------------------------------------------ values */
static int find_value(const rlk_mlp *m, const char *name) {
    for (int i = 0; i < m->n_values; i++)
        if (strcmp(m->values[i].name, name) == 0) return i;
    return -1;
}

/* Field `key` of op token o names an existing value: its index, else -1. */
static int value_field(parser *p, int o, const char *key) {
    char name[RLK_MLP_NAME_CHARS];
    if (str_field(p, o, key, name, sizeof name) != 0) return -1;
    return find_value(p->m, name);
}

/* Field `key` of op token o names a parameter of `size` floats (0: any): its index, else -1. */
static int param_field(parser *p, int o, const char *key, size_t size) {
    char name[RLK_MLP_NAME_CHARS];
    if (str_field(p, o, key, name, sizeof name) != 0) return -1;
    int i = find_param(p->m, name);
    return i >= 0 && (size == 0 || p->m->params[i].size == size) ? i : -1;
}

static size_t width_of(const rlk_mlp *m, int v) { return m->values[v].width; }

/* ------------------------------------------------------------------ ops */
static rlk_status read_input(parser *p, int o, op *q, size_t *width) {
    char key[8], dtype[8];
    int shape = rlk_json_get(p->s, p->t, o, "shape");
    if (p->m->input >= 0 || str_field(p, o, "key", key, sizeof key) != 0 || key[0] ||
        str_field(p, o, "dtype", dtype, sizeof dtype) != 0 || strcmp(dtype, "<f4") != 0 || shape < 0)
        return bad(p, RLK_E_UNSUPPORTED, "%s", "the network reads an observation other than one float Box");
    (void)q;
    *width = p->m->obs_size;
    return RLK_OK;
}

static rlk_status read_linear(parser *p, int o, op *q, size_t *width) {
    q->x = value_field(p, o, "x");
    q->p1 = param_field(p, o, "weight", 0);
    if (q->x < 0 || q->p1 < 0 || p->m->params[q->p1].cols != width_of(p->m, q->x))
        return bad(p, RLK_E_PROTOCOL, "%s", "a Linear op does not fit its input");
    *width = p->m->params[q->p1].rows;
    q->p2 = param_field(p, o, "bias", *width);
    return q->p2 < 0 ? bad(p, RLK_E_PROTOCOL, "%s", "a Linear op has no matching bias") : RLK_OK;
}

static rlk_status read_concat(parser *p, int o, op *q, size_t *width) {
    int xs = rlk_json_get(p->s, p->t, o, "xs");
    if (xs < 0 || p->t[xs].type != RLK_J_ARRAY || p->t[xs].count < 1 || p->t[xs].count > MAX_CONCAT)
        return bad(p, RLK_E_PROTOCOL, "%s", "a Concat op without usable inputs");
    *width = 0;
    for (int k = 0, i = xs + 1; k < p->t[xs].count; k++, i = p->t[i].next) {
        char name[RLK_MLP_NAME_CHARS];
        if (p->t[i].type != RLK_J_STRING || (size_t)p->t[i].len >= sizeof name) return bad(p, RLK_E_PROTOCOL, "%s", "a bad Concat input");
        rlk_json_str(p->s, &p->t[i], name, sizeof name);
        if ((q->xs[k] = find_value(p->m, name)) < 0) return bad(p, RLK_E_PROTOCOL, "Concat reads unknown value %s", name);
        *width += width_of(p->m, q->xs[k]);
    }
    q->n_xs = p->t[xs].count;
    return RLK_OK;
}

/* State: the carried state, a graph input of `width` columns (one per network). */
static rlk_status read_state(parser *p, int o, op *q, size_t *width) {
    if (p->m->state_in >= 0 || size_field(p, o, "width", RLK_MLP_MAX_WIDTH, width) != 0)
        return bad(p, RLK_E_PROTOCOL, "%s", "a second or malformed State op");
    q->kind = OP_STATE;
    return RLK_OK;
}

/* Field `key` of cell op o: a parameter [rows, cols] (cols 0: a vector of rows floats). */
static int cell_param(parser *p, int o, const char *key, size_t rows, size_t cols) {
    int i = param_field(p, o, key, cols ? rows * cols : rows);
    return i >= 0 && p->m->params[i].rows == (cols ? rows : 1) ? i : -1;
}

/* Recurrent (one per network, reading the State): lstm [h | c] of 2H columns or gru [h] of H,
 * weight_ih [G*H, F], weight_hh [G*H, H], bias_ih and bias_hh [G*H] (PyTorch's layout). */
static rlk_status read_cell(parser *p, int o, op *q, size_t *width) {
    char cell[8] = "";
    str_field(p, o, "cell", cell, sizeof cell);
    if (strcmp(cell, "lstm") != 0 && strcmp(cell, "gru") != 0) return bad(p, RLK_E_UNSUPPORTED, "recurrent cell %s", cell);
    q->kind = cell[0] == 'l' ? OP_LSTM : OP_GRU;
    size_t g = q->kind == OP_LSTM ? 4 : 3;
    q->x = value_field(p, o, "x");
    q->state = value_field(p, o, "state");
    if (p->m->state_out >= 0 || q->x < 0 || q->state != p->m->state_in || q->state < 0 ||
        size_field(p, o, "size", RLK_MLP_MAX_WIDTH / 4, &q->hidden) != 0 || q->hidden < 1)
        return bad(p, RLK_E_PROTOCOL, "%s", "a second Recurrent op, or one without its input, State or size");
    size_t h = q->hidden;
    *width = q->kind == OP_LSTM ? 2 * h : h;
    q->p1 = cell_param(p, o, "weight_ih", g * h, width_of(p->m, q->x));
    q->p3 = cell_param(p, o, "weight_hh", g * h, h);
    q->p2 = cell_param(p, o, "bias_ih", g * h, 0);
    q->p4 = cell_param(p, o, "bias_hh", g * h, 0);
    if (q->p1 < 0 || q->p2 < 0 || q->p3 < 0 || q->p4 < 0 || width_of(p->m, q->state) != *width)
        return bad(p, RLK_E_PROTOCOL, "%s", "a Recurrent op whose parameters or state do not fit its sizes");
    p->m->gate_floats = 2 * g * h;
    return RLK_OK;
}

/* Elementwise ops and the column ops: Flatten, Normalize, Act, Slice, Clip, Tile. */
static rlk_status read_unary(parser *p, int o, const char *kind, op *q, size_t *width) {
    double low, high;
    if ((q->x = value_field(p, o, "x")) < 0) return bad(p, RLK_E_PROTOCOL, "%s op reads an unknown value", kind);
    *width = width_of(p->m, q->x);
    if (strcmp(kind, "Flatten") == 0) {
        q->kind = OP_FLATTEN;
    } else if (strcmp(kind, "Normalize") == 0) {
        q->kind = OP_NORMALIZE;
        q->p1 = param_field(p, o, "mean", *width);
        q->p2 = param_field(p, o, "std", *width);
        if (q->p1 < 0 || q->p2 < 0) return bad(p, RLK_E_PROTOCOL, "%s", "a Normalize op without matching statistics");
    } else if (strcmp(kind, "Act") == 0) {
        char act[8] = "";
        str_field(p, o, "kind", act, sizeof act);
        if (strcmp(act, "tanh") != 0 && strcmp(act, "relu") != 0) return bad(p, RLK_E_UNSUPPORTED, "activation %s", act);
        q->kind = act[0] == 't' ? OP_TANH : OP_RELU;
    } else if (strcmp(kind, "Slice") == 0) {
        q->kind = OP_SLICE;
        if (size_field(p, o, "start", *width, &q->start) || size_field(p, o, "stop", *width, &q->stop) || q->start >= q->stop)
            return bad(p, RLK_E_PROTOCOL, "%s", "a Slice op out of range");
        *width = q->stop - q->start;
    } else if (strcmp(kind, "Clip") == 0) {
        int lo = rlk_json_get(p->s, p->t, o, "low"), hi = rlk_json_get(p->s, p->t, o, "high");
        q->kind = OP_CLIP;
        if (lo < 0 || hi < 0 || rlk_json_num(p->s, &p->t[lo], &low) || rlk_json_num(p->s, &p->t[hi], &high) || !(low <= high))
            return bad(p, RLK_E_PROTOCOL, "%s", "a Clip op without bounds");
        q->low = (float)low;
        q->high = (float)high;
    } else {  /* Tile */
        q->kind = OP_TILE;
        if ((q->p1 = param_field(p, o, "param", 0)) < 0 || p->m->params[q->p1].rows != 1)
            return bad(p, RLK_E_PROTOCOL, "%s", "a Tile op without its parameter");
        *width = p->m->params[q->p1].size;
    }
    return RLK_OK;
}

static rlk_status read_op(parser *p, int o) {
    rlk_mlp *m = p->m;
    op *q = &m->ops[m->n_ops];
    char kind[16] = "";
    size_t width = 0;
    rlk_status st;
    memset(q, 0, sizeof *q);
    q->x = q->p1 = q->p2 = q->p3 = q->p4 = q->state = -1;
    if (p->t[o].type != RLK_J_OBJECT || str_field(p, o, "op", kind, sizeof kind) != 0)
        return bad(p, RLK_E_PROTOCOL, "%s", "a malformed op");
    if (strcmp(kind, "Input") == 0) {
        q->kind = OP_INPUT;
        st = read_input(p, o, q, &width);
    } else if (strcmp(kind, "Linear") == 0) {
        q->kind = OP_LINEAR;
        st = read_linear(p, o, q, &width);
    } else if (strcmp(kind, "Concat") == 0) {
        q->kind = OP_CONCAT;
        st = read_concat(p, o, q, &width);
    } else if (!strcmp(kind, "Flatten") || !strcmp(kind, "Normalize") || !strcmp(kind, "Act") ||
               !strcmp(kind, "Slice") || !strcmp(kind, "Clip") || !strcmp(kind, "Tile")) {
        st = read_unary(p, o, kind, q, &width);
    } else if (strcmp(kind, "State") == 0) {
        st = read_state(p, o, q, &width);
    } else if (strcmp(kind, "Recurrent") == 0) {
        st = read_cell(p, o, q, &width);
    } else {
        return bad(p, RLK_E_UNSUPPORTED, "the policy network uses op %s, which the C client does not run "
                   "(use server-side inference)", kind);
    }
    if (st != RLK_OK) return st;
    value *v = &m->values[m->n_values];
    if (str_field(p, o, "out", v->name, sizeof v->name) != 0 || find_value(m, v->name) >= 0 || width < 1 ||
        width > RLK_MLP_MAX_WIDTH)
        return bad(p, RLK_E_PROTOCOL, "%s", "an op output without a fresh name or a usable width");
    v->width = width;
    q->out = m->n_values++;
    if (q->kind == OP_INPUT) m->input = q->out;
    if (q->kind == OP_STATE) m->state_in = q->out;
    if (q->kind == OP_LSTM || q->kind == OP_GRU) m->state_out = q->out;
    m->n_ops++;
    return RLK_OK;
}

static rlk_status read_ops(parser *p, int arr) {
    if (arr < 0 || p->t[arr].type != RLK_J_ARRAY || p->t[arr].count < 1)
        return bad(p, RLK_E_PROTOCOL, "%s", "the network has no op list");
    if (p->t[arr].count > RLK_MLP_MAX_OPS) return bad(p, RLK_E_LIMIT, "%s", "the network has too many ops");
    for (int k = 0, i = arr + 1; k < p->t[arr].count; k++, i = p->t[i].next) {
        rlk_status st = read_op(p, i);
        if (st != RLK_OK) return st;
    }
    p->m->output = find_value(p->m, RLK_DIST_NAME);
    if (p->m->input < 0 || p->m->output < 0 || width_of(p->m, p->m->output) != p->m->dist_size)
        return bad(p, RLK_E_PROTOCOL, "%s", "the network does not map the observation to the distribution inputs");
    if ((p->m->state_in >= 0) != (p->m->state_out >= 0))
        return bad(p, RLK_E_PROTOCOL, "%s", "the network has a State without its Recurrent cell (or the reverse)");
    return RLK_OK;
}

/* One scratch block per value, max_rows rows each, then the recurrent cell's gates. */
static rlk_status make_scratch(parser *p) {
    rlk_mlp *m = p->m;
    size_t total = 0;
    for (int i = 0; i <= m->n_values; i++) {
        size_t width = i < m->n_values ? m->values[i].width : m->gate_floats;
        if (i < m->n_values) m->values[i].scratch = total;
        total += (size_t)m->max_rows * width;
        if (total > RLK_MLP_MAX_SCRATCH_FLOATS)
            return bad(p, RLK_E_LIMIT, "%s", "the network's values for max_agents rows exceed RLK_MLP_MAX_SCRATCH_FLOATS");
    }
    m->gates = total - (size_t)m->max_rows * m->gate_floats;
    m->scratch = malloc(total * sizeof(float));
    return m->scratch ? RLK_OK : RLK_E_NOMEM;
}

static uint64_t fnv1a(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

rlk_status rlk_mlp_parse(const char *s, const rlk_jtok *toks, int network, size_t obs_size, size_t dist_size,
                         int max_rows, rlk_mlp **out, char *err, size_t cap) {
    *out = NULL;
    if (network < 0 || toks[network].type != RLK_J_OBJECT) {
        snprintf(err, cap, "%s", "the daemon sent no network description (an older rlinkd?)");
        return RLK_E_UNSUPPORTED;
    }
    rlk_mlp *m = calloc(1, sizeof *m);
    if (!m || !(m->values = calloc(RLK_MLP_MAX_OPS, sizeof *m->values))) {
        free(m);
        return RLK_E_NOMEM;
    }
    parser p = {s, toks, m, err, cap};
    m->input = m->output = m->state_in = m->state_out = -1;
    m->obs_size = obs_size;
    m->dist_size = dist_size;
    m->max_rows = max_rows;
    m->fingerprint = fnv1a(s + toks[network].start, (size_t)toks[network].len);
    rlk_status st = read_params(&p, rlk_json_get(s, toks, network, "params"));
    if (st == RLK_OK) st = read_ops(&p, rlk_json_get(s, toks, network, "ops"));
    if (st == RLK_OK) st = make_scratch(&p);
    if (st != RLK_OK) {
        rlk_mlp_free(m);
        return st;
    }
    *out = m;
    return RLK_OK;
}

void rlk_mlp_free(rlk_mlp *m) {
    if (!m) return;
    free(m->values);
    free(m->scratch);
    free(m);
}

size_t rlk_mlp_n_params(const rlk_mlp *m) { return m->n_floats; }

size_t rlk_mlp_state_width(const rlk_mlp *m) { return m->state_in >= 0 ? m->values[m->state_in].width : 0; }

int rlk_mlp_same(const rlk_mlp *a, const rlk_mlp *b) {
    return a->fingerprint == b->fingerprint && a->n_floats == b->n_floats && a->n_ops == b->n_ops &&
           a->obs_size == b->obs_size && a->dist_size == b->dist_size && rlk_mlp_state_width(a) == rlk_mlp_state_width(b);
}

/* ------------------------------------------------------------------ forward */
/* y[n, out] = x[n, in] W^T + b, W [out, in] row-major; rows of x are x_stride floats apart. */
static void linear(const float *x, size_t x_stride, const float *w, const float *b, size_t in, size_t out_w, int n,
                   float *y) {
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * x_stride;
        float *yr = y + (size_t)r * out_w;
        for (size_t o = 0; o < out_w; o++) {
            const float *wo = w + o * in;
            float acc = b[o];
            for (size_t i = 0; i < in; i++) acc += wo[i] * xr[i];
            yr[o] = acc;
        }
    }
}

static float *at(rlk_mlp *m, int v) { return m->scratch + m->values[v].scratch; }

/* Copy columns [start, start + w) of x (width xw) into y (width yw) at column y0. */
static void copy_cols(const float *x, size_t xw, size_t start, size_t w, float *y, size_t yw, size_t y0, int n) {
    for (int r = 0; r < n; r++) memcpy(y + (size_t)r * yw + y0, x + (size_t)r * xw + start, w * sizeof(float));
}

static float sigmoid(float x) { return 0.5f * (tanhf(0.5f * x) + 1.0f); }  /* (overflow-free) */

/* LSTM rows: gi, gh [n, 4H] (gate blocks i, f, g, o), state and y [n, 2H] = [h | c]. */
static void lstm_rows(const float *gi, const float *gh, const float *state, size_t h, int n, float *y) {
    for (int r = 0; r < n; r++) {
        const float *a = gi + (size_t)r * 4 * h, *b = gh + (size_t)r * 4 * h, *c = state + (size_t)r * 2 * h + h;
        float *yr = y + (size_t)r * 2 * h;
        for (size_t k = 0; k < h; k++) {
            float i = sigmoid(a[k] + b[k]), f = sigmoid(a[h + k] + b[h + k]);
            float g = tanhf(a[2 * h + k] + b[2 * h + k]), o = sigmoid(a[3 * h + k] + b[3 * h + k]);
            yr[h + k] = f * c[k] + i * g;
            yr[k] = o * tanhf(yr[h + k]);
        }
    }
}

/* GRU rows: gi, gh [n, 3H] (gate blocks r, z, n), state and y [n, H] = [h]. */
static void gru_rows(const float *gi, const float *gh, const float *state, size_t h, int n, float *y) {
    for (int r = 0; r < n; r++) {
        const float *a = gi + (size_t)r * 3 * h, *b = gh + (size_t)r * 3 * h, *hp = state + (size_t)r * h;
        float *yr = y + (size_t)r * h;
        for (size_t k = 0; k < h; k++) {
            float reset = sigmoid(a[k] + b[k]), z = sigmoid(a[h + k] + b[h + k]);
            float cand = tanhf(a[2 * h + k] + reset * b[2 * h + k]);
            yr[k] = (1.0f - z) * cand + z * hp[k];
        }
    }
}

/* One step of the cell (recurrent.py's maths): the gates x W_ih^T + b_ih and h W_hh^T + b_hh
 * (h: the state's first H columns), then the new state. */
static void run_cell(rlk_mlp *m, const op *q, const float *wt, int n) {
    size_t h = q->hidden, g = q->kind == OP_LSTM ? 4 * h : 3 * h, xw = m->values[q->x].width;
    size_t sw = m->values[q->state].width;
    float *gi = m->scratch + m->gates, *gh = gi + (size_t)n * g, *state = at(m, q->state);
    linear(at(m, q->x), xw, wt + m->params[q->p1].offset, wt + m->params[q->p2].offset, xw, g, n, gi);
    linear(state, sw, wt + m->params[q->p3].offset, wt + m->params[q->p4].offset, h, g, n, gh);
    if (q->kind == OP_LSTM) lstm_rows(gi, gh, state, h, n, at(m, q->out));
    else gru_rows(gi, gh, state, h, n, at(m, q->out));
}

static void run_op(rlk_mlp *m, const op *q, const float *wt, int n) {
    size_t w = m->values[q->out].width, xw = q->x >= 0 ? m->values[q->x].width : 0, total = (size_t)n * w;
    float *y = at(m, q->out);
    const float *x = q->x >= 0 ? at(m, q->x) : NULL;
    const param *a = q->p1 >= 0 ? &m->params[q->p1] : NULL, *b = q->p2 >= 0 ? &m->params[q->p2] : NULL;
    switch (q->kind) {
    case OP_INPUT: break;  /* (the observation was copied in) */
    case OP_FLATTEN: memcpy(y, x, total * sizeof(float)); break;
    case OP_NORMALIZE:
        for (size_t k = 0; k < total; k++) y[k] = (x[k] - wt[a->offset + k % w]) / wt[b->offset + k % w];
        break;
    case OP_LINEAR: linear(x, xw, wt + a->offset, wt + b->offset, xw, w, n, y); break;
    case OP_TANH: for (size_t k = 0; k < total; k++) y[k] = tanhf(x[k]); break;
    case OP_RELU: for (size_t k = 0; k < total; k++) y[k] = x[k] > 0.0f ? x[k] : 0.0f; break;
    case OP_SLICE: copy_cols(x, xw, q->start, w, y, w, 0, n); break;
    case OP_TILE: for (int r = 0; r < n; r++) memcpy(y + (size_t)r * w, wt + a->offset, w * sizeof(float)); break;
    case OP_CLIP:
        for (size_t k = 0; k < total; k++) y[k] = x[k] < q->low ? q->low : x[k] > q->high ? q->high : x[k];
        break;
    case OP_CONCAT:
        for (int i = 0, col = 0; i < q->n_xs; col += (int)m->values[q->xs[i]].width, i++)
            copy_cols(at(m, q->xs[i]), m->values[q->xs[i]].width, 0, m->values[q->xs[i]].width, y, w, (size_t)col, n);
        break;
    case OP_STATE: break;  /* (the state was copied in) */
    case OP_LSTM: case OP_GRU: run_cell(m, q, wt, n); break;
    }
}

void rlk_mlp_forward(rlk_mlp *m, const float *weights, const float *obs, const float *state_in, int n, float *dist,
                     float *state_out) {
    size_t s = rlk_mlp_state_width(m);
    memcpy(at(m, m->input), obs, (size_t)n * m->obs_size * sizeof(float));
    if (s) memcpy(at(m, m->state_in), state_in, (size_t)n * s * sizeof(float));
    for (int i = 0; i < m->n_ops; i++) run_op(m, &m->ops[i], weights, n);
    memcpy(dist, at(m, m->output), (size_t)n * m->dist_size * sizeof(float));
    if (s) memcpy(state_out, at(m, m->state_out), (size_t)n * s * sizeof(float));
}
