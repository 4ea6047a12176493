/*
 * rlinkd.h - the rlinkd C client: a simulator asks a running rlinkd daemon for actions.
 *
 * C99 + POSIX (and the GCC/Clang __atomic builtins for shared memory), no dependency beyond
 * libc, libm and pthreads. Speaks RLlink over TCP ("tcp://HOST:PORT") or the daemon's Unix socket
 * ("unix:///PATH/rlinkd.sock"), or, co-located, through shared-memory lanes
 * ("shm:///PATH/rlinkd.sock": the Unix socket only sets them up and carries errors; each
 * request is written into a lane of a memory area the daemon shares, no socket on the hot
 * path), with rlinkd's serving extension: the
 * daemon runs the policy (server-side inference), records observation, action, log-prob
 * and weights version, and trains on the rewards and done flags this client reports. Every
 * env step of every agent is one round trip (STEP_BATCH -> ACTIONS, or one group of lane
 * requests); an episode's end travels with the next request. Over TCP and "unix://" the
 * client asks SERVE_DIRECT after the handshake, so the daemon's inference process answers
 * the connection itself (one hop); if the daemon refuses, it reconnects without it.
 *
 * Usage (one agent):
 *
 *     rlk_options o; rlk_options_init(&o); o.address = "tcp://127.0.0.1:5555";
 *     rlk_client *c; if (rlk_connect(&o, &c) != RLK_OK) { ... rlk_status_name(...) ... }
 *     float obs[4], action[1];           // sizes: rlk_obs_size(c), rlk_action_size(c)
 *     for (;;) {
 *         if (rlk_act(c, obs, action) != RLK_OK) break;        // the policy's action
 *         ... apply action, observe reward, next obs, terminated, truncated ...
 *         if (rlk_step(c, reward, obs, terminated, truncated) != RLK_OK) break;
 *         if (terminated || truncated) reset the env into obs;  // the next act starts anew
 *     }
 *     rlk_close(c);
 *
 * rlk_act_batch / rlk_step_batch do the same for agents 0..n-1 at once (n <= max_agents).
 *
 * Client-side inference (options.client_inference = 1, "shm://" addresses): the same calls,
 * but the policy runs in this process, as client_lib's shared-memory agents do. The Unix
 * socket carries the handshake, ATTACH (the daemon hands over this client's step ring, a
 * sealed memfd) and one SAMPLE_READY per sample; every step is written into the ring as a
 * record (observation, action, reward, log-prob, distribution inputs, weights version); the
 * MLP actor is interpreted from the network description ATTACHED carries and runs on the
 * weights read from the daemon's weights board (seqlocked, no copy on the daemon's side).
 * Actions are sampled from the policy (the client's own random stream, options.seed), or
 * epsilon-greedy when the daemon announces an epsilon (DQN), or greedy for evaluate = 1.
 * Every env_steps_per_sample steps (the daemon's setting) the sample is sent and newer
 * weights are read (with force_on_policy, after the learner trained on it). The step records
 * of a sample are kept until the daemon acknowledged it: after a reconnect they are written
 * again into the new ring, and the episodes in progress go on. Networks other than an MLP
 * over a flat float Box (images, action masks, discrete observations) and frozen models fail
 * rlk_connect with RLK_E_UNSUPPORTED: use server-side inference for those. Memory: the
 * network's values for max_agents rows (at most 256 MiB, else RLK_E_LIMIT), the weights (at
 * most 64 Mi floats), and the staged records of one sample (at most 64 MiB and the ring's
 * capacity, but at least 4 records per agent); a sample is written into the ring all at
 * once. A sample that fails for good (not retried, or reconnecting gave up) is dropped and the
 * open episodes are abandoned: each agent starts a new one at its next rlk_act.
 *
 * Errors: no function aborts or exits; each returns an rlk_status (0 = RLK_OK) and
 * rlk_error() describes the last failure. A lost connection is re-established with
 * exponential backoff (50 ms doubling to 2 s) for up to reconnect_timeout_s; the episodes
 * in progress go on (each restarts on the daemon with the observation in hand; the reward
 * of the step that was in flight is lost). An ERROR reply from the daemon is RLK_E_SERVER
 * (retried instead when it says the daemon is shutting down or the connection was evicted).
 *
 * Memory: rlk_connect allocates the client and every buffer it will use, sized by the
 * options' limits and the spaces (client-side inference: also by the network, within the
 * limits below); nothing else is sized by server input: a reply longer than
 * max_frame_bytes, or with more JSON tokens than the limits allow, is refused (RLK_E_LIMIT /
 * RLK_E_PROTOCOL) before it is parsed. (Over shared memory each (re)connection maps the
 * daemon's lane area, after checking its header against the spaces and max_agents.)
 *
 * A call that fails for good (not retried) leaves the client usable: the episodes of that
 * request are abandoned and their agents start new ones at their next rlk_act.
 *
 * Thread safety: a client is used by one thread at a time (calls on one client must not
 * overlap); distinct clients are independent and may be used from different threads.
 *
 * Spaces supported: observations a float Box of any shape (rlk_obs_size() floats, row-major);
 * actions Discrete (one float holding the integer), MultiDiscrete (one float per entry) or a
 * float Box (rlk_action_size() floats). Other spaces fail rlk_connect with RLK_E_UNSUPPORTED.
 */
