/*
 * local_loop.c - the C client's client-side act + record loop alone, without a daemon: the
 * rlk_local that rlk_client runs for `--inference client` over shared memory (its batched
 * forward, action draw, state carry and record staging), on a network and weights read from
 * a case file, for bench/scenarios/c_local.py.
 *
 *     local_loop CASE.json SECONDS
 *
 * CASE.json: {"network": {...} (netops.network_json), "weights": [...], "obs_size": O,
 *             "act_size": A, "dist_size": D, "act_n": N (Discrete), "max_seq_len": L,
 *             "env_steps_per_sample": K, "episode_steps": E, "obs": [M * O] (a cycle of
 *             observations), "seed": S}
 * One agent: act, step (reward 1, truncated every E steps), and at each sample (K steps) the
 * fragments cut and the staged records dropped where rlk_client writes them into the ring
 * and waits for WEIGHTS_READY (no daemon here: no ring, no board). Runs for about SECONDS
 * after a warm-up of one sample and prints {"steps_per_s": ..., "steps": ...}.
 * rlk_local.c is compiled into this file (its attachment is set up here without a socket);
 * the rest of the client comes from librlinkd.a.
 */
#include "rlk_local.c"

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

static double num(const char *s, const rlk_jtok *t, const char *key) {
    double v = 0;
    int i = rlk_json_get(s, t, 0, key);
    if (i >= 0) rlk_json_num(s, &t[i], &v);
    return v;
}

static float *floats(const char *s, const rlk_jtok *t, const char *key, size_t *n) {
    int arr = rlk_json_get(s, t, 0, key);
    *n = arr >= 0 ? (size_t)t[arr].count : 0;
    float *out = calloc(*n + 1, sizeof(float));
    for (int k = 0, i = arr + 1; out && k < (int)*n; k++, i = t[i].next) {
        double v;
        rlk_json_num(s, &t[i], &v);
        out[k] = (float)v;
    }
    return out;
}

/* l attached to the case's network and weights as rlk_local_attach would leave it (no ring, no board). */
static rlk_status attach_case(rlk_local *l, const char *s, const rlk_jtok *t, char *err, size_t cap) {
    size_t dist_size = (size_t)num(s, t, "dist_size"), nw;
    int network = rlk_json_get(s, t, 0, "network");
    rlk_attached a = {.env_steps_per_sample = (long)num(s, t, "env_steps_per_sample"),
                      .max_seq_len = (long)num(s, t, "max_seq_len")};
    rlk_status st = rlk_mlp_parse(s, t, network, l->sp.obs_size, dist_size, l->max_agents, &a.mlp, err, cap);
    if (st == RLK_OK)
        st = rlk_dist_parse(s, t, rlk_json_get(s, t, network, "dist"), dist_size, l->sp.act_size, &a.dist, err, cap);
    if (st != RLK_OK) return st;
    a.layout = rlk_layout_flat(l->sp.obs_size, l->sp.act_size, dist_size, rlk_mlp_state_width(a.mlp));
    if ((st = adopt(l, &a, 1u << 20, err, cap)) != RLK_OK) return st;
    float *w = floats(s, t, "weights", &nw);
    if (!w || nw != rlk_mlp_n_params(l->at.mlp)) {
        snprintf(err, cap, "weights: %zu floats, the network has %zu", nw, rlk_mlp_n_params(l->at.mlp));
        free(w);
        return RLK_E_ARG;
    }
    memcpy(l->weights, w, nw * sizeof(float));
    free(w);
    l->weights_seq = 0;
    return RLK_OK;
}

/* Steps of the loop until the first sample after `until` (rlk_now clock); obs cycles through
 * the case's m observations. Returns -1 on a refused call (none is expected). */
static long run_loop(rlk_local *l, const float *obs, size_t m, long episode_steps, double until) {
    size_t os = l->sp.obs_size, at = 0;
    float action[8], reward = 1.0f;
    unsigned char term = 0, trunc = 0;
    long steps = 0;
    int due, ended;
    for (;;) {  /* (rlk_client's rlk_act, then rlk_step: outcomes staged, sample, next actions) */
        if (rlk_local_act(l, 1, obs + at * os, action) != RLK_OK) return -1;
        at = (at + 1) % m;
        trunc = (unsigned char)(++steps % episode_steps == 0);
        if (!rlk_local_room(l, 1)) return -1;  /* (a sample is far below the room) */
        if (rlk_local_step(l, 1, &reward, obs + at * os, &term, &trunc, &due, &ended) != RLK_OK) return -1;
        if (due) {  /* rlk_client: cut, write into the ring, SAMPLE_READY / WEIGHTS_READY */
            rlk_local_cut(l);
            rlk_local_drop(l);
        }
        rlk_local_next(l, 1);
        if (due && rlk_now() > until) return steps;
    }
}

int main(int argc, char **argv) {
    size_t len, no;
    char err[256] = "";
    char *s = argc == 3 ? slurp(argv[1], &len) : NULL;
    int max_toks = s ? (int)(len / 2 + 64) : 0;
    rlk_jtok *t = s ? calloc((size_t)max_toks, sizeof *t) : NULL;
    if (!t || rlk_json_parse(s, len, t, max_toks) < 1) {
        fprintf(stderr, "usage: local_loop CASE.json SECONDS\n");
        return 2;
    }
    rlk_spaces sp = {.obs_size = (size_t)num(s, t, "obs_size"), .obs_rank = 1, .act_kind = RLK_ACT_DISCRETE,
                     .act_size = (size_t)num(s, t, "act_size"), .act_n = (int)num(s, t, "act_n")};
    sp.obs_shape[0] = (int)sp.obs_size;
    rlk_local *l = NULL;
    rlk_status st = sp.act_size <= 8 ? rlk_local_new(&sp, 1, 0, (uint64_t)num(s, t, "seed"), &l) : RLK_E_ARG;
    if (st == RLK_OK) st = attach_case(l, s, t, err, sizeof err);
    float *obs = floats(s, t, "obs", &no);
    if (st != RLK_OK || !obs || no < sp.obs_size) {
        fprintf(stderr, "%s: %s\n", rlk_status_name(st), err);
        return 3;
    }
    long episode_steps = (long)num(s, t, "episode_steps");
    long steps = run_loop(l, obs, no / sp.obs_size, episode_steps, 0.0);  /* (warm-up: one sample) */
    double t0 = rlk_now();
    if (steps > 0) steps = run_loop(l, obs, no / sp.obs_size, episode_steps, t0 + atof(argv[2]));
    double elapsed = rlk_now() - t0;
    if (steps <= 0) {
        fprintf(stderr, "a call of the loop was refused\n");
        return 4;
    }
    printf("{\"steps_per_s\": %.1f, \"steps\": %ld, \"seconds\": %.4f}\n", (double)steps / elapsed, steps, elapsed);
    rlk_local_free(l);
    free(obs);
    free(t);
    free(s);
    return 0;
}
