/* rlk_proto.c - reading the daemon's replies (contract in rlk_proto.h). */
#include "rlk_proto.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Starts of the ERROR messages worth a reconnect (client_lib.transport.RETRYABLE_ERRORS). */
static const char *const RETRYABLE[] = {RLK_RETRYABLE_ERRORS};

static rlk_status fail(rlk_reply_info *info, rlk_status st, const char *why) {
    snprintf(info->err, info->err_cap, "%s", why);
    return st;
}

/* Tokenize and find "type"; the top-level token is 0. ERROR replies are handled here. */
static rlk_status open_reply(const char *s, size_t len, rlk_jtok *toks, int max_toks,
                             const char *want, rlk_reply_info *info) {
    info->retry = 0;
    int n = rlk_json_parse(s, len, toks, max_toks);
    if (n == -2) return fail(info, RLK_E_LIMIT, "reply has more JSON tokens than this client's limits");
    if (n < 0) return fail(info, RLK_E_PROTOCOL, "reply is not valid JSON");
    int type = rlk_json_get(s, toks, 0, "type");
    if (type < 0 || toks[type].type != RLK_J_STRING) return fail(info, RLK_E_PROTOCOL, "reply without a type");
    if (rlk_json_str_eq(s, &toks[type], RLK_MSG_ERROR)) {
        int msg = rlk_json_get(s, toks, 0, "message");
        if (msg < 0 || rlk_json_str(s, &toks[msg], info->err, info->err_cap) != 0)
            snprintf(info->err, info->err_cap, "ERROR without a message");
        for (size_t i = 0; i < sizeof RETRYABLE / sizeof RETRYABLE[0]; i++)
            if (strncmp(info->err, RETRYABLE[i], strlen(RETRYABLE[i])) == 0) info->retry = 1;
        return RLK_E_SERVER;
    }
    if (!rlk_json_str_eq(s, &toks[type], want)) {
        char got[32];
        rlk_json_str(s, &toks[type], got, sizeof got);
        snprintf(info->err, info->err_cap, "expected %s, got %s", want, got);
        return RLK_E_PROTOCOL;
    }
    return RLK_OK;
}

rlk_status rlk_parse_typed(const char *s, size_t len, rlk_jtok *toks, int max_toks, const char *type,
                           rlk_reply_info *info) {
    return open_reply(s, len, toks, max_toks, type, info);
}

rlk_status rlk_parse_pong(const char *s, size_t len, rlk_jtok *toks, int max_toks, rlk_reply_info *info) {
    return open_reply(s, len, toks, max_toks, RLK_MSG_PONG, info);
}

/* A non-negative integer number token (an exact one) into *out. */
static int int_of(const char *s, const rlk_jtok *t, long max, long *out) {
    double v;
    if (rlk_json_num(s, t, &v) != 0 || v != floor(v) || v < 0 || v > (double)max) return -1;
    *out = (long)v;
    return 0;
}

/* A Box's "shape" array into sp's obs shape (and obs_size). */
static rlk_status obs_shape(const char *s, const rlk_jtok *toks, int space, rlk_spaces *sp,
                            rlk_reply_info *info) {
    int shape = rlk_json_get(s, toks, space, "shape");
    if (shape < 0 || toks[shape].type != RLK_J_ARRAY || toks[shape].count > RLK_MAX_RANK)
        return fail(info, RLK_E_PROTOCOL, "observation Box without a usable shape");
    size_t size = 1;
    sp->obs_rank = toks[shape].count;
    for (int k = 0, i = shape + 1; k < sp->obs_rank; k++, i = toks[i].next) {
        long dim;
        if (int_of(s, &toks[i], RLK_MAX_OBS_FLOATS, &dim) != 0 || dim < 1)
            return fail(info, RLK_E_PROTOCOL, "observation shape holds a bad dimension");
        sp->obs_shape[k] = (int)dim;
        size *= (size_t)dim;
        if (size > RLK_MAX_OBS_FLOATS) return fail(info, RLK_E_UNSUPPORTED, "observation larger than RLK_MAX_OBS_FLOATS");
    }
    sp->obs_size = size;
    return RLK_OK;
}

