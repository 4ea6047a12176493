/*
 * fanin.c - the physical limit of the 64-client serving benchmark: N client processes,
 * one server process, no policy and no Python anywhere.
 *
 * Each client owns one request/response word pair in shared memory and its own eventfd
 * (as a lane area's response doorbell); all share one request eventfd (as the inference
 * role's request doorbell). A client publishes a request, rings the shared doorbell if
 * the server sleeps, and sleeps on its own eventfd until answered (no spinning: as a
 * client_lib client with many peers on few cores). The server scans every word, answers
 * all pending requests in one pass, and rings each answered client that sleeps, with the
 * same Dekker handshakes as shm/lanes.py. Prints {"clients": N, "round_trips_per_s": R}.
 *
 *     cc -O2 -o fanin fanin.c && ./fanin 64 5
 */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct { _Atomic uint32_t req, resp, waiting, pad[13]; } slot;   /* one cache line */
typedef struct { _Atomic uint32_t server_sleeping, stop, pad[14]; _Atomic uint64_t answered; } head;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void ring(int fd) { uint64_t one = 1; if (write(fd, &one, 8) != 8) abort(); }
static void drain(int fd) { uint64_t v; if (read(fd, &v, 8) != 8) abort(); }

static void client(head *h, slot *s, int request_fd, int my_fd) {
    for (uint32_t seq = 1; !atomic_load(&h->stop); seq++) {
        atomic_store(&s->req, seq);
        if (atomic_load(&h->server_sleeping)) {               /* (seq_cst: the store, then this load) */
            atomic_store(&h->server_sleeping, 0);
            ring(request_fd);
        }
        while (atomic_load(&s->resp) != seq && !atomic_load(&h->stop)) {
            atomic_store(&s->waiting, 1);
            if (atomic_load(&s->resp) == seq) break;
            drain(my_fd);
        }
    }
    _exit(0);
}

static void serve(head *h, slot *slots, int n, int request_fd, const int *fds, double seconds) {
    double end = now() + seconds;
    while (now() < end) {
        int answered = 0;
        for (int i = 0; i < n; i++) {
            uint32_t req = atomic_load(&slots[i].req);
            if (req != atomic_load(&slots[i].resp)) { atomic_store(&slots[i].resp, req); answered++; }
        }
        for (int i = 0; answered && i < n; i++)
            if (atomic_load(&slots[i].waiting)) { atomic_store(&slots[i].waiting, 0); ring(fds[i]); }
        atomic_fetch_add(&h->answered, (uint64_t)answered);
        if (!answered) {
            atomic_store(&h->server_sleeping, 1);
            int pending = 0;
            for (int i = 0; i < n; i++) pending |= atomic_load(&slots[i].req) != atomic_load(&slots[i].resp);
            if (!pending) drain(request_fd);
            atomic_store(&h->server_sleeping, 0);
        }
    }
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 64;
    double seconds = argc > 2 ? atof(argv[2]) : 5.0;
    if (n < 1 || n > 4096 || seconds <= 0) { fprintf(stderr, "usage: fanin CLIENTS SECONDS\n"); return 2; }
    head *h = mmap(NULL, sizeof(head) + (size_t)n * sizeof(slot), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (h == MAP_FAILED) return 1;
    slot *slots = (slot *)(void *)(h + 1);
    int request_fd = eventfd(0, 0), *fds = calloc((size_t)n, sizeof *fds);
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    for (int i = 0; i < n; i++) fds[i] = eventfd(0, 0);
    for (int i = 0; i < n; i++)
        if ((pids[i] = fork()) == 0) client(h, &slots[i], request_fd, fds[i]);
    serve(h, slots, n, request_fd, fds, 0.5);                  /* warm-up */
    uint64_t before = atomic_load(&h->answered);
    double t0 = now();
    serve(h, slots, n, request_fd, fds, seconds);
    double rate = (double)(atomic_load(&h->answered) - before) / (now() - t0);
    atomic_store(&h->stop, 1);
    for (int i = 0; i < n; i++) ring(fds[i]);
    for (int i = 0; i < n; i++) waitpid(pids[i], NULL, 0);
    printf("{\"clients\": %d, \"round_trips_per_s\": %.0f}\n", n, rate);
    return 0;
}
