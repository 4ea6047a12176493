/* rlk_local.c - client-side inference: episodes, actor, staged records (contract in rlk_local.h). */
#define _POSIX_C_SOURCE 200809L
#include "rlk_local.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rlk_declared.h"  /* RLK_DEFAULT_POLICY */
#include "rlk_net.h"

typedef struct {
    int open, ready;
    long frag_steps;        /* steps staged in its current fragment */
    double ret;             /* evaluation: the episode's return so far */
    long length, seq;
    float logp;
} local_agent;

typedef struct {
    double ret;
    long length, seq;
} eval_episode;

struct rlk_local {
    rlk_spaces sp;
    int max_agents, evaluate;
    rlk_rng rng;
    rlk_attached at;        /* the current attachment's description (mlp, dist: ours) */
    int attached_once;
    rlk_ring *ring;
    rlk_board *board;
    float *weights;         /* [n_params] */
    long weights_seq;
    double epsilon;
    local_agent *agents;
    float *obs, *actions, *dist;   /* [max_agents, O | A | D] */
    float *batch_obs, *batch_dist; /* [max_agents, O | D] scratch of one forward */
    float *states;          /* [4, max_agents, S] (S = 0: feed-forward): next, fed, batch in, batch out */
    float *state_next;      /* each agent's state for its next step (zeros when its episode opens) */
    float *state_fed;       /* ... and the state fed before its current step (the record's) */
    float *batch_state, *batch_state_out;  /* one forward's */
    int *rows;              /* [max_agents] agents of one forward */
    unsigned char *staged;  /* [staging_cap, record_bytes] */
    size_t n_staged, staging_cap;
    long staged_steps, steps_since_sample;
    eval_episode *done;     /* [max_agents] finished evaluation episodes not yet reported */
    int n_done;
};

/* ------------------------------------------------------------------ ATTACHED */
static rlk_status fail(rlk_reply_info *info, rlk_status st, const char *why) {
    snprintf(info->err, info->err_cap, "%s", why);
    return st;
}

static int str_of(const char *s, const rlk_jtok *toks, int key, char *out, size_t cap) {
    return key >= 0 && toks[key].type == RLK_J_STRING && (size_t)toks[key].len < cap ? rlk_json_str(s, &toks[key], out, cap) : -1;
}

/* The record layout of the spaces, the dist inputs and the network's state, checked against ATTACHED's. */
static rlk_status read_layout(const char *s, const rlk_jtok *toks, const rlk_spaces *sp, size_t dist_size,
                              rlk_attached *out, rlk_reply_info *info) {
    out->layout = rlk_layout_flat(sp->obs_size, sp->act_size, dist_size, rlk_mlp_state_width(out->mlp));
    rlk_status st = rlk_layout_check(s, toks, rlk_json_get(s, toks, 0, "layout"), &out->layout);
    return st == RLK_OK ? st : fail(info, st, "ATTACHED's record layout does not match the spaces");
}

/* ATTACHED's additive "state" (recurrent.state_contract): present exactly when the network
 * carries a state; its max_seq_len L places the records' states (fragment steps 0, L, 2L, ...). */
static rlk_status read_state_grid(const char *s, const rlk_jtok *toks, rlk_attached *out, rlk_reply_info *info) {
    int state = rlk_json_get(s, toks, 0, "state"), len = rlk_json_get(s, toks, state, "max_seq_len");
    double l = 0;
    if (state < 0 && !out->layout.state_size) return RLK_OK;
    if (state < 0 || !out->layout.state_size || len < 0 || rlk_json_num(s, &toks[len], &l) != 0 ||
        !(l >= 1 && l <= 1e9) || l != floor(l))
        return fail(info, RLK_E_PROTOCOL, "ATTACHED's \"state\" does not fit the network (a recurrent state and "
                    "a positive integer max_seq_len)");
    out->max_seq_len = (long)l;
    return RLK_OK;
}

