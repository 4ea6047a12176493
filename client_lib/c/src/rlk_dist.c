/* rlk_dist.c - action selection on the client (contract in rlk_dist.h). */
#include "rlk_dist.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LOG_2PI 1.8378770664093453
#define LOG_2 0.6931471805599453
#define SQUASH_EDGE (1.0 - 1e-6)
#define PI 3.141592653589793

enum { CATEGORICAL, GAUSSIAN, SQUASHED };

typedef struct {
    int kind;
    size_t dist, width, action;
    double *low, *high;  /* [width] (Gaussians only; +-HUGE_VAL for an infinite bound) */
} component;

struct rlk_dist {
    component comps[RLK_DIST_MAX_COMPONENTS];
    int n;
};

/* ------------------------------------------------------------------ random numbers */
static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void rlk_rng_seed(rlk_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_u64(rlk_rng *r) {
    uint64_t *s = r->s, out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

double rlk_rng_uniform(rlk_rng *r) { return (double)(next_u64(r) >> 11) * 0x1.0p-53; }

double rlk_rng_normal(rlk_rng *r) {  /* Box-Muller (one of the pair) */
    double u = 1.0 - rlk_rng_uniform(r), v = rlk_rng_uniform(r);
    return sqrt(-2.0 * log(u)) * cos(2.0 * PI * v);
}

/* ------------------------------------------------------------------ parsing */
static int size_of(const char *s, const rlk_jtok *toks, int obj, const char *key, size_t max, size_t *out) {
    double v;
    int t = rlk_json_get(s, toks, obj, key);
    if (t < 0 || rlk_json_num(s, &toks[t], &v) != 0 || !(v >= 0 && v <= (double)max) || v != floor(v)) return -1;
    *out = (size_t)v;
    return 0;
}

/* A bounds array of width numbers (null: infinite, sign as given) into a new array. */
static double *bounds(const char *s, const rlk_jtok *toks, int obj, const char *key, size_t width, double inf) {
    int arr = rlk_json_get(s, toks, obj, key);
    if (arr < 0 || toks[arr].type != RLK_J_ARRAY || (size_t)toks[arr].count != width) return NULL;
    double *out = malloc(width * sizeof *out);
    for (int k = 0, i = arr + 1; out && k < toks[arr].count; k++, i = toks[i].next) {
        if (toks[i].type == RLK_J_NULL) {
            out[k] = inf;
        } else if (rlk_json_num(s, &toks[i], &out[k]) != 0) {
            free(out);
            return NULL;
        }
    }
    return out;
}

static int read_component(const char *s, const rlk_jtok *toks, int obj, component *c, size_t dist_size,
                          size_t act_size) {
    char kind[24] = "";
    int k = rlk_json_get(s, toks, obj, "kind");
    if (k < 0 || toks[obj].type != RLK_J_OBJECT || rlk_json_str(s, &toks[k], kind, sizeof kind) != 0) return -1;
    c->kind = !strcmp(kind, "categorical") ? CATEGORICAL : !strcmp(kind, "gaussian") ? GAUSSIAN
            : !strcmp(kind, "squashed_gaussian") ? SQUASHED : -1;
    if (c->kind < 0) return -2;
    if (size_of(s, toks, obj, "dist", dist_size, &c->dist) || size_of(s, toks, obj, "width", dist_size, &c->width) ||
        size_of(s, toks, obj, "action", act_size, &c->action) || c->width < 1)
        return -1;
    size_t dist_end = c->dist + (c->kind == CATEGORICAL ? 1 : 2) * c->width;
    size_t act_end = c->action + (c->kind == CATEGORICAL ? 1 : c->width);
    if (dist_end > dist_size || act_end > act_size) return -1;
    if (c->kind == CATEGORICAL) return 0;
    c->low = bounds(s, toks, obj, "low", c->width, -HUGE_VAL);
    c->high = bounds(s, toks, obj, "high", c->width, HUGE_VAL);
    if (!c->low || !c->high) return -1;
    for (size_t i = 0; i < c->width; i++)
        if (!(c->low[i] <= c->high[i]) || (c->kind == SQUASHED && !isfinite(c->high[i] - c->low[i]))) return -1;
    return 0;
}

rlk_status rlk_dist_parse(const char *s, const rlk_jtok *toks, int arr, size_t dist_size, size_t act_size,
                          rlk_dist **out, char *err, size_t cap) {
    *out = NULL;
    if (arr < 0 || toks[arr].type != RLK_J_ARRAY || toks[arr].count < 1 || toks[arr].count > RLK_DIST_MAX_COMPONENTS) {
        snprintf(err, cap, "%s", "the network description has no usable action distribution");
        return RLK_E_PROTOCOL;
    }
    rlk_dist *d = calloc(1, sizeof *d);
    if (!d) return RLK_E_NOMEM;
    for (int k = 0, i = arr + 1; k < toks[arr].count; k++, i = toks[i].next) {
        int r = read_component(s, toks, i, &d->comps[k], dist_size, act_size);
        d->n = k + 1;
        if (r != 0) {
            snprintf(err, cap, "%s", r == -2 ? "an action distribution the C client does not sample (MultiBinary?)"
                                             : "a malformed action distribution component");
            rlk_dist_free(d);
            return r == -2 ? RLK_E_UNSUPPORTED : RLK_E_PROTOCOL;
        }
    }
    *out = d;
    return RLK_OK;
}

void rlk_dist_free(rlk_dist *d) {
    if (!d) return;
    for (int k = 0; k < d->n; k++) {
        free(d->comps[k].low);
        free(d->comps[k].high);
    }
    free(d);
}

int rlk_dist_single_categorical(const rlk_dist *d) { return d->n == 1 && d->comps[0].kind == CATEGORICAL; }

/* ------------------------------------------------------------------ choosing */
static double softplus(double x) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }

/* A categorical over logits x[w]: the chosen index and its log-probability. */
static double categorical(const float *x, size_t w, int explore, rlk_rng *rng, size_t *pick) {
    size_t best = 0;
    double total = 0.0;
    for (size_t i = 1; i < w; i++)
        if (x[i] > x[best]) best = i;
    for (size_t i = 0; i < w; i++) total += exp((double)x[i] - x[best]);
    *pick = best;
    if (explore) {
        double u = rlk_rng_uniform(rng) * total, cum = 0.0;
        for (*pick = 0; *pick + 1 < w; ++*pick) {
            cum += exp((double)x[*pick] - x[best]);
            if (u < cum) break;
        }
    }
    return (double)x[*pick] - x[best] - log(total);
}

/* Epsilon-greedy over Q-values x[w] (every action legal): index and the mixture's log-prob. */
static double epsilon_greedy(const float *x, size_t w, double epsilon, rlk_rng *rng, size_t *pick) {
    size_t best = 0;
    for (size_t i = 1; i < w; i++)
        if (x[i] > x[best]) best = i;
    size_t uniform = (size_t)floor(rlk_rng_uniform(rng) * (double)w);
    *pick = rlk_rng_uniform(rng) < epsilon ? (uniform < w ? uniform : w - 1) : best;
    return log(epsilon / (double)w + (1.0 - epsilon) * (*pick == best));
}

static double gaussian_logp(double z, double log_std) { return -0.5 * z * z - log_std - 0.5 * LOG_2PI; }

static double clip(double v, double lo, double hi) { return v < lo ? lo : v > hi ? hi : v; }

/* A Gaussian (clipped or squashed) component: writes its action columns, returns its log-prob. */
static double gaussian(const component *c, const float *dist, int explore, rlk_rng *rng, float *action) {
    double logp = 0.0;
    for (size_t i = 0; i < c->width; i++) {
        double mean = dist[c->dist + i], log_std = dist[c->dist + c->width + i];
        double u = explore ? mean + exp(log_std) * rlk_rng_normal(rng) : mean;
        double lo = c->low[i], hi = c->high[i];
        if (c->kind == GAUSSIAN) {
            float a = (float)clip(u, lo, hi);
            action[c->action + i] = a;
            logp += gaussian_logp(((double)a - mean) / exp(log_std), log_std);
            continue;
        }
        float a = (float)(lo + (tanh(u) + 1.0) * 0.5 * (hi - lo));
        double v = atanh(clip(2.0 * ((double)a - lo) / (hi - lo) - 1.0, -SQUASH_EDGE, SQUASH_EDGE));
        action[c->action + i] = a;
        logp += gaussian_logp((v - mean) / exp(log_std), log_std)
                - (log(0.5 * (hi - lo)) + 2.0 * (LOG_2 - v - softplus(-2.0 * v)));
    }
    return logp;
}

void rlk_dist_choose(const rlk_dist *d, const float *dist, int explore, double epsilon, rlk_rng *rng,
                     float *action, float *logp) {
    double total = 0.0;
    for (int k = 0; k < d->n; k++) {
        const component *c = &d->comps[k];
        size_t pick;
        if (c->kind != CATEGORICAL) {
            total += gaussian(c, dist, explore, rng, action);
            continue;
        }
        if (explore && epsilon >= 0.0 && d->n == 1) total += epsilon_greedy(dist + c->dist, c->width, epsilon, rng, &pick);
        else total += categorical(dist + c->dist, c->width, explore, rng, &pick);
        action[c->action] = (float)pick;
    }
    *logp = (float)total;
}
