/*
 * rlk_client.c - the client: handshake, per-agent episode state, STEP_BATCH round trips and
 * reconnecting (public contract in rlinkd.h).
 *
 * Each agent is closed (no episode), open with a pending action (the last reply's, to be
 * returned by the next act) or open awaiting its step. A step that ends an episode is not sent
 * at once: its END entry travels first in the next request, so an episode boundary costs no
 * extra round trip. After a reconnect every open episode is "lost" on the daemon: its next
 * entry becomes a START with the observation in hand (the reward in flight is dropped).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rlinkd.h"
#include "rlk_addr.h"
#include "rlk_json.h"
#include "rlk_lanes.h"
#include "rlk_local.h"
#include "rlk_net.h"
#include "rlk_proto.h"

/* rlinkd.h's public limit is the daemon's STEP_BATCH limit (generated from serving.py): a
 * mismatch makes this array's size negative and the build fails (C99 has no static assert). */
typedef char rlk_max_agents_is_the_daemons[RLK_MAX_AGENTS == RLK_SERVING_MAX_BATCH_STEPS ? 1 : -1];

enum { ENTRY_START, ENTRY_STEP, ENTRY_END };

typedef struct {
    int open, pending, lost, end_deferred;
    char id[40];
    float reward;          /* of the step being sent, or of the deferred end */
    int terminated, truncated;
    long seq;
} agent;

typedef struct {
    int agent, kind;
    char id[40];  /* the episode id as sent (an end's is the old episode's) */
} entry;

struct rlk_client {
    rlk_options o;
    char address[512], token[256], policy[80];
    rlk_addr addr;      /* the address parsed (auto resolved to shm or tcp at rlk_connect) */
    int fd, reconnects, server_retry;
    int gave_up;        /* reconnecting gave up: later calls try once, without backoff */
    long episodes_started;
    char err[RLK_ERROR_CHARS];
    rlk_spaces sp;
    agent *agents;
    float *obs;       /* [max_agents, obs_size]: the observation of each agent's next entry */
    float *end_obs;   /* [max_agents, obs_size]: a deferred end's final observation */
    float *actions;   /* [max_agents, act_size]: each agent's pending action */
    entry *entries;   /* [2 * max_agents]: the request being built */
    entry *sent;      /* [2 * max_agents]: the request as sent */
    int n_entries;
    float *reply_actions;  /* [2 * max_agents, act_size] */
    long *reply_seqs;
    unsigned char *reply_null;
    char *out, *in;
    size_t frame_cap;
    rlk_jtok *toks;
    int max_toks;
    int shm;            /* "shm://" address: requests go through a lane area (or a ring) */
    unsigned long long seed; /* client-side inference: the sampling seed */
    rlk_lanes *lanes;   /* the current connection's lane area (shm only) */
    int *lane_list;     /* [2 * max_agents] scratch: asked lanes from the front, ends from the back */
    rlk_local *local;   /* client-side inference (options.client_inference): episodes, actor, ring */
};

static rlk_status set_err(rlk_client *c, rlk_status st, const char *fmt, const char *detail) {
    snprintf(c->err, sizeof c->err, fmt, detail);
    return st;
}

void rlk_options_init(rlk_options *o) {
    memset(o, 0, sizeof *o);
    o->max_agents = 1;
    o->io_timeout_s = 30.0;
    o->reconnect_timeout_s = 60.0;
    o->max_frame_bytes = 1u << 20;
}

/* ----------------------------------------------------------------- one message each way */
static rlk_reply_info info_of(rlk_client *c) {
    rlk_reply_info info = {c->err, sizeof c->err, 0};
    return info;
}

static rlk_status io_status(rlk_client *c, int r, const char *what) {
    if (r == -2) return set_err(c, RLK_E_TIMEOUT, "no reply within io_timeout_s (%s)", what);
    if (r == -3) return set_err(c, RLK_E_PROTOCOL, "malformed frame header (%s)", what);
    if (r == -4) return set_err(c, RLK_E_LIMIT, "reply larger than max_frame_bytes (%s)", what);
    return set_err(c, RLK_E_IO, "connection lost (%s)", what);
}

/* Send c->out[0..len) and, if want_reply, receive one frame into c->in (*got bytes). */
static rlk_status roundtrip(rlk_client *c, size_t len, int want_reply, size_t *got) {
    int r = rlk_net_send(c->fd, c->out, len, c->o.io_timeout_s);
    if (r != 0) return io_status(c, r, "send");
    if (!want_reply) return RLK_OK;
    r = rlk_net_recv(c->fd, c->in, c->frame_cap, got, c->o.io_timeout_s);
    return r == 0 ? RLK_OK : io_status(c, r, "receive");
}

/* PING (with the token) -> PONG, GET_CONFIG -> SET_CONFIG on a fresh connection. */
static rlk_status handshake(rlk_client *c, rlk_spaces *sp) {
    rlk_jw w;
    size_t got;
    rlk_reply_info info = info_of(c);
    rlk_jw_init(&w, c->out, c->frame_cap);
    rlk_jw_raw(&w, "{\"type\": \"" RLK_MSG_PING "\"");
    if (c->token[0]) {
        rlk_jw_raw(&w, ", \"token\": ");
        rlk_jw_str(&w, c->token);
    }
    rlk_jw_raw(&w, "}");
    rlk_status st = roundtrip(c, w.len, 1, &got);
    if (st == RLK_OK) st = rlk_parse_pong(c->in, got, c->toks, c->max_toks, &info);
    if (st != RLK_OK) return st;
    rlk_jw_init(&w, c->out, c->frame_cap);
    rlk_jw_raw(&w, "{\"type\": \"" RLK_MSG_GET_CONFIG "\"}");
    st = roundtrip(c, w.len, 1, &got);
    return st != RLK_OK ? st : rlk_parse_set_config(c->in, got, c->toks, c->max_toks, sp, &info);
}