rlk_status rlk_parse_attached(const char *s, size_t len, rlk_jtok *toks, int max_toks, const rlk_spaces *sp,
                              int max_rows, rlk_attached *out, rlk_reply_info *info) {
    memset(out, 0, sizeof *out);
    rlk_status st = rlk_parse_typed(s, len, toks, max_toks, RLK_MSG_ATTACHED, info);
    if (st != RLK_OK) return st;
    double steps;
    int env_steps = rlk_json_get(s, toks, 0, "env_steps_per_sample");
    if (str_of(s, toks, rlk_json_get(s, toks, 0, "board_path"), out->board_path, sizeof out->board_path) ||
        str_of(s, toks, rlk_json_get(s, toks, 0, "doorbell_path"), out->doorbell_path, sizeof out->doorbell_path) ||
        env_steps < 0 || rlk_json_num(s, &toks[env_steps], &steps) != 0 || !(steps >= 1 && steps <= 1e9))
        return fail(info, RLK_E_PROTOCOL, "ATTACHED without usable paths or sample size");
    out->env_steps_per_sample = (long)steps;
    if (str_of(s, toks, rlk_json_get(s, toks, 0, "policy"), out->policy, sizeof out->policy) || !out->policy[0])
        snprintf(out->policy, sizeof out->policy, "%s", RLK_DEFAULT_POLICY);
    if (!out->board_path[0])
        return fail(info, RLK_E_UNSUPPORTED, "this policy has no board weights (a frozen model): use server-side inference");
    int network = rlk_json_get(s, toks, 0, "network");
    if (network < 0 || toks[network].type != RLK_J_OBJECT)
        return fail(info, RLK_E_UNSUPPORTED, "ATTACHED without a network description (an older rlinkd?)");
    int dist = network >= 0 ? rlk_json_get(s, toks, network, "dist") : -1;
    size_t dist_size = 0;
    for (int k = 0, i = dist + 1; dist >= 0 && toks[dist].type == RLK_J_ARRAY && k < toks[dist].count; k++, i = toks[i].next) {
        int kind = rlk_json_get(s, toks, i, "kind"), width = rlk_json_get(s, toks, i, "width");
        double w;
        if (kind < 0 || width < 0 || rlk_json_num(s, &toks[width], &w) != 0 || !(w >= 1 && w <= 65536))
            return fail(info, RLK_E_PROTOCOL, "ATTACHED holds a malformed action distribution");
        dist_size += (size_t)w * (rlk_json_str_eq(s, &toks[kind], "categorical") ? 1 : 2);
    }
    st = rlk_mlp_parse(s, toks, network, sp->obs_size, dist_size, max_rows, &out->mlp, info->err, info->err_cap);
    if (st == RLK_OK) st = read_layout(s, toks, sp, dist_size, out, info);
    if (st == RLK_OK) st = read_state_grid(s, toks, out, info);
    if (st == RLK_OK) st = rlk_dist_parse(s, toks, dist, dist_size, sp->act_size, &out->dist, info->err, info->err_cap);
    if (st != RLK_OK) rlk_attached_free(out);
    return st;
}

void rlk_attached_free(rlk_attached *a) {
    rlk_mlp_free(a->mlp);
    rlk_dist_free(a->dist);
    a->mlp = NULL;
    a->dist = NULL;
}

/* ------------------------------------------------------------------ life cycle */
rlk_status rlk_local_new(const rlk_spaces *sp, int max_agents, int evaluate, uint64_t seed, rlk_local **out) {
    rlk_local *l = calloc(1, sizeof *l);
    *out = NULL;
    if (!l) return RLK_E_NOMEM;
    size_t m = (size_t)max_agents;
    l->sp = *sp;
    l->max_agents = max_agents;
    l->evaluate = evaluate;
    l->weights_seq = -1;
    l->epsilon = -1.0;
    rlk_rng_seed(&l->rng, seed);
    l->agents = calloc(m, sizeof *l->agents);
    l->obs = calloc(m * sp->obs_size, sizeof(float));
    l->actions = calloc(m * sp->act_size, sizeof(float));
    l->batch_obs = calloc(m * sp->obs_size, sizeof(float));
    l->rows = calloc(m, sizeof(int));
    l->done = calloc(m, sizeof *l->done);
    if (!l->agents || !l->obs || !l->actions || !l->batch_obs || !l->rows || !l->done) {
        rlk_local_free(l);
        return RLK_E_NOMEM;
    }
    for (size_t i = 0; i < m; i++) l->agents[i].seq = -1;
    *out = l;
    return RLK_OK;
}

void rlk_local_detach(rlk_local *l) {
    rlk_ring_close(l->ring);
    rlk_board_close(l->board);
    l->ring = NULL;
    l->board = NULL;
}

void rlk_local_free(rlk_local *l) {
    if (!l) return;
    rlk_local_detach(l);
    rlk_attached_free(&l->at);
    void *parts[] = {l->agents, l->obs, l->actions, l->dist, l->batch_obs, l->batch_dist, l->rows, l->staged,
                     l->weights, l->done, l->states};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) free(parts[i]);
    free(l);
}

const char *rlk_local_policy(const rlk_local *l) { return l->at.policy; }

