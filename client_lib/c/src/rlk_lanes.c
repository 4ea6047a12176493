/* rlk_lanes.c - shared-memory lanes for server-side actions (layout and contract in rlk_lanes.h). */
#define _GNU_SOURCE
#include "rlk_lanes.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rlk_net.h"

#define SPIN_S 250e-6      /* busy-wait up to this long for an answer, while answers come fast */
#define WAIT_EWMA 0.1      /* weight of the newest wait in wait_s */
#define WAIT_SLICE_MS 100

struct rlk_lanes {
    unsigned char *base;
    size_t bytes, lane_bytes, obs_offset, act_size, obs_size;
    unsigned char *lanes;  /* lane 0 */
    int capacity, fds[3];  /* area, request doorbell, response doorbell */
    uint32_t group;
    double wait_s;         /* EWMA of how long answers take: spin only while it is short */
};

static size_t align_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

static uint32_t *word(const rlk_lanes *l, size_t offset) { return (uint32_t *)(void *)(l->base + offset); }
static unsigned char *lane(const rlk_lanes *l, int i) { return l->lanes + (size_t)i * l->lane_bytes; }
static uint32_t *lane_word(const rlk_lanes *l, int i, size_t offset) { return (uint32_t *)(void *)(lane(l, i) + offset); }

/* A JSON number that is an integer in [lo, hi] into *out; -1 otherwise. */
static int bounded_int(const char *s, const rlk_jtok *t, double lo, double hi, size_t *out) {
    double v;
    if (rlk_json_num(s, t, &v) != 0 || !(v >= lo && v <= hi) || v != (double)(size_t)v) return -1;
    *out = (size_t)v;
    return 0;
}

/* The lane layout of SERVE_ATTACHED: lane_bytes and one "<f4" obs field of sp's size. */
static rlk_status read_layout(const char *s, const rlk_jtok *t, const rlk_spaces *sp, size_t *lane_bytes) {
    size_t actions;
    int layout = rlk_json_get(s, t, 0, "layout");
    int bytes = rlk_json_get(s, t, layout, "lane_bytes");
    int step = rlk_json_get(s, t, layout, "step_layout");
    int fields = rlk_json_get(s, t, step, "obs_fields");
    int action = rlk_json_get(s, t, step, "action_size");
    if (bytes < 0 || fields < 0 || action < 0 || bounded_int(s, &t[bytes], 64, 1 << 30, lane_bytes) != 0)
        return RLK_E_PROTOCOL;
    if (t[fields].type != RLK_J_ARRAY || t[fields].count != 1) return RLK_E_UNSUPPORTED;
    int field = fields + 1, dtype = field + 2;
    if (t[field].type != RLK_J_ARRAY || t[field].count != 3 || !rlk_json_str_eq(s, &t[dtype], "<f4"))
        return RLK_E_UNSUPPORTED;
    if (bounded_int(s, &t[action], 0, RLK_MAX_ACTION_FLOATS, &actions) != 0 || actions != sp->act_size)
        return RLK_E_PROTOCOL;
    return RLK_OK;
}

static rlk_status check_header(rlk_lanes *l, int lanes) {
    uint32_t version = *word(l, RLK_AREA_AT_LAYOUT_VERSION), lane_bytes = *word(l, RLK_AREA_AT_LANE_BYTES),
             capacity = *word(l, RLK_AREA_AT_CAPACITY), layout = *word(l, RLK_AREA_AT_LAYOUT_BYTES);
    if (l->bytes < RLK_LANE_HEADER_BYTES || memcmp(l->base, RLK_LANE_MAGIC, 8) != 0 || version != RLK_LANE_LAYOUT_VERSION ||
        lane_bytes != l->lane_bytes || lane_bytes % 64 != 0 || (int)capacity < lanes ||
        capacity > (SIZE_MAX - l->bytes) / lane_bytes)  /* (no size_t overflow below, even 32-bit) */
        return RLK_E_PROTOCOL;
    size_t start = *word(l, RLK_AREA_AT_LANES_OFFSET);  /* lanes_offset: past the header and the layout, 64-aligned */
    if (start < RLK_LANE_HEADER_BYTES + (size_t)layout || start % 64 != 0 ||
        start + (size_t)capacity * lane_bytes > l->bytes)
        return RLK_E_PROTOCOL;
    l->lanes = l->base + start;
    l->capacity = (int)capacity;
    return RLK_OK;
}

