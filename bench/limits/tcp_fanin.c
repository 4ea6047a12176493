/*
 * tcp_fanin.c - the physical limit of the 64-client serving benchmark over TCP: N client
 * processes, one server process, loopback TCP, no policy, no JSON and no Python anywhere.
 *
 * Each client holds one connection (TCP_NODELAY, as client_lib and the C client set) and
 * in lockstep sends a REQUEST_BYTES frame and blocks until its REPLY_BYTES reply is in (the
 * sizes of a CartPole STEP and its reply: an RLlink 8-byte length header plus the JSON
 * body). The server, single-threaded on epoll as the inference role, reads every readable
 * connection, answers each complete frame with one send, and counts. Prints
 * {"clients": N, "round_trips_per_s": R}. With a PORT, only the clients: they connect to
 * 127.0.0.1:PORT (a server under test, e.g. a Python one) and run for SECONDS.
 *
 *     cc -O2 -o tcp_fanin tcp_fanin.c && ./tcp_fanin 64 5 [PORT]
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { REQUEST_BYTES = 8 + 150, REPLY_BYTES = 8 + 70, MAX_CLIENTS = 1024 };

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void no_delay(int fd) {
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) abort();
}

static int read_full(int fd, char *buf, size_t n) {
    for (size_t got = 0; got < n;) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r <= 0) return -1;
        got += (size_t)r;
    }
    return 0;
}

static void client(unsigned short port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) _exit(1);
    no_delay(fd);
    char req[REQUEST_BYTES], rep[REPLY_BYTES];
    memset(req, 'x', sizeof req);
    for (;;) {
        if (write(fd, req, sizeof req) != (ssize_t)sizeof req) _exit(0);
        if (read_full(fd, rep, sizeof rep) != 0) _exit(0);
    }
}

/* The clients alone, against a server under test on `port`, for `seconds`. */
static int clients_only(int n, unsigned short port, double seconds) {
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    for (int i = 0; i < n; i++)
        if ((pids[i] = fork()) == 0) client(port);
    struct timespec t = {.tv_sec = (time_t)seconds, .tv_nsec = (long)((seconds - (double)(time_t)seconds) * 1e9)};
    nanosleep(&t, NULL);
    for (int i = 0; i < n; i++) kill(pids[i], SIGKILL);
    for (int i = 0; i < n; i++) waitpid(pids[i], NULL, 0);
    return 0;
}

typedef struct { int fd; size_t have; } conn;

static unsigned long long serve(int ep, conn *conns, double seconds) {
    static char buf[1 << 16], reply[REPLY_BYTES];
    struct epoll_event ev[MAX_CLIENTS];
    unsigned long long answered = 0;
    for (double end = now() + seconds; now() < end;) {
        int k = epoll_wait(ep, ev, MAX_CLIENTS, 100);
        for (int i = 0; i < k; i++) {
            conn *c = &conns[ev[i].data.u32];
            ssize_t r = read(c->fd, buf, sizeof buf);
            if (r <= 0) continue;
            c->have += (size_t)r;
            for (; c->have >= REQUEST_BYTES; c->have -= REQUEST_BYTES, answered++)
                if (write(c->fd, reply, sizeof reply) != (ssize_t)sizeof reply) abort();
        }
    }
    return answered;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 64;
    double seconds = argc > 2 ? atof(argv[2]) : 5.0;
    if (n < 1 || n > MAX_CLIENTS || seconds <= 0) {
        fprintf(stderr, "usage: tcp_fanin CLIENTS SECONDS [PORT]\n");
        return 2;
    }
    if (argc > 3)
        return clients_only(n, (unsigned short)atoi(argv[3]), seconds);
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(lfd, (struct sockaddr *)&a, sizeof a) != 0 || listen(lfd, MAX_CLIENTS) != 0 ||
        getsockname(lfd, (struct sockaddr *)&a, &len) != 0) return 1;
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    conn *conns = calloc((size_t)n, sizeof *conns);
    int ep = epoll_create1(0);
    for (int i = 0; i < n; i++) {
        if ((pids[i] = fork()) == 0) client(ntohs(a.sin_port));
        conns[i].fd = accept(lfd, NULL, NULL);
        if (conns[i].fd < 0) return 1;
        no_delay(conns[i].fd);
        struct epoll_event e = {.events = EPOLLIN, .data.u32 = (unsigned)i};
        epoll_ctl(ep, EPOLL_CTL_ADD, conns[i].fd, &e);
    }
    serve(ep, conns, 0.5);                                        /* warm-up */
    double t0 = now();
    unsigned long long answered = serve(ep, conns, seconds);
    double rate = (double)answered / (now() - t0);
    for (int i = 0; i < n; i++) kill(pids[i], SIGKILL);
    for (int i = 0; i < n; i++) waitpid(pids[i], NULL, 0);
    printf("{\"clients\": %d, \"round_trips_per_s\": %.0f}\n", n, rate);
    return 0;
}