/* The buffers sized by the network (first attachment only). The staging area holds at most
 * what the ring does (a sample is written all at once). */
static rlk_status allocate_for(rlk_local *l, size_t ring_capacity, char *err, size_t cap) {
    size_t m = (size_t)l->max_agents, d = l->at.layout.dist_size, rec = l->at.layout.record_bytes;
    size_t ms = m * l->at.layout.state_size;
    size_t by_bytes = RLK_STAGING_BYTES / rec, least = RLK_STAGING_LEAST(m);
    l->staging_cap = l->evaluate ? 0 : by_bytes > least ? by_bytes : least;
    if (l->staging_cap > ring_capacity) l->staging_cap = ring_capacity;
    if (!l->evaluate && l->staging_cap < least) {
        snprintf(err, cap, "%s", "the daemon's ring is too small for max_agents agents");
        return RLK_E_UNSUPPORTED;
    }
    l->dist = calloc(m * d, sizeof(float));
    l->batch_dist = calloc(m * d, sizeof(float));
    l->weights = calloc(rlk_mlp_n_params(l->at.mlp), sizeof(float));
    l->staged = l->staging_cap ? malloc(l->staging_cap * rec) : NULL;
    l->states = calloc(4 * ms + 1, sizeof(float));
    if (l->states) {
        l->state_next = l->states;
        l->state_fed = l->states + ms;
        l->batch_state = l->states + 2 * ms;
        l->batch_state_out = l->states + 3 * ms;
    }
    return l->dist && l->batch_dist && l->weights && l->states && (l->staged || !l->staging_cap) ? RLK_OK : RLK_E_NOMEM;
}

/* Take the parsed ATTACHED: the first one sizes the buffers, later ones must describe the same policy. */
static rlk_status adopt(rlk_local *l, rlk_attached *a, size_t ring_capacity, char *err, size_t cap) {
    if (l->attached_once) {  /* (new paths and sample size; the network must be the same) */
        int same = rlk_mlp_same(l->at.mlp, a->mlp) && a->layout.record_bytes == l->at.layout.record_bytes &&
                   a->max_seq_len == l->at.max_seq_len;
        rlk_mlp *mlp = l->at.mlp;
        rlk_dist *dist = l->at.dist;
        rlk_attached_free(a);
        if (!same) {  /* (l->at stays the first attachment's: the buffers were sized by it) */
            snprintf(err, cap, "%s", "the daemon's policy network changed across a reconnect");
            return RLK_E_UNSUPPORTED;
        }
        l->at = *a;
        l->at.mlp = mlp;
        l->at.dist = dist;
        return RLK_OK;
    }
    l->at = *a;
    memset(a, 0, sizeof *a);
    l->attached_once = 1;
    return allocate_for(l, ring_capacity, err, cap);
}

/* Wait for the learner's first weights (it may still be starting); a readable socket ends it. */
static rlk_status first_weights(rlk_local *l, int sock, double timeout_s, char *err, size_t cap) {
    double deadline = rlk_now() + timeout_s;
    while (rlk_board_latest(l->board) < 0) {
        struct pollfd p = {sock, POLLIN, 0};
        int r = poll(&p, 1, 10);
        if (r > 0 || (r < 0 && errno != EINTR)) {
            snprintf(err, cap, "%s", "the daemon closed the connection (or sent an error) before its first weights");
            return RLK_E_IO;
        }
        if (rlk_now() > deadline) {
            snprintf(err, cap, "%s", "no weights on the daemon's board within io_timeout_s (learner not running?)");
            return RLK_E_TIMEOUT;
        }
    }
    l->weights_seq = rlk_board_read(l->board, l->weights);
    return RLK_OK;
}

rlk_status rlk_local_attach(rlk_local *l, rlk_attached *a, int sock, double timeout_s, rlk_jtok *toks,
                            int max_toks, char *err, size_t cap) {
    int fd = -1;
    rlk_local_detach(l);
    if (rlk_net_recv_fds(sock, &fd, 1, timeout_s) != 0) {
        rlk_attached_free(a);
        snprintf(err, cap, "%s", "no ring descriptor after ATTACHED");
        return RLK_E_PROTOCOL;
    }
    rlk_status st = rlk_ring_attach(fd, a->doorbell_path, &a->layout, toks, max_toks, &l->ring, err, cap);
    if (st != RLK_OK) {
        rlk_attached_free(a);
        return st;
    }
    st = adopt(l, a, rlk_ring_capacity(l->ring), err, cap);
    if (st == RLK_OK) st = rlk_board_attach(l->at.board_path, rlk_mlp_n_params(l->at.mlp), &l->board, err, cap);
    if (st == RLK_OK) st = first_weights(l, sock, timeout_s, err, cap);
    if (st != RLK_OK) rlk_local_detach(l);
    return st;
}