static rlk_status map_area(rlk_lanes *l, int lanes) {
    struct stat st;
    if (fstat(l->fds[0], &st) != 0 || st.st_size <= 0) return RLK_E_IO;
    l->bytes = (size_t)st.st_size;
    void *p = mmap(NULL, l->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, l->fds[0], 0);
    if (p == MAP_FAILED) return RLK_E_IO;
    l->base = p;
    rlk_status s = check_header(l, lanes);
    if (s == RLK_OK) *word(l, RLK_AREA_AT_WRITER_PID) = (uint32_t)getpid();
    return s;
}

rlk_status rlk_lanes_attach(int sock, double timeout_s, const char *s, size_t len, rlk_jtok *toks,
                            int max_toks, const rlk_spaces *sp, int lanes, rlk_lanes **out, char *err,
                            size_t cap) {
    rlk_lanes *l = calloc(1, sizeof *l);
    rlk_status st = RLK_E_NOMEM;
    *out = NULL;
    if (!l) return st;
    l->fds[0] = l->fds[1] = l->fds[2] = -1;
    if (rlk_net_recv_fds(sock, l->fds, 3, timeout_s) != 0) st = RLK_E_PROTOCOL;
    else if (rlk_json_parse(s, len, toks, max_toks) < 0) st = RLK_E_PROTOCOL;
    else st = read_layout(s, toks, sp, &l->lane_bytes);
    l->act_size = sp->act_size;
    l->obs_size = sp->obs_size;
    l->obs_offset = align_up(RLK_LANE_AT_ACTION + 4 * l->act_size, 8);
    if (st == RLK_OK && l->obs_offset + 4 * l->obs_size > l->lane_bytes) st = RLK_E_PROTOCOL;
    if (st == RLK_OK) st = map_area(l, lanes);
    if (st != RLK_OK) {
        snprintf(err, cap, "cannot use the daemon's lane area (%s)", rlk_status_name(st));
        rlk_lanes_close(l);
        return st;
    }
    *out = l;
    return RLK_OK;
}

void rlk_lanes_close(rlk_lanes *l) {
    if (!l) return;
    if (l->base) munmap(l->base, l->bytes);
    for (int i = 0; i < 3; i++)
        if (l->fds[i] >= 0) close(l->fds[i]);
    free(l);
}

void rlk_lanes_write(rlk_lanes *l, int i, int op, int flags, float reward, const float *obs) {
    unsigned char *p = lane(l, i);
    p[RLK_LANE_AT_OP] = (unsigned char)op;
    p[RLK_LANE_AT_FLAGS] = (unsigned char)flags;
    memcpy(p + RLK_LANE_AT_REWARD, &reward, sizeof reward);
    memcpy(p + l->obs_offset, obs, l->obs_size * sizeof(float));
}

