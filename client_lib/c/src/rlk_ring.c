/* rlk_ring.c - step ring, weights board and doorbell for client-side inference (contract in rlk_ring.h). */
#define _GNU_SOURCE /* (F_GET_SEALS) */
#include "rlk_ring.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rlk_net.h"

/* Ring and board magic, versions and header offsets: rlk_declared.h (shm/ring.py, shm/board.py). */
#define SIZE_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)

static size_t align_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

/* ------------------------------------------------------------------ records */
rlk_layout rlk_layout_flat(size_t obs_size, size_t act_size, size_t dist_size, size_t state_size) {
    rlk_layout l = {obs_size, act_size, dist_size, state_size, 0};
    l.record_bytes = align_up(RLK_REC_HEADER_BYTES + 4 * (obs_size + act_size + dist_size + state_size), 8);
    return l;
}

static int size_key(const char *s, const rlk_jtok *toks, int obj, const char *key, size_t *out) {
    double v;
    int t = rlk_json_get(s, toks, obj, key);
    if (t < 0 || rlk_json_num(s, &toks[t], &v) != 0 || !(v >= 0 && v <= 1e12) || v != floor(v)) return -1;
    *out = (size_t)v;
    return 0;
}

rlk_status rlk_layout_check(const char *s, const rlk_jtok *toks, int obj, const rlk_layout *want) {
    size_t act, dist, state = 0, bytes = want->record_bytes, elements = 1;
    int fields = obj >= 0 && toks[obj].type == RLK_J_OBJECT ? rlk_json_get(s, toks, obj, "obs_fields") : -1;
    if (fields < 0 || toks[fields].type != RLK_J_ARRAY || size_key(s, toks, obj, "action_size", &act) ||
        size_key(s, toks, obj, "dist_size", &dist))
        return RLK_E_PROTOCOL;
    if (rlk_json_get(s, toks, obj, "record_bytes") >= 0 && size_key(s, toks, obj, "record_bytes", &bytes)) return RLK_E_PROTOCOL;
    if (rlk_json_get(s, toks, obj, "state_size") >= 0 && size_key(s, toks, obj, "state_size", &state)) return RLK_E_PROTOCOL;
    int field = fields + 1;
    if (toks[fields].count != 1 || toks[field].type != RLK_J_ARRAY || toks[field].count != 3 ||
        !rlk_json_str_eq(s, &toks[toks[field + 1].next], "<f4"))
        return RLK_E_UNSUPPORTED;
    int shape = toks[toks[field + 1].next].next;
    if (toks[shape].type != RLK_J_ARRAY) return RLK_E_PROTOCOL;
    for (int k = 0, i = shape + 1; k < toks[shape].count; k++, i = toks[i].next) {
        double d;
        if (rlk_json_num(s, &toks[i], &d) != 0 || !(d >= 1 && d <= RLK_MAX_OBS_FLOATS)) return RLK_E_PROTOCOL;
        elements *= (size_t)d;
        if (elements > RLK_MAX_OBS_FLOATS) return RLK_E_PROTOCOL;
    }
    int same = elements == want->obs_size && act == want->act_size && dist == want->dist_size &&
               state == want->state_size && bytes == want->record_bytes;
    return same ? RLK_OK : RLK_E_PROTOCOL;
}

void rlk_record_fill(unsigned char *rec, const rlk_layout *l, int flags, uint32_t slot, int64_t seq, float reward,
                     float logp, const float *obs, const float *action, const float *dist, const float *state) {
    size_t o = RLK_REC_HEADER_BYTES, a = o + 4 * l->obs_size, d = a + 4 * l->act_size, st = d + 4 * l->dist_size;
    memset(rec, 0, l->record_bytes);
    rec[0] = (unsigned char)flags;
    memcpy(rec + 4, &slot, 4);
    memcpy(rec + 8, &seq, 8);
    memcpy(rec + 24, &reward, 4);
    memcpy(rec + 28, &logp, 4);
    if (obs) memcpy(rec + o, obs, 4 * l->obs_size);
    if (action) memcpy(rec + a, action, 4 * l->act_size);
    if (dist) memcpy(rec + d, dist, 4 * l->dist_size);
    if (state) memcpy(rec + st, state, 4 * l->state_size);
}

