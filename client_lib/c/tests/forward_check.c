/*
 * forward_check.c - the C client's actor and action choice on inputs from a file, for the test
 * that they agree with Python's (tests/unit/test_c_forward.py builds and runs this).
 *
 *     forward_check CASE.json
 *
 * CASE.json: {"network": {...}, "weights": [...], "obs": [rows * obs_size], "rows": N,
 *             "obs_size": O, "act_size": A, "samples": K, "epsilon": e (-1: none), "seed": S,
 *             "state": [rows * S] (a recurrent network's state_in; absent: feed-forward)}
 * Prints one JSON object: "dist" (N * D, the actor's outputs), "greedy" and "greedy_logp" (per
 * row), "sampled" and "sampled_logp" (K draws for row 0), and with a state "state_out"
 * (N * S). Exit 3 with the reason on stderr when the network or distribution is refused (its
 * rlk_status name first).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlk_dist.h"
#include "rlk_json.h"
#include "rlk_mlp.h"

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return s;
}

static double num(const char *s, const rlk_jtok *t, int obj, const char *key) {
    double v = 0;
    int i = rlk_json_get(s, t, obj, key);
    if (i >= 0) rlk_json_num(s, &t[i], &v);
    return v;
}

static float *floats(const char *s, const rlk_jtok *t, int obj, const char *key, size_t *n) {
    int arr = rlk_json_get(s, t, obj, key);
    *n = arr >= 0 ? (size_t)t[arr].count : 0;
    float *out = calloc(*n + 1, sizeof(float));
    for (int k = 0, i = arr + 1; out && k < (int)*n; k++, i = t[i].next) {
        double v;
        rlk_json_num(s, &t[i], &v);
        out[k] = (float)v;
    }
    return out;
}

static void print_floats(const char *key, const float *x, size_t n, int last) {
    printf("\"%s\": [", key);
    for (size_t i = 0; i < n; i++) printf(i ? ", %.9g" : "%.9g", (double)x[i]);
    printf(last ? "]" : "], ");
}

int main(int argc, char **argv) {
    size_t len, nw, no, ns;
    char err[256] = "";
    char *s = argc == 2 ? slurp(argv[1], &len) : NULL;
    int max_toks = s ? (int)(len / 2 + 64) : 0;
    rlk_jtok *t = s ? calloc((size_t)max_toks, sizeof *t) : NULL;
    if (!t || rlk_json_parse(s, len, t, max_toks) < 1) return 2;
    int rows = (int)num(s, t, 0, "rows"), samples = (int)num(s, t, 0, "samples");
    size_t obs_size = (size_t)num(s, t, 0, "obs_size"), act_size = (size_t)num(s, t, 0, "act_size");
    int network = rlk_json_get(s, t, 0, "network"), dist_arr = rlk_json_get(s, t, network, "dist");
    size_t dist_size = (size_t)num(s, t, 0, "dist_size");
    rlk_mlp *m = NULL;
    rlk_dist *d = NULL;
    rlk_status st = rlk_mlp_parse(s, t, network, obs_size, dist_size, rows, &m, err, sizeof err);
    if (st == RLK_OK) st = rlk_dist_parse(s, t, dist_arr, dist_size, act_size, &d, err, sizeof err);
    if (st != RLK_OK) {
        fprintf(stderr, "%s: %s\n", rlk_status_name(st), err);
        if (m) rlk_mlp_free(m);
        free(t);
        free(s);
        return 3;
    }
    float *weights = floats(s, t, 0, "weights", &nw), *obs = floats(s, t, 0, "obs", &no);
    float *state = floats(s, t, 0, "state", &ns), *state_out = calloc(ns + 1, sizeof(float));
    if (nw != rlk_mlp_n_params(m) || no != (size_t)rows * obs_size || ns != (size_t)rows * rlk_mlp_state_width(m)) return 2;
    float *dist = calloc((size_t)rows * dist_size, sizeof(float)), *act = calloc(act_size * (size_t)(rows + samples), sizeof(float));
    float *logp = calloc((size_t)(rows + samples), sizeof(float));
    rlk_rng rng;
    rlk_rng_seed(&rng, (uint64_t)num(s, t, 0, "seed"));
    rlk_mlp_forward(m, weights, obs, state, rows, dist, state_out);
    for (int r = 0; r < rows; r++) rlk_dist_choose(d, dist + (size_t)r * dist_size, 0, -1.0, &rng, act + (size_t)r * act_size, &logp[r]);
    for (int k = 0; k < samples; k++)
        rlk_dist_choose(d, dist, 1, num(s, t, 0, "epsilon"), &rng, act + (size_t)(rows + k) * act_size, &logp[rows + k]);
    printf("{");
    print_floats("dist", dist, (size_t)rows * dist_size, 0);
    print_floats("greedy", act, (size_t)rows * act_size, 0);
    print_floats("greedy_logp", logp, (size_t)rows, 0);
    print_floats("sampled", act + (size_t)rows * act_size, (size_t)samples * act_size, 0);
    print_floats("sampled_logp", logp + rows, (size_t)samples, ns == 0);
    if (ns) print_floats("state_out", state_out, ns, 1);
    printf("}\n");
    rlk_mlp_free(m);
    rlk_dist_free(d);
    free(weights);
    free(obs);
    free(state);
    free(state_out);
    free(dist);
    free(act);
    free(logp);
    free(t);
    free(s);
    return 0;
}