void rlk_lanes_publish(rlk_lanes *l, const int *lanes, int n) {
    uint32_t group = 0;
    uint16_t size = (uint16_t)(n > 1 ? n : 0);
    if (n > 1 && ++l->group == 0) l->group = 1;  /* (0 means "no group") */
    if (n > 1) group = l->group;
    for (int k = 0; k < n; k++) {
        memcpy(lane(l, lanes[k]) + RLK_LANE_AT_GROUP_SIZE, &size, sizeof size);
        memcpy(lane(l, lanes[k]) + RLK_LANE_AT_GROUP, &group, sizeof group);
    }
    for (int k = 0; k < n; k++) {  /* data first, then each seq word (release) */
        uint32_t *seq = lane_word(l, lanes[k], RLK_LANE_AT_REQ_SEQ);
        __atomic_store_n(seq, __atomic_load_n(seq, __ATOMIC_RELAXED) + 1u, __ATOMIC_RELEASE);
    }
    uint64_t *requests = (uint64_t *)(void *)(l->base + RLK_AREA_AT_REQUESTS);
    __atomic_store_n(requests, __atomic_load_n(requests, __ATOMIC_RELAXED) + (uint64_t)n, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);  /* (Dekker: the store above, then the load below) */
    if (__atomic_load_n(word(l, RLK_AREA_AT_SERVER_SLEEPING), __ATOMIC_RELAXED)) {
        uint64_t one = 1;
        __atomic_store_n(word(l, RLK_AREA_AT_SERVER_SLEEPING), 0u, __ATOMIC_RELAXED);
        if (write(l->fds[1], &one, sizeof one) != (ssize_t)sizeof one) {
            /* (the eventfd cannot overflow from one client; a failed ring only delays) */
        }
    }
}

int rlk_lanes_answered(const rlk_lanes *l, int i) {
    uint32_t req = __atomic_load_n(lane_word(l, i, RLK_LANE_AT_REQ_SEQ), __ATOMIC_RELAXED);
    return __atomic_load_n(lane_word(l, i, RLK_LANE_AT_RESP_SEQ), __ATOMIC_ACQUIRE) == req;
}

static int all_answered(const rlk_lanes *l, const int *lanes, int n) {
    for (int k = 0; k < n; k++)
        if (!rlk_lanes_answered(l, lanes[k])) return 0;
    return 1;
}

static int wait_answers(rlk_lanes *l, const int *lanes, int n, int sock, double start, double timeout_s);

/* Spin for the answer only while recent answers came within about SPIN_S; otherwise (a busy
 * daemon, many clients on few cores) sleep at once and leave the CPU to the daemon. */
int rlk_lanes_wait(rlk_lanes *l, const int *lanes, int n, int sock, double timeout_s) {
    double start = rlk_now();
    int r = wait_answers(l, lanes, n, sock, start, timeout_s);
    double took = rlk_now() - start;
    l->wait_s += WAIT_EWMA * ((took < 2 * SPIN_S ? took : 2 * SPIN_S) - l->wait_s);
    return r;
}

static int wait_answers(rlk_lanes *l, const int *lanes, int n, int sock, double start, double timeout_s) {
    double deadline = start + timeout_s;
    if (l->wait_s < SPIN_S)
        while (rlk_now() - start < SPIN_S) {
            if (all_answered(l, lanes, n)) return 0;
            sched_yield();  /* a daemon role preempted on this core goes on meanwhile */
        }
    while (!all_answered(l, lanes, n)) {
        __atomic_store_n(word(l, RLK_AREA_AT_CLIENT_WAITING), 1u, __ATOMIC_RELAXED);  /* client_waiting, then fence, recheck */
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        if (all_answered(l, lanes, n)) break;
        if (rlk_now() > deadline) return -2;
        struct pollfd p[2] = {{l->fds[2], POLLIN, 0}, {sock, POLLIN, 0}};
        int r = poll(p, 2, WAIT_SLICE_MS);
        if (r < 0 && errno != EINTR) return -1;
        if (r > 0 && (p[1].revents & (POLLIN | POLLHUP | POLLERR))) return all_answered(l, lanes, n) ? 0 : 1;
        if (r > 0 && (p[0].revents & POLLIN)) {
            uint64_t drained;
            if (read(l->fds[2], &drained, sizeof drained) < 0 && errno != EAGAIN) return -1;
        }
    }
    return 0;
}

int rlk_lanes_result(const rlk_lanes *l, int i, float *action, long *seq) {
    const unsigned char *p = lane(l, i);
    int32_t status;
    int64_t version;
    memcpy(&status, p + RLK_LANE_AT_STATUS, sizeof status);
    memcpy(&version, p + RLK_LANE_AT_WEIGHTS_SEQ_NO, sizeof version);
    memcpy(action, p + RLK_LANE_AT_ACTION, l->act_size * sizeof(float));
    *seq = (long)version;
    return status;
}