#ifndef RLINKD_H
#define RLINKD_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RLK_VERSION "0.2.0"  /* 0.2.0: rlk_options gained client_inference and seed (rebuild against this header) */

/* Hard limits (what a client can be configured to at most). */
#define RLK_MAX_AGENTS 4096          /* agents per client = STEP_BATCH entries (the daemon's limit) */
#define RLK_MAX_OBS_FLOATS 65536     /* floats in one agent's observation */
#define RLK_MAX_ACTION_FLOATS 256    /* floats in one agent's action */
#define RLK_MAX_FRAME_BYTES (64u << 20)
#define RLK_ERROR_CHARS 256          /* rlk_error() text, including the NUL */

typedef enum {
    RLK_OK = 0,
    RLK_E_ARG = -1,          /* a bad argument (NULL, n out of range, a non-finite number) */
    RLK_E_CONNECT = -2,      /* could not connect (or reconnect within reconnect_timeout_s) */
    RLK_E_IO = -3,           /* a read or write failed and reconnecting is off */
    RLK_E_PROTOCOL = -4,     /* a malformed or unexpected reply */
    RLK_E_SERVER = -5,       /* the daemon answered ERROR (rlk_error() has its message) */
    RLK_E_LIMIT = -6,        /* a message or reply exceeds a documented limit */
    RLK_E_NOMEM = -7,        /* rlk_connect could not allocate */
    RLK_E_STATE = -8,        /* calls out of order (rlk_act twice without rlk_step, ...) */
    RLK_E_TIMEOUT = -9,      /* no reply within io_timeout_s */
    RLK_E_UNSUPPORTED = -10  /* the daemon's spaces are not ones this client handles */
} rlk_status;

typedef struct {
    const char *address;         /* "tcp://HOST:PORT", "unix:///PATH" or "shm:///PATH" (required) */
    const char *token;           /* the daemon's server.token, or NULL */
    const char *policy_id;       /* act with this policy, or NULL (the daemon's mapping) */
    int evaluate;                /* 1: evaluation episodes (greedy actions, never trained) */
    int max_agents;              /* agents this client steps at once (default 1) */
    double io_timeout_s;         /* longest wait for one reply (default 30) */
    double reconnect_timeout_s;  /* give up reconnecting after this long (default 60; 0: never reconnect) */
    size_t max_frame_bytes;      /* largest message either way (default 1 MiB) */
    int client_inference;        /* 1: run the policy here ("shm://" only; see above) */
    unsigned long long seed;     /* client-side inference: the sampling seed (0: from pid and time) */
} rlk_options;

typedef struct rlk_client rlk_client;

/* Fill o with the defaults (address NULL: set it). */
void rlk_options_init(rlk_options *o);

/* Connect, handshake (PING with the token, GET_CONFIG) and read the spaces. On success
 * *out is a new client (free it with rlk_close); on failure *out is NULL. */
rlk_status rlk_connect(const rlk_options *o, rlk_client **out);

/* Deliver the episode ends still waiting to be sent, close the connection (the daemon ends
 * every episode still open, truncated, without its last step) and free the client. NULL is fine. */
void rlk_close(rlk_client *c);

/* Floats in one observation / one action of this daemon's spaces. */
size_t rlk_obs_size(const rlk_client *c);
size_t rlk_action_size(const rlk_client *c);
/* n of a Discrete action space, else 0. */
int rlk_action_n(const rlk_client *c);

/* Agent 0's action for obs (rlk_obs_size floats) into action (rlk_action_size floats). */
rlk_status rlk_act(rlk_client *c, const float *obs, float *action);
/* Agent 0's outcome of its last action: one round trip (the next action comes back with it). */
rlk_status rlk_step(rlk_client *c, float reward, const float *next_obs, int terminated, int truncated);

/* Agents 0..n-1 (obs and actions row-major, n * size floats; 1 <= n <= max_agents). */
rlk_status rlk_act_batch(rlk_client *c, int n, const float *obs, float *actions);
rlk_status rlk_step_batch(rlk_client *c, int n, const float *rewards, const float *next_obs,
                          const unsigned char *terminated, const unsigned char *truncated);

/* The weights version that chose the last action of agent 0 (-1 before any). */
long rlk_weights_seq_no(const rlk_client *c);
/* Connections re-established so far. */
int rlk_reconnects(const rlk_client *c);
/* The last failure, "" when none; valid until the next call on c. */
const char *rlk_error(const rlk_client *c);
/* "RLK_OK", "RLK_E_IO", ... */
const char *rlk_status_name(rlk_status s);

#ifdef __cplusplus
}
#endif
#endif /* RLINKD_H */