/* ------------------------------------------------------------------ the ring */
struct rlk_ring {
    unsigned char *base, *records;
    size_t bytes, capacity, record_bytes;
    int doorbell;
};

static uint64_t *u64_at(unsigned char *base, size_t off) { return (uint64_t *)(void *)(base + off); }
static uint32_t *u32_at(unsigned char *base, size_t off) { return (uint32_t *)(void *)(base + off); }

/* The sealed memfd of our uid (its size can never change under the mapping). */
static rlk_status check_fd(int fd, struct stat *st) {
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode) || st->st_uid != getuid() || st->st_size <= (off_t)RLK_RING_HEADER_BYTES)
        return RLK_E_PROTOCOL;
    int seals = fcntl(fd, F_GET_SEALS);
    return seals >= 0 && (seals & SIZE_SEALS) == SIZE_SEALS ? RLK_OK : RLK_E_PROTOCOL;
}

static rlk_status check_ring(rlk_ring *r, const rlk_layout *want, rlk_jtok *toks, int max_toks) {
    unsigned char *b = r->base;
    uint64_t capacity = *u64_at(b, RLK_RING_AT_CAPACITY);
    uint32_t layout_bytes = *u32_at(b, RLK_RING_AT_LAYOUT_BYTES);
    if (memcmp(b, RLK_RING_MAGIC, 8) != 0 || *u32_at(b, RLK_RING_AT_LAYOUT_VERSION) != RLK_RING_LAYOUT_VERSION ||
        *u32_at(b, RLK_RING_AT_RECORD_BYTES) != want->record_bytes ||
        capacity < 1 || (capacity & (capacity - 1)) != 0 || capacity > (1u << 30) || layout_bytes > RLK_RING_MAX_LAYOUT_BYTES ||
        *u32_at(b, RLK_RING_AT_WRITER_PID) == 0)
        return RLK_E_PROTOCOL;
    size_t start = align_up(RLK_RING_HEADER_BYTES + layout_bytes, 64);
    if (start + capacity * want->record_bytes != r->bytes) return RLK_E_PROTOCOL;
    int n = rlk_json_parse((const char *)b + RLK_RING_HEADER_BYTES, layout_bytes, toks, max_toks);
    if (n < 1) return RLK_E_PROTOCOL;
    rlk_status st = rlk_layout_check((const char *)b + RLK_RING_HEADER_BYTES, toks, 0, want);
    if (st != RLK_OK) return st;
    r->records = b + start;
    r->capacity = (size_t)capacity;
    r->record_bytes = want->record_bytes;
    return RLK_OK;
}

rlk_status rlk_ring_attach(int ring_fd, const char *doorbell_path, const rlk_layout *want, rlk_jtok *toks,
                           int max_toks, rlk_ring **out, char *err, size_t cap) {
    struct stat st;
    rlk_ring *r = calloc(1, sizeof *r);
    rlk_status s = r ? check_fd(ring_fd, &st) : RLK_E_NOMEM;
    *out = NULL;
    if (r) r->doorbell = -1;
    if (s == RLK_OK) {
        r->bytes = (size_t)st.st_size;
        void *p = mmap(NULL, r->bytes, PROT_READ | PROT_WRITE, MAP_SHARED, ring_fd, 0);
        r->base = p == MAP_FAILED ? NULL : p;
        s = r->base ? check_ring(r, want, toks, max_toks) : RLK_E_IO;
    }
    close(ring_fd);  /* (the mapping keeps the memory) */
    if (s == RLK_OK && (r->doorbell = open(doorbell_path, O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW)) < 0) s = RLK_E_IO;
    if (s == RLK_OK && (fstat(r->doorbell, &st) != 0 || !S_ISFIFO(st.st_mode))) s = RLK_E_PROTOCOL;
    if (s != RLK_OK) {
        snprintf(err, cap, "cannot use the ring the daemon sent (%s)", rlk_status_name(s));
        rlk_ring_close(r);
        return s;
    }
    uint32_t pid = (uint32_t)getpid();
    memcpy(r->base + RLK_RING_AT_WRITER_PID, &pid, 4);
    *out = r;
    return RLK_OK;
}