/* ------------------------------------------------------------------ acting */
/* Row `to` of dst = row `from` of src (rows of w floats). */
static void copy_row(float *dst, int to, const float *src, int from, size_t w) {
    memcpy(dst + (size_t)to * w, src + (size_t)from * w, w * sizeof(float));
}

/* One batched forward for the agents in l->rows[0..k): their actions, log-probs, dist inputs
 * and (a recurrent network) the state fed and the next one. */
static void choose(rlk_local *l, int k) {
    size_t os = l->sp.obs_size, as = l->sp.act_size, ds = l->at.layout.dist_size, ss = l->at.layout.state_size;
    for (int r = 0; r < k; r++) {
        copy_row(l->batch_obs, r, l->obs, l->rows[r], os);
        copy_row(l->batch_state, r, l->state_next, l->rows[r], ss);
    }
    rlk_mlp_forward(l->at.mlp, l->weights, l->batch_obs, l->batch_state, k, l->batch_dist, l->batch_state_out);
    for (int r = 0; r < k; r++) {
        int i = l->rows[r];
        float *dist = l->dist + (size_t)i * ds;
        copy_row(l->dist, i, l->batch_dist, r, ds);
        copy_row(l->state_fed, i, l->batch_state, r, ss);
        copy_row(l->state_next, i, l->batch_state_out, r, ss);
        rlk_dist_choose(l->at.dist, dist, !l->evaluate, l->epsilon, &l->rng, l->actions + (size_t)i * as,
                        &l->agents[i].logp);
        l->agents[i].seq = l->weights_seq;
        l->agents[i].ready = 1;
    }
}

rlk_status rlk_local_act(rlk_local *l, int n, const float *obs, float *actions) {
    size_t os = l->sp.obs_size, as = l->sp.act_size;
    int k = 0;
    for (int i = 0; i < n; i++)
        if (l->agents[i].open && !l->agents[i].ready) return RLK_E_STATE;
    for (int i = 0; i < n; i++) {
        local_agent *a = &l->agents[i];
        if (a->open) continue;
        copy_row(l->obs, i, obs, i, os);
        memset(l->state_next + (size_t)i * l->at.layout.state_size, 0, l->at.layout.state_size * sizeof(float));
        a->open = 1;
        a->frag_steps = a->length = 0;
        a->ret = 0.0;
        l->rows[k++] = i;
    }
    if (k) choose(l, k);
    memcpy(actions, l->actions, (size_t)n * as * sizeof(float));
    for (int i = 0; i < n; i++) l->agents[i].ready = 0;
    return RLK_OK;
}

void rlk_local_next(rlk_local *l, int n) {
    int k = 0;
    for (int i = 0; i < n; i++)
        if (l->agents[i].open && !l->agents[i].ready) l->rows[k++] = i;
    if (k) choose(l, k);
}

/* ------------------------------------------------------------------ recording */
static unsigned char *stage(rlk_local *l) { return l->staged + l->n_staged++ * l->at.layout.record_bytes; }

/* The state to record with agent i's current step: the one fed before it on the fragment's
 * state grid (steps 0, L, 2L, ...), else NULL (a zero state, no HAS_STATE). */
static const float *grid_state(const rlk_local *l, int i) {
    size_t ss = l->at.layout.state_size;
    return ss && l->agents[i].frag_steps % l->at.max_seq_len == 0 ? l->state_fed + (size_t)i * ss : NULL;
}

int rlk_local_can_step(const rlk_local *l, int n) {
    for (int i = 0; i < n; i++)
        if (!l->agents[i].open || l->agents[i].ready) return 0;
    return 1;
}

int rlk_local_room(const rlk_local *l, int n) {
    return l->evaluate || l->n_staged + 2 * (size_t)n + (size_t)l->max_agents <= l->staging_cap;
}

static void finish_eval(rlk_local *l, local_agent *a) {
    eval_episode e = {a->ret, a->length, a->seq};
    if (l->n_done < l->max_agents) l->done[l->n_done++] = e;  /* (reported after every step batch) */
}