/* SERVE_DIRECT -> SERVE_DIRECT_READY: the inference process answers this connection from now
 * on. An ERROR closes the connection; "direct serving refused" (the process has no room) is
 * retryable: reconnect()'s backoff decides. */
static rlk_status serve_direct(rlk_client *c) {
    rlk_jw w;
    size_t got;
    rlk_reply_info info = info_of(c);
    rlk_jw_init(&w, c->out, c->frame_cap);
    rlk_jw_raw(&w, "{\"type\": \"" RLK_MSG_SERVE_DIRECT "\"}");
    c->server_retry = 0;
    rlk_status st = roundtrip(c, w.len, 1, &got);
    if (st != RLK_OK) return st;
    st = rlk_parse_typed(c->in, got, c->toks, c->max_toks, RLK_MSG_SERVE_DIRECT_READY, &info);
    c->server_retry = info.retry;
    return st;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* A new connection; on a reconnect the spaces must be the ones the client started with. */
/* SERVE_ATTACH -> SERVE_ATTACHED + the lane area's descriptors (shm addresses). */
static rlk_status attach_lanes(rlk_client *c, const rlk_spaces *sp) {
    rlk_jw w;
    size_t got;
    rlk_jw_init(&w, c->out, c->frame_cap);
    rlk_jw_raw(&w, "{\"type\": \"" RLK_MSG_SERVE_ATTACH "\", \"pid\": ");
    rlk_jw_int(&w, (long)getpid());
    rlk_jw_raw(&w, ", \"lanes\": ");
    rlk_jw_int(&w, c->o.max_agents);
    if (c->policy[0]) {
        rlk_jw_raw(&w, ", \"policy\": ");
        rlk_jw_str(&w, c->policy);
    }
    rlk_jw_raw(&w, "}");
    rlk_status st = roundtrip(c, w.len, 1, &got);
    if (st != RLK_OK) return st;
    rlk_reply_info info = info_of(c);
    st = rlk_parse_typed(c->in, got, c->toks, c->max_toks, RLK_MSG_SERVE_ATTACHED, &info);
    if (st != RLK_OK) return st;
    return rlk_lanes_attach(c->fd, c->o.io_timeout_s, c->in, got, c->toks, c->max_toks, sp,
                            c->o.max_agents, &c->lanes, c->err, sizeof c->err);
}

/* ATTACH -> ATTACHED + the ring's descriptor: client-side inference on this connection. */
static rlk_status attach_ring(rlk_client *c, const rlk_spaces *sp) {
    rlk_jw w;
    size_t got;
    rlk_attached a;
    if (sp->max_agents && c->o.max_agents > sp->max_agents)  /* (each agent writes its own slot) */
        return set_err(c, RLK_E_UNSUPPORTED, "%s", "max_agents exceeds the daemon's server.max_agents_per_connection");
    rlk_status st = c->local ? RLK_OK : rlk_local_new(sp, c->o.max_agents, c->o.evaluate, c->seed, &c->local);
    if (st != RLK_OK) return st;
    rlk_jw_init(&w, c->out, c->frame_cap);
    rlk_jw_raw(&w, "{\"type\": \"" RLK_MSG_ATTACH "\", \"pid\": ");
    rlk_jw_int(&w, (long)getpid());
    if (!c->o.evaluate && RLK_STAGING_LEAST(c->o.max_agents) > 32768) {  /* (more than the daemon's default ring) */
        long records = 1;
        while ((size_t)records < RLK_STAGING_LEAST(c->o.max_agents)) records *= 2;
        rlk_jw_raw(&w, ", \"capacity_records\": ");
        rlk_jw_int(&w, records);
    }
    if (c->policy[0]) {
        rlk_jw_raw(&w, ", \"policy\": ");
        rlk_jw_str(&w, c->policy);
    }
    rlk_jw_raw(&w, "}");
    st = roundtrip(c, w.len, 1, &got);
    if (st != RLK_OK) return st;
    rlk_reply_info info = info_of(c);
    st = rlk_parse_attached(c->in, got, c->toks, c->max_toks, sp, c->o.max_agents, &a, &info);
    c->server_retry = info.retry;
    if (st != RLK_OK) return st;
    return rlk_local_attach(c->local, &a, c->fd, c->o.io_timeout_s, c->toks, c->max_toks, c->err, sizeof c->err);
}

/* The stream address to connect to now: a state dir's socket is read from its daemon.json
 * each time (a restarted daemon may have moved it). 0, or -1 with c->err set. */
static int stream_address(rlk_client *c, char *out, size_t cap) {
    char sock[sizeof c->addr.path];
    const rlk_addr *a = &c->addr;
    if (a->kind == RLK_ADDR_TCP)
        return snprintf(out, cap, strchr(a->host, ':') ? "tcp://[%s]:%d" : "tcp://%s:%d", a->host, a->port) < (int)cap
                   ? 0 : -1;
    if (a->kind != RLK_ADDR_SHM_STATE) return snprintf(out, cap, "unix://%s", a->path) < (int)cap ? 0 : -1;
    if (rlk_addr_daemon_socket(a->path, sock, sizeof sock, c->err, sizeof c->err) != 0) return -1;
    return snprintf(out, cap, "unix://%s", sock) < (int)cap ? 0 : -1;
}

static rlk_status open_connection(rlk_client *c) {
    rlk_spaces sp;
    char stream[sizeof c->addr.path + 16];
    if (stream_address(c, stream, sizeof stream) != 0) return RLK_E_CONNECT;
    int fd = rlk_net_connect(stream, c->o.io_timeout_s, c->err, sizeof c->err);
    if (fd < 0) return fd == -2 ? RLK_E_ARG : RLK_E_CONNECT;
    c->fd = fd;
    rlk_status st = handshake(c, &sp);
    if (st == RLK_OK && !c->shm) st = serve_direct(c);
    if (st == RLK_OK && c->sp.obs_size && (sp.obs_size != c->sp.obs_size || sp.act_size != c->sp.act_size))
        st = set_err(c, RLK_E_UNSUPPORTED, "%s", "the daemon's spaces changed across a reconnect");
    if (st == RLK_OK && c->shm && c->o.client_inference) st = attach_ring(c, &sp);
    else if (st == RLK_OK && c->shm) st = attach_lanes(c, &sp);
    if (st != RLK_OK) {
        close(c->fd);
        c->fd = -1;
        return st;
    }
    c->sp = sp;
    return RLK_OK;
}

/* Reconnect with backoff (50 ms doubling to 2 s) until reconnect_timeout_s; open episodes are
 * lost. After it gave up once, one try without backoff (the caller learns at once). */
static rlk_status reconnect(rlk_client *c) {
    double deadline = rlk_now() + (c->gave_up ? 0.0 : c->o.reconnect_timeout_s), delay = 0.05;
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    rlk_lanes_close(c->lanes);
    c->lanes = NULL;
    if (c->local) rlk_local_detach(c->local);
    for (int i = 0; c->agents && i < c->o.max_agents; i++) c->agents[i].lost = c->agents[i].open;
    for (;;) {
        rlk_status st = open_connection(c);
        if (st == RLK_OK) {
            c->reconnects++;
            c->gave_up = 0;
            return RLK_OK;
        }
        if (st == RLK_E_UNSUPPORTED || st == RLK_E_ARG || rlk_now() + delay > deadline) {
            char why[RLK_ERROR_CHARS - 64];  /* (c->err is the destination: copy it first) */
            memcpy(why, c->err, sizeof why - 1);
            why[sizeof why - 1] = '\0';
            if (st == RLK_E_UNSUPPORTED) return st;
            st = set_err(c, RLK_E_CONNECT, c->gave_up ? "gave up reconnecting earlier; one more try failed: %s"
                                                      : "gave up reconnecting after reconnect_timeout_s: %s", why);
            c->gave_up = 1;
            return st;
        }
        sleep_s(delay);
        delay = delay * 2 > 2.0 ? 2.0 : delay * 2;
    }
}

/* ----------------------------------------------------------------- STEP_BATCH */
static int write_obs(rlk_jw *w, const rlk_spaces *sp, const float *x, int dim, size_t *at) {
    if (sp->obs_rank == 0) return rlk_jw_num(w, x[(*at)++]);  /* (a scalar Box: a bare number) */
    rlk_jw_raw(w, "[");
    for (int k = 0; k < sp->obs_shape[dim]; k++) {
        if (k) rlk_jw_raw(w, ", ");
        if (dim + 1 < sp->obs_rank) {
            if (write_obs(w, sp, x, dim + 1, at) != 0) return -1;
        } else if (rlk_jw_num(w, x[(*at)++]) != 0) {
            return -1;
        }
    }
    rlk_jw_raw(w, "]");
    return 0;
}

/* One entry's JSON; -1 for a non-finite number. A lost agent's STEP becomes a START. */
static int write_entry(rlk_client *c, rlk_jw *w, const entry *e) {
    agent *a = &c->agents[e->agent];
    int end = e->kind == ENTRY_END, start = e->kind == ENTRY_START;
    const float *obs = (end ? c->end_obs : c->obs) + (size_t)e->agent * c->sp.obs_size;
    size_t at = 0;
    rlk_jw_raw(w, "{\"episode_id\": ");
    rlk_jw_str(w, e->id);
    rlk_jw_raw(w, ", \"observation\": ");
    if (write_obs(w, &c->sp, obs, 0, &at) != 0) return -1;
    if (start) {
        rlk_jw_raw(w, ", \"start\": true");
        if (c->o.evaluate) rlk_jw_raw(w, ", \"training_enabled\": false");
        if (c->policy[0]) {
            rlk_jw_raw(w, ", \"policy_id\": ");
            rlk_jw_str(w, c->policy);
        }
    } else {
        rlk_jw_raw(w, ", \"reward\": ");
        if (rlk_jw_num(w, a->reward) != 0) return -1;
        if (end) rlk_jw_raw(w, a->truncated && !a->terminated ? ", \"truncated\": true" : ", \"terminated\": true");
    }
    rlk_jw_raw(w, "}");
    return 0;
}

static void new_episode(rlk_client *c, agent *a) {
    snprintf(a->id, sizeof a->id, "c%ld-%ld", (long)getpid(), ++c->episodes_started);
    a->open = 1;
    a->lost = 0;
}

/* The entries as sent now: a lost agent's step restarts its episode, a lost end is dropped. */
static int prepare_entries(rlk_client *c, entry *sent) {
    int n = 0;
    for (int k = 0; k < c->n_entries; k++) {
        entry e = c->entries[k];
        agent *a = &c->agents[e.agent];
        if (e.kind == ENTRY_END && a->end_deferred == 2) {  /* (lost with the connection) */
            a->end_deferred = 0;
            continue;
        }
        if (e.kind != ENTRY_END && (a->lost || e.kind == ENTRY_START)) {
            e.kind = ENTRY_START;
            new_episode(c, a);
        }
        memcpy(e.id, a->id, sizeof e.id);
        sent[n++] = e;
    }
    return n;
}

static rlk_status encode(rlk_client *c, const entry *sent, int n, size_t *len) {
    rlk_jw w;
    rlk_jw_init(&w, c->out, c->frame_cap);
    rlk_jw_raw(&w, "{\"type\": \"" RLK_MSG_STEP_BATCH "\", \"steps\": [");
    for (int k = 0; k < n; k++) {
        if (k) rlk_jw_raw(&w, ", ");
        if (write_entry(c, &w, &sent[k]) != 0) return set_err(c, RLK_E_ARG, "%s", "a reward or observation is not finite");
    }
    rlk_jw_raw(&w, "]}");
    if (w.overflow) return set_err(c, RLK_E_LIMIT, "%s", "the request exceeds max_frame_bytes");
    *len = w.len;
    return RLK_OK;
}

/* The replies of the entries sent: actions become pending, ends are done. */
static rlk_status apply_reply(rlk_client *c, const entry *sent, int n, size_t got) {
    rlk_reply_info info = info_of(c);
    rlk_status st = rlk_parse_actions(c->in, got, c->toks, c->max_toks, &c->sp, n, c->reply_actions,
                                      c->reply_seqs, c->reply_null, &info);
    c->server_retry = info.retry;
    if (st != RLK_OK) return st;
    for (int k = 0; k < n; k++) {
        agent *a = &c->agents[sent[k].agent];
        if (sent[k].kind == ENTRY_END) {
            a->end_deferred = 0;
            continue;
        }
        if (c->reply_null[k]) return set_err(c, RLK_E_PROTOCOL, "%s", "no action for an open episode");
        memcpy(c->actions + (size_t)sent[k].agent * c->sp.act_size,
               c->reply_actions + (size_t)k * c->sp.act_size, c->sp.act_size * sizeof(float));
        a->pending = 1;
        a->seq = c->reply_seqs[k];
    }
    return RLK_OK;
}

static void add_entry(rlk_client *c, int agent_index, int kind) {
    c->entries[c->n_entries].agent = agent_index;
    c->entries[c->n_entries++].kind = kind;
}

/* Deferred ends go first in the next request. */
static void add_deferred_ends(rlk_client *c) {
    for (int i = 0; i < c->o.max_agents; i++)
        if (c->agents[i].end_deferred == 1) add_entry(c, i, ENTRY_END);
}

/* ----------------------------------------------------------------- the lane path (shm) */
/* The socket became readable while waiting on lanes: an ERROR (the daemon's last word) or EOF. */
static rlk_status socket_event(rlk_client *c) {
    size_t got;
    int r = rlk_net_recv(c->fd, c->in, c->frame_cap, &got, c->o.io_timeout_s);
    if (r != 0) return io_status(c, r, "lane wait");
    rlk_reply_info info = info_of(c);
    rlk_status st = rlk_parse_typed(c->in, got, c->toks, c->max_toks, "(nothing)", &info);
    c->server_retry = info.retry;
    return st;
}

static rlk_status wait_lanes(rlk_client *c, const int *lanes, int n) {
    int r = rlk_lanes_wait(c->lanes, lanes, n, c->fd, c->o.io_timeout_s);
    if (r == 1) return socket_event(c);
    return r == 0 ? RLK_OK : io_status(c, r, "lane wait");
}

/* Ends first (published alone, not waited for unless their lane is needed next), then one
 * group of the starts and steps, waited for; a lane the daemon lost restarts its episode. */
static rlk_status send_lanes(rlk_client *c, const entry *sent, int n, int *lost) {
    int asked = 0, ends = 0;
    for (int k = 0; k < n; k++) {
        int i = sent[k].agent;
        agent *a = &c->agents[i];
        rlk_status st = wait_lanes(c, &i, 1);
        if (st != RLK_OK) return st;
        if (sent[k].kind == ENTRY_END) {
            int flags = a->truncated && !a->terminated ? RLK_FLAG_TRUNCATED : RLK_FLAG_TERMINATED;
            rlk_lanes_write(c->lanes, i, RLK_OP_END, flags, a->reward, c->end_obs + (size_t)i * c->sp.obs_size);
            rlk_lanes_publish(c->lanes, &i, 1);
            a->end_deferred = 0;
            c->lane_list[2 * c->o.max_agents - 1 - ends++] = i;  /* (ends counted from the back) */
        }
    }
    for (int k = 0; k < n; k++) {
        int i = sent[k].agent, start = sent[k].kind == ENTRY_START;
        if (sent[k].kind == ENTRY_END) continue;
        rlk_status st = wait_lanes(c, &i, 1);  /* (this agent's end, published just above) */
        if (st != RLK_OK) return st;
        rlk_lanes_write(c->lanes, i, start ? RLK_OP_START : RLK_OP_STEP,
                        start && c->o.evaluate ? RLK_FLAG_EVALUATE : 0, c->agents[i].reward,
                        c->obs + (size_t)i * c->sp.obs_size);
        c->lane_list[asked++] = i;
    }
    if (!asked)  /* only ends (rlk_close): wait for them, so their last steps train */
        return ends ? wait_lanes(c, c->lane_list + 2 * c->o.max_agents - ends, ends) : RLK_OK;
    rlk_lanes_publish(c->lanes, c->lane_list, asked);
    rlk_status st = wait_lanes(c, c->lane_list, asked), refused = RLK_OK;
    for (int k = 0; st == RLK_OK && k < asked; k++) {  /* (every answer is read, even after a refusal) */
        int i = c->lane_list[k];
        int status = rlk_lanes_result(c->lanes, i, c->actions + (size_t)i * c->sp.act_size, &c->agents[i].seq);
        if (status == RLK_LANE_LOST) {
            c->agents[i].lost = 1;
            *lost = 1;
        } else if (status != RLK_LANE_OK) {
            snprintf(c->err, sizeof c->err, "the daemon refused a lane request (status %d: %s)", status,
                     status == RLK_LANE_BAD_OBS ? "observation does not fit the space" : "operation out of order");
            refused = RLK_E_SERVER;
        } else {
            c->agents[i].pending = 1;
        }
    }
    return st != RLK_OK ? st : refused;
}

/* A request that failed for good: its ends are dropped and its agents start a new episode at
 * their next rlk_act (the daemon ends the abandoned ones when the connection goes). */
static rlk_status abandon(rlk_client *c, const entry *sent, int n, rlk_status st) {
    for (int k = 0; k < n; k++) {
        agent *a = &c->agents[sent[k].agent];
        if (sent[k].kind == ENTRY_END) {
            a->end_deferred = 0;
        } else if (!a->pending) {
            a->open = a->lost = 0;
        }
    }
    c->n_entries = 0;
    return st;
}

/* Send the built entries (retrying through reconnects) and apply the reply. */
static rlk_status flush(rlk_client *c) {
    for (int lost_rounds = 0;;) {
        int n = prepare_entries(c, c->sent), lost = 0;
        size_t len, got;
        c->server_retry = 0;
        rlk_status st = RLK_OK;
        if (c->lanes) {
            st = send_lanes(c, c->sent, n, &lost);
            if (st == RLK_OK && lost && ++lost_rounds >= 3)
                st = set_err(c, RLK_E_SERVER, "%s", "the daemon lost the same episodes three times in a row");
            if (st == RLK_OK && lost) {  /* (a lost agent's step restarts) */
                c->n_entries = 0;
                for (int k = 0; k < n; k++)
                    if (c->sent[k].kind != ENTRY_END && c->agents[c->sent[k].agent].lost)
                        add_entry(c, c->sent[k].agent, ENTRY_STEP);
                continue;
            }
        } else {
            st = encode(c, c->sent, n, &len);
            if (st == RLK_OK) st = roundtrip(c, len, 1, &got);
            if (st == RLK_OK) st = apply_reply(c, c->sent, n, got);
        }
        int retry = st == RLK_E_IO || st == RLK_E_TIMEOUT || (st == RLK_E_SERVER && c->server_retry);
        if (st == RLK_OK) {
            c->n_entries = 0;
            return st;
        }
        if (!retry || c->o.reconnect_timeout_s <= 0) return abandon(c, c->sent, n, st);
        for (int i = 0; i < c->o.max_agents; i++)  /* the deferred ends died with the connection */
            if (c->agents[i].end_deferred) c->agents[i].end_deferred = 2;
        st = reconnect(c);
        if (st != RLK_OK) return abandon(c, c->sent, n, st);
    }
}

/* ----------------------------------------------------------------- client-side inference */
/* rlk_ring_write's / rlk_local_write's result as a status. */
static rlk_status ring_status(rlk_client *c, int r) {
    if (r == 1) return socket_event(c);
    if (r == -2) return set_err(c, RLK_E_TIMEOUT, "%s", "the ring stayed full for io_timeout_s");
    if (r == -3) return set_err(c, RLK_E_LIMIT, "%s", "a sample larger than the daemon's ring");
    return r == 0 ? RLK_OK : set_err(c, RLK_E_IO, "%s", "the ring is gone (connection lost)");
}

/* SAMPLE_READY -> WEIGHTS_READY (get_state 0: no reply awaited); *sent once the request is out. */
static rlk_status sample_ready(rlk_client *c, int get_state, int *sent) {
    rlk_jw w;
    size_t got;
    long seq;
    double epsilon;
    rlk_jw_init(&w, c->out, c->frame_cap);
    rlk_jw_raw(&w, "{\"type\": \"" RLK_MSG_SAMPLE_READY "\", \"env_steps\": ");
    rlk_jw_int(&w, rlk_local_staged_steps(c->local));
    rlk_jw_raw(&w, get_state ? ", \"get_state\": true}" : ", \"get_state\": false}");
    int r = rlk_net_send(c->fd, c->out, w.len, c->o.io_timeout_s);
    if (r != 0) return io_status(c, r, "send");
    *sent = 1;
    if (!get_state) return RLK_OK;
    r = rlk_net_recv(c->fd, c->in, c->frame_cap, &got, c->o.io_timeout_s);
    rlk_status st = r == 0 ? RLK_OK : io_status(c, r, "receive");
    if (st != RLK_OK) return st;
    rlk_reply_info info = info_of(c);
    st = rlk_parse_weights_ready(c->in, got, c->toks, c->max_toks, rlk_local_policy(c->local), &seq, &epsilon, &info);
    c->server_retry = info.retry;
    if (st == RLK_OK) rlk_local_synced(c->local, seq, epsilon);
    return st;
}

/* A sample that failed for good: its records are dropped, the open episodes abandoned (new
 * ones start at the next act) and the connection closed, so that the daemon ends its streams;
 * the next sample reconnects. */
static rlk_status abandon_local(rlk_client *c, rlk_status st) {
    rlk_local_abandon(c->local);
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    rlk_local_detach(c->local);
    return st;
}

/* Cut the fragments, write the staged records into the ring (all at once) and exchange
 * SAMPLE_READY / WEIGHTS_READY, through reconnects for up to reconnect_timeout_s. After a lost
 * connection the records are written again into the new ring (the daemon that had them is
 * gone); after a reply that timed out they are not (the daemon has them: no step twice). */
static rlk_status local_sample(rlk_client *c) {
    double deadline = rlk_now() + c->o.reconnect_timeout_s;
    rlk_local_cut(c->local);
    for (;;) {
        int sent = 0;
        c->server_retry = 0;
        rlk_status st = c->fd < 0 ? set_err(c, RLK_E_IO, "%s", "not connected") : RLK_OK;
        if (st == RLK_OK) st = ring_status(c, rlk_local_write(c->local, c->fd, c->o.io_timeout_s));
        if (st == RLK_OK) st = sample_ready(c, 1, &sent);
        if (st == RLK_OK) return st;
        int retry = st == RLK_E_IO || st == RLK_E_TIMEOUT || (st == RLK_E_SERVER && c->server_retry);
        if (sent && st == RLK_E_TIMEOUT) rlk_local_drop(c->local);
        if (!retry || c->o.reconnect_timeout_s <= 0 || rlk_now() > deadline) return abandon_local(c, st);
        if ((st = reconnect(c)) != RLK_OK) return abandon_local(c, st);
        if (rlk_local_staged_steps(c->local) == 0) return RLK_OK;  /* (delivered before the timeout) */
    }
}

/* Evaluation: newer weights for the next episodes, and the finished ones reported, as many
 * messages as max_frame_bytes needs (a report lost with the connection is not re-sent). */
static rlk_status local_report(rlk_client *c) {
    rlk_jw w;
    rlk_status st = RLK_OK;
    int per_message = (int)((c->frame_cap - 64) / 160), left = 1;  /* (an entry is < 160 bytes) */
    rlk_local_refresh(c->local);
    while (st == RLK_OK && left > 0) {
        rlk_jw_init(&w, c->out, c->frame_cap);
        left = rlk_local_eval_results(c->local, &w, per_message);
        st = c->fd < 0 ? RLK_E_IO : w.overflow ? RLK_E_LIMIT : roundtrip(c, w.len, 0, NULL);
    }
    if ((st == RLK_E_IO || st == RLK_E_TIMEOUT) && c->o.reconnect_timeout_s > 0) st = reconnect(c);
    return st;
}

static rlk_status local_step(rlk_client *c, int n, const float *rewards, const float *next_obs,
                             const unsigned char *terminated, const unsigned char *truncated) {
    int due, ended;
    if (!rlk_local_can_step(c->local, n)) return set_err(c, RLK_E_STATE, "%s", "rlk_step without a preceding rlk_act");
    rlk_status st = rlk_local_room(c->local, n) ? RLK_OK : local_sample(c);  /* (staging full: sample now) */
    if (st != RLK_OK) return st;  /* (the episodes were abandoned: these outcomes end with them) */
    rlk_local_step(c->local, n, rewards, next_obs, terminated, truncated, &due, &ended);
    if (due) st = local_sample(c);
    if (st == RLK_OK && ended && c->o.evaluate) st = local_report(c);
    if (st != RLK_E_UNSUPPORTED) rlk_local_next(c->local, n);  /* (the next actions, newest weights) */
    return st;
}

static int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* ----------------------------------------------------------------- public API */
rlk_status rlk_act_batch(rlk_client *c, int n, const float *obs, float *actions) {
    if (!c || !obs || !actions || n < 1 || n > c->o.max_agents) return c ? set_err(c, RLK_E_ARG, "%s", "bad arguments to rlk_act_batch") : RLK_E_ARG;
    size_t os = c->sp.obs_size, as = c->sp.act_size;
    if (!all_finite(obs, (size_t)n * os)) return set_err(c, RLK_E_ARG, "%s", "an observation is not finite");
    if (c->local)
        return rlk_local_act(c->local, n, obs, actions) == RLK_OK ? RLK_OK
               : set_err(c, RLK_E_STATE, "%s", "rlk_act again before rlk_step");
    c->n_entries = 0;
    int starts = 0;
    for (int i = 0; i < n; i++) {
        agent *a = &c->agents[i];
        if (a->open && !a->pending) return set_err(c, RLK_E_STATE, "%s", "rlk_act again before rlk_step");
        if (!a->open) {
            memcpy(c->obs + (size_t)i * os, obs + (size_t)i * os, os * sizeof(float));
            starts++;
        }
    }
    if (starts) {
        add_deferred_ends(c);
        for (int i = 0; i < n; i++)
            if (!c->agents[i].open) add_entry(c, i, ENTRY_START);
        rlk_status st = flush(c);
        if (st != RLK_OK) return st;
    }
    for (int i = 0; i < n; i++) {
        memcpy(actions + (size_t)i * as, c->actions + (size_t)i * as, as * sizeof(float));
        c->agents[i].pending = 0;
    }
    return RLK_OK;
}

rlk_status rlk_step_batch(rlk_client *c, int n, const float *rewards, const float *next_obs,
                          const unsigned char *terminated, const unsigned char *truncated) {
    if (!c || !rewards || !next_obs || !terminated || !truncated || n < 1 || n > c->o.max_agents)
        return c ? set_err(c, RLK_E_ARG, "%s", "bad arguments to rlk_step_batch") : RLK_E_ARG;
    size_t os = c->sp.obs_size;
    if (!all_finite(rewards, (size_t)n) || !all_finite(next_obs, (size_t)n * os))
        return set_err(c, RLK_E_ARG, "%s", "a reward or observation is not finite");
    if (c->local) return local_step(c, n, rewards, next_obs, terminated, truncated);
    for (int i = 0; i < n; i++)
        if (!c->agents[i].open || c->agents[i].pending)
            return set_err(c, RLK_E_STATE, "%s", "rlk_step without a preceding rlk_act");
    int steps = 0;
    for (int i = 0; i < n; i++) {
        agent *a = &c->agents[i];
        int done = terminated[i] || truncated[i];
        a->reward = rewards[i];
        a->terminated = terminated[i] != 0;
        a->truncated = truncated[i] != 0;
        memcpy((done ? c->end_obs : c->obs) + (size_t)i * os, next_obs + (size_t)i * os, os * sizeof(float));
        if (done) {
            a->open = 0;
            a->end_deferred = a->lost ? 0 : 1;  /* (a lost episode has nothing left to end) */
        } else {
            steps++;
        }
    }
    if (!steps) return RLK_OK;  /* every agent ended: the ends wait for the next request */
    c->n_entries = 0;
    add_deferred_ends(c);
    for (int i = 0; i < n; i++)
        if (c->agents[i].open) add_entry(c, i, ENTRY_STEP);
    return flush(c);
}

rlk_status rlk_act(rlk_client *c, const float *obs, float *action) { return rlk_act_batch(c, 1, obs, action); }

rlk_status rlk_step(rlk_client *c, float reward, const float *next_obs, int terminated, int truncated) {
    unsigned char term = terminated != 0, trunc = truncated != 0;
    return rlk_step_batch(c, 1, &reward, next_obs, &term, &trunc);
}

/* ----------------------------------------------------------------- life cycle */
/* The frame buffers and the token pool (before the handshake). A reply whose JSON averages
 * fewer than 8 bytes per token beyond the pool is refused with RLK_E_LIMIT. */
static rlk_status allocate_frames(rlk_client *c) {
    c->frame_cap = c->o.max_frame_bytes;
    c->max_toks = (int)(c->frame_cap / 8 + 256);
    c->out = malloc(c->frame_cap);
    c->in = malloc(c->frame_cap);
    c->toks = calloc((size_t)c->max_toks, sizeof *c->toks);
    return c->out && c->in && c->toks ? RLK_OK : RLK_E_NOMEM;
}

/* The per-agent state, sized by the spaces the handshake read. */
static rlk_status allocate_agents(rlk_client *c) {
    size_t m = (size_t)c->o.max_agents, os = c->sp.obs_size, as = c->sp.act_size;
    c->agents = calloc(m, sizeof *c->agents);
    c->entries = calloc(2 * m, sizeof *c->entries);
    c->sent = calloc(2 * m, sizeof *c->sent);
    c->obs = calloc(m * os, sizeof(float));
    c->end_obs = calloc(m * os, sizeof(float));
    c->actions = calloc(m * as, sizeof(float));
    c->reply_actions = calloc(2 * m * as, sizeof(float));
    c->reply_seqs = calloc(2 * m, sizeof(long));
    c->reply_null = calloc(2 * m, 1);
    c->lane_list = calloc(2 * m, sizeof(int));
    if (!(c->lane_list && c->agents && c->entries && c->sent && c->obs && c->end_obs && c->actions &&
          c->reply_actions && c->reply_seqs && c->reply_null))
        return RLK_E_NOMEM;
    for (size_t i = 0; i < m; i++) c->agents[i].seq = -1;
    return RLK_OK;
}

static void release(rlk_client *c) {
    rlk_lanes_close(c->lanes);
    rlk_local_free(c->local);
    void *parts[] = {c->agents, c->entries, c->sent, c->obs, c->end_obs, c->actions, c->reply_actions,
                     c->reply_seqs, c->reply_null, c->out, c->in, c->toks, c->lane_list};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) free(parts[i]);
    free(c);
}

