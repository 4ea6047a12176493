/*
 * rlk_local.h - client-side inference over shared memory: the agents' episodes, the actor run
 * here on weights read from the daemon's board, and the step records staged for the ring.
 * (The connection, SAMPLE_READY and reconnecting stay in rlk_client.c.)
 *
 * Per agent: closed, or open with its current observation; `ready` when the next action has
 * been chosen but not yet returned by act. Each step is staged as one record (obs, action,
 * reward, log-prob, dist inputs, weights version; stream_id = the agent's slot; a recurrent
 * policy's state, below); an episode's end adds a FINAL_OBS record (TERMINATED/TRUNCATED). A
 * sample (env_steps_per_sample steps, or a full staging area) cuts every open fragment with a
 * FINAL_OBS record of its current observation and is written into the ring as one batch; the
 * fragment goes on in the next sample from that observation (RLlink's rule). Staged records
 * are kept until the daemon has acknowledged them (WEIGHTS_READY), so a reconnect writes them
 * again into the new ring. Evaluation clients stage nothing: their finished episodes are
 * reported (EVAL_RESULTS).
 *
 * A recurrent policy (ATTACHED's "state", recurrent.state_contract): each agent carries its
 * state, zeros when its episode opens, then the network's state_out after each choice (also
 * when evaluating). The record of a step at fragment position 0, L, 2L, ... (L = max_seq_len;
 * the position counts from the episode's start or the last cut) holds the state fed before
 * that step and HAS_STATE; other records a zero state (the collector's grid, records.py).
 */
#ifndef RLK_LOCAL_H
#define RLK_LOCAL_H

#include <stddef.h>
#include <stdint.h>

#include "rlinkd.h"
#include "rlk_dist.h"
#include "rlk_json.h"
#include "rlk_mlp.h"
#include "rlk_proto.h"
#include "rlk_ring.h"

#define RLK_PATH_CHARS 4096
#define RLK_STAGING_BYTES (64u << 20)  /* staged records between samples, at most (or 4 per agent) */
#define RLK_STAGING_LEAST(agents) (4 * (size_t)(agents) + 8)  /* records a sample must have room for */

/* What an ATTACHED reply says (rlk_parse_attached allocates mlp and dist: rlk_attached_free). */
typedef struct {
    char board_path[RLK_PATH_CHARS], doorbell_path[RLK_PATH_CHARS], policy[80];
    long env_steps_per_sample;
    long max_seq_len;       /* a recurrent policy's state grid L ("state"."max_seq_len"); 0: feed-forward */
    rlk_layout layout;
    rlk_mlp *mlp;
    rlk_dist *dist;
} rlk_attached;

/* ATTACHED for the spaces sp, for batches of up to max_rows agents: RLK_E_UNSUPPORTED for a
 * policy without board weights (a frozen model) or a network the C client cannot run. */
rlk_status rlk_parse_attached(const char *s, size_t len, rlk_jtok *toks, int max_toks, const rlk_spaces *sp,
                              int max_rows, rlk_attached *out, rlk_reply_info *info);
void rlk_attached_free(rlk_attached *a);

typedef struct rlk_local rlk_local;

rlk_status rlk_local_new(const rlk_spaces *sp, int max_agents, int evaluate, uint64_t seed, rlk_local **out);
void rlk_local_free(rlk_local *l);

/* After ATTACHED (parsed into a, taken over) on sock: receive the ring's descriptor, map the
 * ring and board, wait for the first weights (up to timeout_s). On a reconnect the network
 * must be the one the client started with (RLK_E_UNSUPPORTED otherwise). */
rlk_status rlk_local_attach(rlk_local *l, rlk_attached *a, int sock, double timeout_s, rlk_jtok *toks,
                            int max_toks, char *err, size_t cap);
/* The connection is gone: unmap ring and board (staged records are kept). */
void rlk_local_detach(rlk_local *l);
const char *rlk_local_policy(const rlk_local *l);

/* Agents 0..n-1: a new episode's action is chosen from obs, an open one's was chosen at its
 * last step. RLK_E_STATE for an agent that acted and has not stepped. */
rlk_status rlk_local_act(rlk_local *l, int n, const float *obs, float *actions);
/* 1 when agents 0..n-1 have all acted (and not stepped since). */
int rlk_local_can_step(const rlk_local *l, int n);
/* 1 when the outcomes of n agents (plus every cut) fit in the staging area now. */
int rlk_local_room(const rlk_local *l, int n);
/* Record agents 0..n-1's outcomes (each must have acted); *sample_due when a sample is complete.
 * *ended: episodes finished (evaluation clients report them: rlk_local_eval_results). */
rlk_status rlk_local_step(rlk_local *l, int n, const float *rewards, const float *next_obs,
                          const unsigned char *terminated, const unsigned char *truncated, int *sample_due,
                          int *ended);
/* Choose the next actions of agents 0..n-1 that are open and not ready (one batched forward). */
void rlk_local_next(rlk_local *l, int n);

/* Cut the open fragments (once per sample, before the first write of it). */
void rlk_local_cut(rlk_local *l);
/* Write the staged records into the ring (see rlk_ring_write for the result). */
int rlk_local_write(rlk_local *l, int sock, double timeout_s);
/* Env steps in the staged records. */
long rlk_local_staged_steps(const rlk_local *l);
/* The daemon acknowledged the sample: forget the staged records; read weights `seq` (or newer)
 * from the board if they differ from those held; epsilon < 0: none. */
void rlk_local_synced(rlk_local *l, long seq, double epsilon);
/* Drop the staged records without sending them (a sample that failed for good). */
void rlk_local_drop(rlk_local *l);
/* Evaluation: read newer weights if the board has them. */
void rlk_local_refresh(rlk_local *l);
/* Evaluation: up to max_episodes finished episodes as an EVAL_RESULTS body into w (then
 * forgotten); returns how many are left for another message. */
int rlk_local_eval_results(rlk_local *l, rlk_jw *w, int max_episodes);
/* A sample failed for good: its records are dropped and every open episode is abandoned (each
 * agent starts a new one at its next act). */
void rlk_local_abandon(rlk_local *l);
/* The weights version that chose agent i's last action. */
long rlk_local_seq(const rlk_local *l, int i);

#endif /* RLK_LOCAL_H */
