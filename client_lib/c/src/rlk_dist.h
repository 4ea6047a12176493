/*
 * rlk_dist.h - choosing an action from `action_dist_inputs` on the client, as
 * client_lib/protocol/distributions.py and client_lib/policy.py do (same columns, same
 * log-probabilities): the components come from ATTACHED's network description ("dist", one
 * entry per factor of the action distribution), never re-derived from the spaces:
 *
 *     {"kind": "categorical", "dist": 0, "width": 2, "action": 0, "low": [], "high": []}
 *     {"kind": "gaussian" | "squashed_gaussian", "dist": D, "width": d, "action": A,
 *      "low": [d numbers or null], "high": [...]}            (null: an infinite bound)
 *
 *   categorical  dist[D .. D+width) logits; action[A] = the index. Sampled by inverse CDF,
 *                greedy = argmax; epsilon-greedy (DQN) when the daemon announces an epsilon.
 *   gaussian     means at D, log-stds at D+d; action = mean + std * N(0, 1) clipped to
 *                [low, high] (greedy: the clipped mean); log-prob at the clipped value.
 *   squashed     u ~ N(mean, std); action = low + (tanh(u) + 1) / 2 * (high - low) (SAC);
 *                log-prob with the tanh change of variables, from the float32 action.
 *
 * The random numbers are the client's own xoshiro256** stream (seeded by the caller).
 */
#ifndef RLK_DIST_H
#define RLK_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "rlinkd.h"
#include "rlk_json.h"

#define RLK_DIST_MAX_COMPONENTS 256

typedef struct { uint64_t s[4]; } rlk_rng;

void rlk_rng_seed(rlk_rng *r, uint64_t seed);
double rlk_rng_uniform(rlk_rng *r);  /* [0, 1) */
double rlk_rng_normal(rlk_rng *r);

typedef struct rlk_dist rlk_dist;

/* The "dist" array token of a network description, checked against the sizes. */
rlk_status rlk_dist_parse(const char *s, const rlk_jtok *toks, int arr, size_t dist_size, size_t act_size,
                          rlk_dist **out, char *err, size_t cap);
void rlk_dist_free(rlk_dist *d);

/* 1 when the distribution is one categorical (epsilon-greedy applies). */
int rlk_dist_single_categorical(const rlk_dist *d);

/* One row: action[act_size] and its log-probability from dist[dist_size]. explore 0: greedy.
 * epsilon >= 0 (with explore, a single categorical): epsilon-greedy instead of sampling. */
void rlk_dist_choose(const rlk_dist *d, const float *dist, int explore, double epsilon, rlk_rng *rng,
                     float *action, float *logp);

#endif /* RLK_DIST_H */