void rlk_ring_close(rlk_ring *r) {
    if (!r) return;
    if (r->base) munmap(r->base, r->bytes);
    if (r->doorbell >= 0) close(r->doorbell);
    free(r);
}

size_t rlk_ring_capacity(const rlk_ring *r) { return r->capacity; }

static size_t free_records(rlk_ring *r) {
    uint64_t tail = __atomic_load_n(u64_at(r->base, RLK_RING_AT_TAIL), __ATOMIC_RELAXED);
    uint64_t head = __atomic_load_n(u64_at(r->base, RLK_RING_AT_HEAD), __ATOMIC_ACQUIRE);
    uint64_t used = tail - head;
    return used > r->capacity ? 0 : r->capacity - (size_t)used;
}

/* Wait until n records fit: 0; 1 the socket is readable; -2 deadline; -1 poll failed. */
static int wait_space(rlk_ring *r, size_t n, int sock, double deadline) {
    int sleep_ms = 0;
    while (free_records(r) < n) {
        if (rlk_now() > deadline) return -2;
        struct pollfd p = {sock, POLLIN, 0};
        int got = poll(&p, 1, sleep_ms);
        if (got < 0 && errno != EINTR) return -1;
        if (got > 0) return 1;
        sleep_ms = sleep_ms ? (sleep_ms * 2 > 8 ? 8 : sleep_ms * 2) : 1;
    }
    return 0;
}

/* Ring the collector's FIFO doorbell: 0, or -1 when it has no reader any more (the collector
 * is gone). SIGPIPE is blocked for the write and a SIGPIPE it raised is consumed: a client
 * never dies of a daemon's death (the simulator may not ignore SIGPIPE). */
static int ring_doorbell(int fd) {
    sigset_t pipe_set, old, pending;
    struct timespec zero = {0, 0};
    uint64_t one = 1;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    sigpending(&pending);
    int was_pending = sigismember(&pending, SIGPIPE);
    int gone = write(fd, &one, sizeof one) < 0 && errno == EPIPE;
    if (gone && !was_pending) sigtimedwait(&pipe_set, NULL, &zero);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return gone ? -1 : 0;  /* (EAGAIN: a full FIFO already holds a wake-up) */
}

/* Copy n records into the slots after tail, then publish them (release) and wake the reader:
 * 0, or -1 when the collector is gone. */
static int publish(rlk_ring *r, const unsigned char *records, size_t n) {
    uint64_t *tail = u64_at(r->base, RLK_RING_AT_TAIL), t = __atomic_load_n(tail, __ATOMIC_RELAXED);
    size_t slot = (size_t)(t & (r->capacity - 1)), first = r->capacity - slot < n ? r->capacity - slot : n;
    memcpy(r->records + slot * r->record_bytes, records, first * r->record_bytes);
    memcpy(r->records, records + first * r->record_bytes, (n - first) * r->record_bytes);
    __atomic_store_n(tail, t + n, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);  /* (Dekker: the tail store above, the load below) */
    uint32_t *sleeping = u32_at(r->base, RLK_RING_AT_READER_SLEEPING);
    if (!__atomic_load_n(sleeping, __ATOMIC_RELAXED)) return 0;
    __atomic_store_n(sleeping, 0u, __ATOMIC_RELAXED);
    return ring_doorbell(r->doorbell);
}

int rlk_ring_write(rlk_ring *r, const unsigned char *records, size_t n, int sock, double timeout_s) {
    if (n > r->capacity) return -3;
    if (n == 0) return 0;
    int w = wait_space(r, n, sock, rlk_now() + timeout_s);
    return w != 0 ? w : publish(r, records, n);
}

/* ------------------------------------------------------------------ the weights board */
struct rlk_board {
    unsigned char *base;
    size_t bytes, n_params, stride;
};

