/*
 * rlk_proto.h - the RLlink messages the C client reads, as pure functions over one reply's
 * bytes (no socket, no allocation): SET_CONFIG's spaces, PONG, ACTIONS, ERROR. The fuzz test
 * feeds them mutated and truncated replies.
 */
#ifndef RLK_PROTO_H
#define RLK_PROTO_H

#include <stddef.h>

#include "rlinkd.h"
#include "rlk_declared.h"  /* RLK_MSG_ types, RLK_RETRYABLE_ERRORS: generated from the Python */
#include "rlk_json.h"

#define RLK_MAX_RANK 8

typedef enum { RLK_ACT_DISCRETE, RLK_ACT_MULTI_DISCRETE, RLK_ACT_BOX } rlk_act_kind;

typedef struct {
    size_t obs_size;                 /* floats of one observation */
    int obs_rank, obs_shape[RLK_MAX_RANK];
    rlk_act_kind act_kind;
    size_t act_size;                 /* floats of one action */
    int act_n;                       /* Discrete: n */
    long max_agents;                 /* SET_CONFIG's max_agents_per_connection (0: not said) */
} rlk_spaces;

typedef struct {
    char *err;      /* the reason of a failure, or the daemon's ERROR message */
    size_t err_cap;
    int retry;      /* an ERROR worth a reconnect (shutting down, evicted, episode lost) */
} rlk_reply_info;

/* A reply of type `type` (RLK_OK, tokens in toks), an ERROR (RLK_E_SERVER), else RLK_E_PROTOCOL. */
rlk_status rlk_parse_typed(const char *s, size_t len, rlk_jtok *toks, int max_toks, const char *type,
                           rlk_reply_info *info);

/* A PONG (0), an ERROR (RLK_E_SERVER), anything else RLK_E_PROTOCOL. */
rlk_status rlk_parse_pong(const char *s, size_t len, rlk_jtok *toks, int max_toks, rlk_reply_info *info);

/* SET_CONFIG's observation_space and action_space into sp; RLK_E_UNSUPPORTED for spaces
 * this client does not handle (sizes beyond RLK_MAX_OBS_FLOATS / RLK_MAX_ACTION_FLOATS too). */
rlk_status rlk_parse_set_config(const char *s, size_t len, rlk_jtok *toks, int max_toks,
                                rlk_spaces *sp, rlk_reply_info *info);

/* ACTIONS for n entries: entry k's action into actions[k * sp->act_size ...] and its
 * weights version into seqs[k], or is_null[k] = 1 for an ended episode's null. */
rlk_status rlk_parse_actions(const char *s, size_t len, rlk_jtok *toks, int max_toks,
                             const rlk_spaces *sp, int n, float *actions, long *seqs,
                             unsigned char *is_null, rlk_reply_info *info);

/* WEIGHTS_READY: the weights version to read for `policy` (weights_seq_nos[policy] when
 * present, else weights_seq_no) and its epsilon from "exploration" (-1 when none). */
rlk_status rlk_parse_weights_ready(const char *s, size_t len, rlk_jtok *toks, int max_toks, const char *policy,
                                   long *seq, double *epsilon, rlk_reply_info *info);

#endif /* RLK_PROTO_H */
