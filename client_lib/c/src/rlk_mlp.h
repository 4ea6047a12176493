/*
 * rlk_mlp.h - the actor network for client-side inference, interpreted from the description
 * the daemon sends in ATTACHED ("network": netops.network_json on the Python side), never
 * re-derived here: the op list (execution order) and the flat parameter layout of the
 * weights board.
 *
 *     {"ops": [{"op": "Input", "out": "onnx::Gemm_0", "key": "", "dtype": "<f4", "shape": [4]},
 *              {"op": "Normalize", "out": "obs/norm", "x": "onnx::Gemm_0", "mean": "obs_mean",
 *               "std": "obs_std"},
 *              {"op": "Linear", "out": "pi.0.pre", "x": "obs/norm", "weight": "pi.0.weight",
 *               "bias": "pi.0.bias"}, {"op": "Act", "out": "pi.0.out", "x": "pi.0.pre",
 *               "kind": "tanh"}, ..., {"op": "Linear", "out": "action_dist_inputs", ...}],
 *      "params": [["obs_mean", [4]], ["obs_std", [4]], ["pi.0.weight", [64, 4]], ...],
 *      "dist": [...]}                                       (read by rlk_dist.h)
 *
 * Supported ops (what the MLP policies of a flat float Box observation lower to): Input (the
 * root float32 leaf), Flatten, Normalize, Linear, Act (tanh, relu), Slice, Tile, Clip, Concat,
 * and a policy with memory's State (the carried state, an input [n, S]) and Recurrent cell
 * (lstm: S = 2H columns [h | c]; gru: S = H; PyTorch's gate order, recurrent.py's maths; its
 * output is the next state [n, S]), at most one of each. Anything else (images, masks,
 * discrete observations) is RLK_E_UNSUPPORTED: such a policy is served server-side. Python's
 * netnumpy runs the same list; a test checks they agree.
 *
 * Memory: parsing allocates the op and value tables and one scratch area of max_rows rows of
 * every value, all bounded by the RLK_MLP_* limits below (refused beyond them).
 */
#ifndef RLK_MLP_H
#define RLK_MLP_H

#include <stddef.h>

#include "rlinkd.h"
#include "rlk_json.h"

#define RLK_MLP_MAX_OPS 64
#define RLK_MLP_MAX_PARAMS 128
#define RLK_MLP_MAX_WIDTH 65536        /* columns of one value */
#define RLK_MLP_MAX_PARAM_FLOATS (64u << 20)  /* the whole flat weight vector */
#define RLK_MLP_MAX_SCRATCH_FLOATS (64u << 20)  /* every value for max_rows rows (256 MiB) */
#define RLK_MLP_NAME_CHARS 96

typedef struct rlk_mlp rlk_mlp;

/* Build the network of object token `network` (s, toks) for observations of obs_size floats
 * and distribution inputs of dist_size floats, for batches of up to max_rows rows. */
rlk_status rlk_mlp_parse(const char *s, const rlk_jtok *toks, int network, size_t obs_size, size_t dist_size,
                         int max_rows, rlk_mlp **out, char *err, size_t cap);
void rlk_mlp_free(rlk_mlp *m);

/* Floats of the flat weight vector (every parameter, the critic's too). */
size_t rlk_mlp_n_params(const rlk_mlp *m);

/* S, the width of the carried state (0: a feed-forward network). */
size_t rlk_mlp_state_width(const rlk_mlp *m);

/* 1 when a and b compute the same function layout (same ops, params and sizes). */
int rlk_mlp_same(const rlk_mlp *a, const rlk_mlp *b);

/* dist[n, dist_size] = the actor on obs[n, obs_size] with weights[n_params]; 1 <= n <= max_rows.
 * A recurrent network (S = rlk_mlp_state_width > 0) reads state_in[n, S] (zeros on an
 * episode's first step) and writes the next state to state_out[n, S]; both are ignored (may
 * be NULL) when S = 0.
 * Not thread-safe (the scratch area is the network's). */
void rlk_mlp_forward(rlk_mlp *m, const float *weights, const float *obs, const float *state_in, int n, float *dist,
                     float *state_out);

#endif /* RLK_MLP_H */