static int copy_str(char *dst, size_t cap, const char *src) {
    if (!src) {
        dst[0] = '\0';
        return 0;
    }
    if (strlen(src) >= cap) return -1;
    strcpy(dst, src);
    return 0;
}

/* What is wrong with o, or NULL. */
static const char *options_problem(const rlk_options *o) {
    if (!o || !o->address) return "options or options->address is NULL";
    if (o->max_agents < 1 || o->max_agents > RLK_MAX_AGENTS) return "max_agents is not in 1..RLK_MAX_AGENTS";
    if (!(o->io_timeout_s > 0) || !(o->reconnect_timeout_s >= 0)) return "io_timeout_s <= 0 or reconnect_timeout_s < 0";
    if (o->max_frame_bytes < 1024 || o->max_frame_bytes > RLK_MAX_FRAME_BYTES)
        return "max_frame_bytes is not in 1024..RLK_MAX_FRAME_BYTES";
    return NULL;
}

/* The calling thread's last rlk_connect failure (rlk_error(NULL)). */
static __thread char connect_err[RLK_ERROR_CHARS];

static rlk_status connect_failed(rlk_client *c, rlk_status st, const char *why) {
    const char *detail = why ? why : c && c->err[0] ? c->err : rlk_status_name(st);
    const char *address = c ? c->o.address : "";
    if (!address[0] || strstr(detail, address))
        snprintf(connect_err, sizeof connect_err, "%s", detail);
    else
        snprintf(connect_err, sizeof connect_err, "%.100s: %.150s", address, detail);
    if (c && c->fd >= 0) close(c->fd);
    if (c) release(c);
    return st;
}