static rlk_status check_board(rlk_board *b, size_t n_params) {
    unsigned char *p = b->base;
    uint64_t n = *u64_at(p, RLK_BOARD_AT_N_PARAMS);
    if (b->bytes < RLK_BOARD_BUFFERS_AT || memcmp(p, RLK_BOARD_MAGIC, 8) != 0 ||
        *u32_at(p, RLK_BOARD_AT_LAYOUT_VERSION) != RLK_BOARD_LAYOUT_VERSION ||
        *u32_at(p, RLK_BOARD_AT_SPEC_JSON_LEN) > RLK_BOARD_SPEC_CAPACITY ||
        *u32_at(p, RLK_BOARD_AT_WRITER_PID) == 0 || *u32_at(p, RLK_BOARD_AT_ACTIVE) > 1)
        return RLK_E_PROTOCOL;
    if (n != n_params) return RLK_E_UNSUPPORTED;
    b->n_params = n_params;
    b->stride = align_up(4 * n_params, 64);
    return b->bytes == RLK_BOARD_BUFFERS_AT + 2 * b->stride ? RLK_OK : RLK_E_PROTOCOL;
}

rlk_status rlk_board_attach(const char *path, size_t n_params, rlk_board **out, char *err, size_t cap) {
    struct stat st;
    rlk_board *b = calloc(1, sizeof *b);
    int fd = b ? open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC) : -1;
    rlk_status s = !b ? RLK_E_NOMEM : fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ? RLK_E_IO : RLK_OK;
    *out = NULL;
    if (s == RLK_OK) {
        b->bytes = (size_t)st.st_size;
        void *p = b->bytes >= RLK_BOARD_BUFFERS_AT ? mmap(NULL, b->bytes, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
        b->base = p == MAP_FAILED ? NULL : p;
        s = b->base ? check_board(b, n_params) : RLK_E_PROTOCOL;
    }
    if (fd >= 0) close(fd);
    if (s != RLK_OK) {
        snprintf(err, cap, "%s the weights board at %s", s == RLK_E_UNSUPPORTED ? "this network's weights are not on"
                 : s == RLK_E_IO ? "cannot open" : "a malformed header on", path);
        rlk_board_close(b);
        return s;
    }
    *out = b;
    return RLK_OK;
}

void rlk_board_close(rlk_board *b) {
    if (!b) return;
    if (b->base) munmap(b->base, b->bytes);
    free(b);
}

static int64_t buffer_seq(const rlk_board *b, uint32_t active) {
    return __atomic_load_n((int64_t *)(void *)(b->base + RLK_BOARD_AT_BUFFER_SEQ_NO + 8 * active), __ATOMIC_RELAXED);
}

int64_t rlk_board_latest(const rlk_board *b) {
    for (;;) {
        uint64_t before = __atomic_load_n(u64_at(b->base, RLK_BOARD_AT_SEQLOCK), __ATOMIC_ACQUIRE);
        int64_t seq = buffer_seq(b, __atomic_load_n(u32_at(b->base, RLK_BOARD_AT_ACTIVE), __ATOMIC_ACQUIRE) & 1u);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(u64_at(b->base, RLK_BOARD_AT_SEQLOCK), __ATOMIC_RELAXED) <= (before & ~1ull) + 2) return seq;
    }
}

int64_t rlk_board_read(const rlk_board *b, float *out) {
    for (int attempt = 1;; attempt++) {
        uint64_t before = __atomic_load_n(u64_at(b->base, RLK_BOARD_AT_SEQLOCK), __ATOMIC_ACQUIRE);
        uint32_t active = __atomic_load_n(u32_at(b->base, RLK_BOARD_AT_ACTIVE), __ATOMIC_ACQUIRE) & 1u;
        memcpy(out, b->base + RLK_BOARD_BUFFERS_AT + active * b->stride, 4 * b->n_params);
        int64_t seq = buffer_seq(b, active);
        __atomic_thread_fence(__ATOMIC_ACQUIRE);
        if (__atomic_load_n(u64_at(b->base, RLK_BOARD_AT_SEQLOCK), __ATOMIC_RELAXED) <= (before & ~1ull) + 2) return seq;
        if (attempt % 8 == 0) sched_yield();  /* (a publish in progress: let the learner finish it) */
    }
}
