/*
 * rlinkd.h - the rlinkd C client: a simulator asks a running rlinkd daemon for actions.
 *
 * C99 + POSIX (and the GCC/Clang __atomic builtins and __thread), no dependency beyond libc,
 * libm and pthreads: link with -lm -pthread (docs/c-client.md: building, pkg-config, CMake).
 * Addresses (the grammar client_lib's Python shares; table in docs/c-client.md):
 * "tcp://HOST:PORT" (or "HOST:PORT"), "unix:///PATH" (RLlink over the daemon's Unix socket),
 * and, co-located, shared-memory lanes: "shm" (the daemon of the default state dir), "shm:DIR"
 * or "shm:///DIR" (of state dir DIR, found through DIR/daemon.json at every connection),
 * "shm:///PATH/rlinkd.sock" (through that socket); "auto[:DIR]" (shm if that daemon runs here,
 * else tcp://127.0.0.1:5555). Over shared memory the Unix socket only sets the lanes up and
 * carries errors; each request is written into a lane of a memory area the daemon shares.
 * With rlinkd's serving extension the daemon runs the policy (server-side inference), records
 * observation, action, log-prob and weights version, and trains on the rewards and done flags
 * this client reports. Over TCP and "unix://" the client asks SERVE_DIRECT after the
 * handshake, so the daemon's inference process answers the connection itself (one hop); if
 * the daemon refuses, it reconnects without it.
 *
 * The act/step contract (per agent the calls alternate act, step, act, ...):
 *   rlk_act_batch: an agent without an episode starts one with its row of obs (one round trip
 *     for all of them, with the episode ends still to be sent); an agent in an episode gets
 *     the action its last rlk_step brought back: nothing is sent, its obs row is not read.
 *   rlk_step_batch: each agent's outcome of that action. The agents that go on are sent in one
 *     round trip that brings back their next actions; an agent with terminated or truncated
 *     has ended its episode (the end travels with the next request; next_obs is the final
 *     observation): reset that environment and pass the reset observation to the next act.
 *
 * One agent (a complete program: docs/c-client.md, one_agent.c):
 *
 *     rlk_options o; rlk_options_init(&o); o.address = "tcp://127.0.0.1:5555";
 *     rlk_client *c;
 *     if (rlk_connect(&o, &c) != RLK_OK) { fprintf(stderr, "%s\n", rlk_error(NULL)); return 1; }
 *     float obs[4], action[1];           // sizes: rlk_obs_size(c), rlk_action_size(c)
 *     env_reset(obs);
 *     for (;;) {
 *         if (rlk_act(c, obs, action) != RLK_OK) break;  // sends obs only for a new episode
 *         env_step(action, obs, &reward, &terminated, &truncated);
 *         if (rlk_step(c, reward, obs, terminated, truncated) != RLK_OK) break;
 *         if (terminated || truncated) env_reset(obs);   // the next rlk_act starts anew
 *     }
 *     rlk_close(c);
 *
 * rlk_act_batch / rlk_step_batch do the same for agents 0..n-1 at once (n <= max_agents).
 *
 * Client-side inference (options.client_inference = 1, shared-memory addresses): the same calls,
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
 * again into the new ring, and the episodes in progress go on. A policy with memory (an LSTM
 * or GRU cell) keeps each agent's state here: zeros when its episode opens, then the cell's
 * output after each action; records carry it on the daemon's state grid. Networks other than
 * an MLP over a flat float Box (images, action masks, discrete observations) and frozen
 * models fail rlk_connect with RLK_E_UNSUPPORTED: use server-side inference for those.
 * Memory: the network's values for max_agents rows (at most 256 MiB, else RLK_E_LIMIT), the
 * weights (at most 64 Mi floats), and the staged records of one sample (at most 64 MiB and
 * the ring's capacity, but at least 4 records per agent); a sample is written into the ring
 * all at once. A sample that fails for good (not retried, or reconnecting gave up) is dropped and the
 * open episodes are abandoned: each agent starts a new one at its next rlk_act.
 *
 * Errors: no function aborts or exits; each returns an rlk_status (0 = RLK_OK) and
 * rlk_error(c) describes the last failure on c. A failed rlk_connect has no client:
 * rlk_error(NULL) is this thread's last rlk_connect failure (address and system reason; "" before
 * any, not cleared by a success). What a failed call leaves behind:
 *   RLK_E_ARG, RLK_E_STATE: nothing changed (fix the arguments / make the call that was due;
 *     repeating the same call after RLK_E_STATE fails again).
 *   RLK_E_IO, _TIMEOUT, _PROTOCOL, _SERVER, _LIMIT: the request's episodes are abandoned (the
 *     daemon ends them); call rlk_act_batch next with each environment's current observation:
 *     abandoned agents start new episodes from it (no reset needed), the others go on.
 *   RLK_E_CONNECT: as above, and reconnecting gave up; each later call tries once to connect,
 *     without backoff (it fails at once while the daemon is away). RLK_E_UNSUPPORTED: close.
 * A lost connection is re-established with exponential backoff (50 ms doubling to 2 s) for up
 * to reconnect_timeout_s, to the same address (over TCP the daemon must come back on the same
 * port; "shm:DIR" re-reads DIR/daemon.json); the episodes in progress go on (each restarts on
 * the daemon with the observation in hand; the reward of the step that was in flight is
 * lost). An ERROR reply from the daemon is RLK_E_SERVER (retried instead when it says the
 * daemon is shutting down or the connection was evicted).
 *
 * Memory: rlk_connect allocates the client and every buffer it will use, sized by the
 * options' limits and the spaces (client-side inference: also by the network, within the
 * limits below); nothing else is sized by server input: a reply longer than
 * max_frame_bytes, or with more JSON tokens than the limits allow, is refused (RLK_E_LIMIT /
 * RLK_E_PROTOCOL) before it is parsed. (Over shared memory each (re)connection maps the
 * daemon's lane area, after checking its header against the spaces and max_agents.)
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
    RLK_E_CONNECT = -2,      /* could not connect (or reconnect within reconnect_timeout_s; later calls try once) */
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
    const char *address;         /* "tcp://HOST:PORT", "unix:///PATH", "shm", "shm:STATE_DIR", ... (required) */
    const char *token;           /* the daemon's server.token, or NULL */
    const char *policy_id;       /* act with this policy, or NULL (the daemon's mapping) */
    int evaluate;                /* 1: evaluation episodes (greedy actions, never trained) */
    int max_agents;              /* agents this client steps at once (default 1) */
    double io_timeout_s;         /* longest wait for one reply (default 30) */
    double reconnect_timeout_s;  /* give up reconnecting after this long (default 60; 0: never reconnect) */
    size_t max_frame_bytes;      /* largest message either way (default 1 MiB) */
    int client_inference;        /* 1: run the policy here (shared-memory addresses only; see above) */
    unsigned long long seed;     /* client-side inference: the sampling seed (0: from pid and time) */
} rlk_options;

typedef struct rlk_client rlk_client;

/* Fill o with the defaults (address NULL: set it). */
void rlk_options_init(rlk_options *o);

/* Connect, handshake (PING with the token, GET_CONFIG) and read the spaces. On success
 * *out is a new client (free it with rlk_close); on failure *out is NULL and rlk_error(NULL)
 * says why (in this thread). */
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
/* The last failure on c, "" when none; valid until the next call on c. NULL: this thread's
 * last failed rlk_connect (with the address and the system's reason), "" before any. */
const char *rlk_error(const rlk_client *c);
/* "RLK_OK", "RLK_E_IO", ... */
const char *rlk_status_name(rlk_status s);

#ifdef __cplusplus
}
#endif
#endif /* RLINKD_H */