static int is_float_box(const char *s, const rlk_jtok *toks, int space) {
    int type = rlk_json_get(s, toks, space, "type");
    int dtype = rlk_json_get(s, toks, space, "dtype");
    return type >= 0 && rlk_json_str_eq(s, &toks[type], "Box") &&
           (dtype < 0 || rlk_json_str_eq(s, &toks[dtype], "float32") ||
            rlk_json_str_eq(s, &toks[dtype], "float64"));
}

/* Discrete {n}, MultiDiscrete {nvec}, or a float Box {shape} (flattened). */
static rlk_status action_space(const char *s, const rlk_jtok *toks, int space, rlk_spaces *sp,
                               rlk_reply_info *info) {
    int type = rlk_json_get(s, toks, space, "type");
    long n;
    if (type >= 0 && rlk_json_str_eq(s, &toks[type], "Discrete")) {
        int nt = rlk_json_get(s, toks, space, "n");
        if (nt < 0 || int_of(s, &toks[nt], 1L << 30, &n) != 0) return fail(info, RLK_E_PROTOCOL, "Discrete without n");
        sp->act_kind = RLK_ACT_DISCRETE;
        sp->act_n = (int)n;
        sp->act_size = 1;
        return RLK_OK;
    }
    if (type >= 0 && rlk_json_str_eq(s, &toks[type], "MultiDiscrete")) {
        int nvec = rlk_json_get(s, toks, space, "nvec");
        if (nvec < 0 || toks[nvec].type != RLK_J_ARRAY || toks[nvec].count < 1 ||
            toks[nvec].count > RLK_MAX_ACTION_FLOATS)
            return fail(info, RLK_E_UNSUPPORTED, "MultiDiscrete without a usable nvec");
        sp->act_kind = RLK_ACT_MULTI_DISCRETE;
        sp->act_size = (size_t)toks[nvec].count;
        return RLK_OK;
    }
    if (is_float_box(s, toks, space)) {
        rlk_spaces box = *sp;
        rlk_status st = obs_shape(s, toks, space, &box, info);  /* (same shape rules) */
        if (st != RLK_OK || box.obs_size > RLK_MAX_ACTION_FLOATS)
            return fail(info, RLK_E_UNSUPPORTED, "action Box without a usable shape (or too large)");
        sp->act_kind = RLK_ACT_BOX;
        sp->act_size = box.obs_size;
        return RLK_OK;
    }
    return fail(info, RLK_E_UNSUPPORTED, "action space is not Discrete, MultiDiscrete or a float Box");
}

rlk_status rlk_parse_set_config(const char *s, size_t len, rlk_jtok *toks, int max_toks,
                                rlk_spaces *sp, rlk_reply_info *info) {
    rlk_status st = open_reply(s, len, toks, max_toks, RLK_MSG_SET_CONFIG, info);
    if (st != RLK_OK) return st;
    int obs = rlk_json_get(s, toks, 0, "observation_space");
    int act = rlk_json_get(s, toks, 0, "action_space");
    if (obs < 0 || act < 0 || toks[obs].type != RLK_J_OBJECT || toks[act].type != RLK_J_OBJECT)
        return fail(info, RLK_E_UNSUPPORTED, "the server declared no spaces (not an rlinkd daemon?)");
    if (!is_float_box(s, toks, obs))
        return fail(info, RLK_E_UNSUPPORTED, "observation space is not a float Box");
    memset(sp, 0, sizeof *sp);
    int limit = rlk_json_get(s, toks, 0, "max_agents_per_connection");
    if (limit >= 0 && int_of(s, &toks[limit], 1L << 30, &sp->max_agents) != 0)
        return fail(info, RLK_E_PROTOCOL, "SET_CONFIG holds a bad max_agents_per_connection");
    st = obs_shape(s, toks, obs, sp, info);
    return st != RLK_OK ? st : action_space(s, toks, act, sp, info);
}