/* auto / auto:X: shared memory when that daemon runs here, else tcp://127.0.0.1:5555. */
static void resolve_auto(rlk_addr *a) {
    char sock[sizeof a->path], ignored[RLK_ERROR_CHARS];
    int state = a->kind == RLK_ADDR_AUTO_STATE;
    if (!state && a->kind != RLK_ADDR_AUTO_SOCKET) return;
    int here = state ? rlk_addr_daemon_socket(a->path, sock, sizeof sock, ignored, sizeof ignored) == 0
                     : access(a->path, F_OK) == 0;
    if (here) {
        a->kind = state ? RLK_ADDR_SHM_STATE : RLK_ADDR_SHM_SOCKET;
        return;
    }
    a->kind = RLK_ADDR_TCP;
    snprintf(a->host, sizeof a->host, "127.0.0.1");
    a->port = 5555;
}

rlk_status rlk_connect(const rlk_options *o, rlk_client **out) {
    if (!out) return connect_failed(NULL, RLK_E_ARG, "out is NULL");
    *out = NULL;
    const char *problem = options_problem(o);
    if (problem) return connect_failed(NULL, RLK_E_ARG, problem);
    rlk_client *c = calloc(1, sizeof *c);
    if (!c) return connect_failed(NULL, RLK_E_NOMEM, "cannot allocate the client");
    c->o = *o;
    c->fd = -1;
    if (rlk_addr_parse(o->address, &c->addr, c->err, sizeof c->err) != 0) return connect_failed(c, RLK_E_ARG, NULL);
    if (c->addr.kind == RLK_ADDR_TLS)
        return connect_failed(c, RLK_E_UNSUPPORTED, "tls:// addresses: the C client has no TLS (use tcp://, unix:// or shm)");
    resolve_auto(&c->addr);
    c->shm = c->addr.kind == RLK_ADDR_SHM_SOCKET || c->addr.kind == RLK_ADDR_SHM_STATE;
    c->seed = o->seed ? o->seed : (unsigned long long)getpid() * 2654435761ull ^ (unsigned long long)time(NULL);
    if (o->client_inference && !c->shm)  /* (client-side inference reads the weights board) */
        return connect_failed(c, RLK_E_ARG, "client_inference needs a shared-memory address (shm, shm:STATE_DIR, ...)");
    if (copy_str(c->address, sizeof c->address, o->address) || copy_str(c->token, sizeof c->token, o->token) ||
        copy_str(c->policy, sizeof c->policy, o->policy_id))
        return connect_failed(c, RLK_E_ARG, "address, token or policy_id too long");
    rlk_status st = allocate_frames(c);
    if (st == RLK_OK) st = open_connection(c);
    if (st == RLK_OK) st = allocate_agents(c);
    if (st != RLK_OK) return connect_failed(c, st, NULL);
    *out = c;
    return RLK_OK;
}