rlk_status rlk_local_step(rlk_local *l, int n, const float *rewards, const float *next_obs,
                          const unsigned char *terminated, const unsigned char *truncated, int *sample_due,
                          int *ended) {
    size_t os = l->sp.obs_size, as = l->sp.act_size, ds = l->at.layout.dist_size;
    const rlk_layout *lay = &l->at.layout;
    *sample_due = *ended = 0;
    if (!rlk_local_can_step(l, n)) return RLK_E_STATE;
    for (int i = 0; i < n; i++) {
        local_agent *a = &l->agents[i];
        int done = terminated[i] || truncated[i], flags = RLK_REC_HAS_LOGP | RLK_REC_HAS_DIST;
        a->ret += rewards[i];
        a->length++;
        if (!l->evaluate) {
            const float *state = grid_state(l, i);
            rlk_record_fill(stage(l), lay, flags | (state ? RLK_REC_HAS_STATE : 0), (uint32_t)i, a->seq, rewards[i],
                            a->logp, l->obs + (size_t)i * os, l->actions + (size_t)i * as, l->dist + (size_t)i * ds, state);
            a->frag_steps++;
            l->staged_steps++;
            l->steps_since_sample++;
        }
        if (done) {
            flags = RLK_REC_FINAL_OBS | (terminated[i] ? RLK_REC_TERMINATED : 0) | (truncated[i] ? RLK_REC_TRUNCATED : 0);
            if (l->evaluate) finish_eval(l, a);
            else rlk_record_fill(stage(l), lay, flags, (uint32_t)i, a->seq, 0.0f, 0.0f, next_obs + (size_t)i * os, NULL, NULL, NULL);
            a->open = 0;
            ++*ended;
        } else {
            memcpy(l->obs + (size_t)i * os, next_obs + (size_t)i * os, os * sizeof(float));
        }
    }
    *sample_due = !l->evaluate && l->steps_since_sample >= l->at.env_steps_per_sample;
    return RLK_OK;
}

void rlk_local_cut(rlk_local *l) {
    for (int i = 0; i < l->max_agents; i++) {
        local_agent *a = &l->agents[i];
        if (!a->open || a->frag_steps == 0) continue;
        rlk_record_fill(stage(l), &l->at.layout, RLK_REC_FINAL_OBS, (uint32_t)i, a->seq, 0.0f, 0.0f,
                        l->obs + (size_t)i * l->sp.obs_size, NULL, NULL, NULL);
        a->frag_steps = 0;
    }
    l->steps_since_sample = 0;
}

int rlk_local_write(rlk_local *l, int sock, double timeout_s) {
    if (!l->ring) return -1;
    return rlk_ring_write(l->ring, l->staged, l->n_staged, sock, timeout_s);
}

long rlk_local_staged_steps(const rlk_local *l) { return l->staged_steps; }

void rlk_local_drop(rlk_local *l) {
    l->n_staged = 0;
    l->staged_steps = 0;
}

void rlk_local_synced(rlk_local *l, long seq, double epsilon) {
    rlk_local_drop(l);
    l->epsilon = epsilon;
    if (l->board && seq != l->weights_seq) l->weights_seq = rlk_board_read(l->board, l->weights);
}

void rlk_local_refresh(rlk_local *l) {
    if (l->board && rlk_board_latest(l->board) != l->weights_seq) l->weights_seq = rlk_board_read(l->board, l->weights);
}

int rlk_local_eval_results(rlk_local *l, rlk_jw *w, int max_episodes) {
    int n = l->n_done < max_episodes ? l->n_done : max_episodes;
    rlk_jw_raw(w, "{\"type\": \"" RLK_MSG_EVAL_RESULTS "\", \"episodes\": [");
    for (int k = 0; k < n; k++) {
        rlk_jw_raw(w, k ? ", {\"episode_return\": " : "{\"episode_return\": ");
        if (rlk_jw_num(w, l->done[k].ret) != 0) rlk_jw_raw(w, "0");
        rlk_jw_raw(w, ", \"episode_length\": ");
        rlk_jw_int(w, l->done[k].length);
        rlk_jw_raw(w, ", \"weights_seq_no\": ");
        rlk_jw_int(w, l->done[k].seq);
        rlk_jw_raw(w, ", \"policy_id\": ");
        rlk_jw_str(w, l->at.policy);
        rlk_jw_raw(w, "}");
    }
    rlk_jw_raw(w, "]}");
    memmove(l->done, l->done + n, (size_t)(l->n_done - n) * sizeof *l->done);
    l->n_done -= n;
    return l->n_done;
}

void rlk_local_abandon(rlk_local *l) {
    rlk_local_drop(l);
    for (int i = 0; i < l->max_agents; i++) {
        l->agents[i].open = l->agents[i].ready = 0;
        l->agents[i].frag_steps = 0;
    }
}

long rlk_local_seq(const rlk_local *l, int i) { return l->agents[i].seq; }