/* Every number in the subtree of token t (nested arrays flattened), exactly want of them. */
static int numbers(const char *s, const rlk_jtok *toks, int t, float *out, size_t want) {
    size_t got = 0;
    if (toks[t].type == RLK_J_NUMBER) {
        double v;
        if (want != 1 || rlk_json_num(s, &toks[t], &v) != 0 || !isfinite(v)) return -1;
        out[0] = (float)v;
        return 0;
    }
    if (toks[t].type != RLK_J_ARRAY) return -1;
    for (int i = t + 1; i < toks[t].next; i++) {
        double v;
        if (toks[i].type == RLK_J_ARRAY) continue;
        if (got >= want || rlk_json_num(s, &toks[i], &v) != 0 || !isfinite(v)) return -1;
        out[got++] = (float)v;
    }
    return got == want ? 0 : -1;
}

rlk_status rlk_parse_actions(const char *s, size_t len, rlk_jtok *toks, int max_toks,
                             const rlk_spaces *sp, int n, float *actions, long *seqs,
                             unsigned char *is_null, rlk_reply_info *info) {
    rlk_status st = open_reply(s, len, toks, max_toks, RLK_MSG_ACTIONS, info);
    if (st != RLK_OK) return st;
    int acts = rlk_json_get(s, toks, 0, "actions");
    int vers = rlk_json_get(s, toks, 0, "weights_seq_nos");
    if (acts < 0 || vers < 0 || toks[acts].type != RLK_J_ARRAY || toks[vers].type != RLK_J_ARRAY ||
        toks[acts].count != n || toks[vers].count != n)
        return fail(info, RLK_E_PROTOCOL, "ACTIONS does not hold one action per entry");
    for (int k = 0, a = acts + 1, v = vers + 1; k < n; k++, a = toks[a].next, v = toks[v].next) {
        double seq;
        if (rlk_json_num(s, &toks[v], &seq) != 0 || seq != floor(seq) || fabs(seq) > 9e15)
            return fail(info, RLK_E_PROTOCOL, "ACTIONS holds a bad weights_seq_no");
        seqs[k] = (long)seq;
        is_null[k] = toks[a].type == RLK_J_NULL;
        if (!is_null[k] && numbers(s, toks, a, actions + (size_t)k * sp->act_size, sp->act_size) != 0)
            return fail(info, RLK_E_PROTOCOL, "ACTIONS holds an action that does not fit the action space");
    }
    return RLK_OK;
}

/* An integer number token (|v| < 2^53) into *out; -1 otherwise. */
static int signed_of(const char *s, const rlk_jtok *t, long *out) {
    double v;
    if (rlk_json_num(s, t, &v) != 0 || v != floor(v) || fabs(v) > 9e15) return -1;
    *out = (long)v;
    return 0;
}

rlk_status rlk_parse_weights_ready(const char *s, size_t len, rlk_jtok *toks, int max_toks, const char *policy,
                                   long *seq, double *epsilon, rlk_reply_info *info) {
    rlk_status st = open_reply(s, len, toks, max_toks, RLK_MSG_WEIGHTS_READY, info);
    if (st != RLK_OK) return st;
    int one = rlk_json_get(s, toks, 0, "weights_seq_no"), many = rlk_json_get(s, toks, 0, "weights_seq_nos");
    int mine = many >= 0 && toks[many].type == RLK_J_OBJECT ? rlk_json_get(s, toks, many, policy) : -1;
    if (mine < 0) mine = one;
    if (mine < 0 || signed_of(s, &toks[mine], seq) != 0) return fail(info, RLK_E_PROTOCOL, "WEIGHTS_READY without a weights version");
    int expl = rlk_json_get(s, toks, 0, "exploration");
    int entry = expl >= 0 && toks[expl].type == RLK_J_OBJECT ? rlk_json_get(s, toks, expl, policy) : -1;
    int eps = entry >= 0 && toks[entry].type == RLK_J_OBJECT ? rlk_json_get(s, toks, entry, "epsilon") : -1;
    double e;
    *epsilon = eps >= 0 && rlk_json_num(s, &toks[eps], &e) == 0 && e >= 0.0 && e <= 1.0 ? e : -1.0;
    return RLK_OK;
}