/* Client-side inference: the steps not yet sent, without waiting for weights (best effort). */
static void local_flush(rlk_client *c) {
    int sent = 0;
    rlk_local_cut(c->local);
    if (rlk_local_staged_steps(c->local) > 0 && rlk_local_write(c->local, c->fd, c->o.io_timeout_s) == 0)
        sample_ready(c, 0, &sent);
}

void rlk_close(rlk_client *c) {
    if (!c) return;
    if (c->fd >= 0 && c->local) {
        local_flush(c);
    } else if (c->fd >= 0 && c->agents) {  /* deliver the deferred ends (their rewards train), best effort */
        c->n_entries = 0;
        add_deferred_ends(c);
        if (c->n_entries) {
            c->o.reconnect_timeout_s = 0;
            flush(c);
        }
    }
    if (c->fd >= 0) close(c->fd);
    release(c);
}

size_t rlk_obs_size(const rlk_client *c) { return c ? c->sp.obs_size : 0; }
size_t rlk_action_size(const rlk_client *c) { return c ? c->sp.act_size : 0; }
int rlk_action_n(const rlk_client *c) { return c && c->sp.act_kind == RLK_ACT_DISCRETE ? c->sp.act_n : 0; }
long rlk_weights_seq_no(const rlk_client *c) {
    if (!c) return -1;
    return c->local ? rlk_local_seq(c->local, 0) : c->agents[0].seq;
}
int rlk_reconnects(const rlk_client *c) { return c ? c->reconnects : 0; }
const char *rlk_error(const rlk_client *c) { return c ? c->err : connect_err; }
