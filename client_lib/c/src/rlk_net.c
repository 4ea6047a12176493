/* rlk_net.c - RLlink frames over TCP / Unix stream sockets (contract in rlk_net.h). */
#define _GNU_SOURCE /* (MSG_CMSG_CLOEXEC) */
#include "rlk_net.h"
#include "rlk_declared.h"  /* RLK_FD_BYTE */

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#ifndef MSG_CMSG_CLOEXEC
#define MSG_CMSG_CLOEXEC 0
#endif
#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0 /* (platforms without it: the caller ignores SIGPIPE) */
#endif

double rlk_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Wait until fd is ready for events or the deadline: 1 ready, 0 deadline, -1 error. */
static int wait_fd(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - rlk_now();
        if (left <= 0) return 0;
        struct pollfd p = {fd, events, 0};
        int r = poll(&p, 1, (int)(left * 1000.0) + 1);
        if (r > 0) return (p.revents & (events | POLLHUP | POLLERR)) ? 1 : -1;
        if (r == 0) continue;
        if (errno != EINTR) return -1;
    }
}

static int finish_connect(int fd, const struct sockaddr *addr, socklen_t n, double timeout_s) {
    int flags = fcntl(fd, F_GETFL, 0);
    if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return -1;
    if (connect(fd, addr, n) != 0) {
        if (errno != EINPROGRESS) return -1;
        int r = wait_fd(fd, POLLOUT, rlk_now() + timeout_s);
        if (r != 1) {
            if (r == 0) errno = ETIMEDOUT;
            return -1;
        }
        int soerr = 0;  /* (the non-blocking connect's outcome: errno still says EINPROGRESS) */
        socklen_t len = sizeof soerr;
        if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0) return -1;
        if (soerr != 0) {
            errno = soerr;
            return -1;
        }
    }
    return 0;  /* (the socket stays non-blocking: every read and write polls first) */
}

static int connect_unix(const char *path, double timeout_s, char *err, size_t cap) {
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof sa.sun_path) {
        snprintf(err, cap, "unix socket path too long: %s", path);
        return -2;
    }
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || finish_connect(fd, (struct sockaddr *)&sa, sizeof sa, timeout_s) != 0) {
        snprintf(err, cap, "cannot connect to unix://%s: %s", path, strerror(errno));
        if (fd >= 0) close(fd);  /* (after the message: close may change errno) */
        return -1;
    }
    return fd;
}

static int connect_tcp(const char *hostport, double timeout_s, char *err, size_t cap) {
    char host[256];
    const char *colon = strrchr(hostport, ':');
    if (!colon || colon == hostport || (size_t)(colon - hostport) >= sizeof host || !colon[1]) {
        snprintf(err, cap, "bad tcp address (want tcp://HOST:PORT): %s", hostport);
        return -2;
    }
    size_t n = (size_t)(colon - hostport), skip = 0;
    if (hostport[0] == '[' && n >= 2 && colon[-1] == ']') {  /* [IPv6]:PORT */
        skip = 1;
        n -= 2;
    }
    memcpy(host, hostport + skip, n);
    host[n] = '\0';
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(host, colon + 1, &hints, &res);
    if (gai != 0) {
        snprintf(err, cap, "cannot resolve %s: %s", hostport, gai_strerror(gai));
        return -1;
    }
    int fd = -1, why = 0;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0 || finish_connect(fd, a->ai_addr, a->ai_addrlen, timeout_s) != 0) {
            why = errno;  /* (kept: close and freeaddrinfo may change errno) */
            if (fd >= 0) close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        snprintf(err, cap, "cannot connect to tcp://%s: %s", hostport, strerror(why));
        return -1;
    }
    int one = 1;  /* requests without a reply must not wait for a delayed ACK */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

int rlk_net_connect(const char *address, double timeout_s, char *err, size_t err_cap) {
    if (strncmp(address, "tcp://", 6) == 0) return connect_tcp(address + 6, timeout_s, err, err_cap);
    if (strncmp(address, "unix://", 7) == 0) return connect_unix(address + 7, timeout_s, err, err_cap);
    snprintf(err, err_cap, "unsupported address (tcp://HOST:PORT or unix:///PATH): %s", address);
    return -2;
}

/* Send the iovecs whole (a frame's header and body in one segment: two sends made two
 * loopback packets, and the daemon read the header alone, then the body). */
static int send_iov(int fd, struct iovec *iov, int n, double deadline) {
    while (n > 0) {
        struct msghdr m;
        memset(&m, 0, sizeof m);
        m.msg_iov = iov;
        m.msg_iovlen = (size_t)n;
        ssize_t w = sendmsg(fd, &m, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
            int r = wait_fd(fd, POLLOUT, deadline);
            if (r <= 0) return r == 0 ? -2 : -1;
            continue;
        }
        for (; n > 0 && (size_t)w >= iov->iov_len; iov++, n--) w -= (ssize_t)iov->iov_len;
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + w;
            iov->iov_len -= (size_t)w;
        }
    }
    return 0;
}

int rlk_net_send(int fd, const char *body, size_t len, double timeout_s) {
    char header[RLK_HEADER_BYTES + 1];
    if (len > 99999999u) return -1;
    snprintf(header, sizeof header, "%08zu", len);
    struct iovec iov[2] = {{header, RLK_HEADER_BYTES}, {(void *)body, len}};
    return send_iov(fd, iov, 2, rlk_now() + timeout_s);
}

static int recv_bytes(int fd, char *p, size_t n, double deadline) {
    while (n > 0) {
        ssize_t got = recv(fd, p, n, 0);
        if (got > 0) {
            p += got;
            n -= (size_t)got;
            continue;
        }
        if (got == 0) return -1;  /* EOF */
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
        int r = wait_fd(fd, POLLIN, deadline);
        if (r <= 0) return r == 0 ? -2 : -1;
    }
    return 0;
}

int rlk_net_recv(int fd, char *buf, size_t cap, size_t *len, double timeout_s) {
    char header[RLK_HEADER_BYTES];
    double deadline = rlk_now() + timeout_s;
    int r = wait_fd(fd, POLLIN, deadline);  /* (a reply is rarely there yet: no recv that fails) */
    if (r <= 0) return r == 0 ? -2 : -1;
    r = recv_bytes(fd, header, RLK_HEADER_BYTES, deadline);
    if (r != 0) return r;
    size_t n = 0;
    for (int i = 0; i < RLK_HEADER_BYTES; i++) {
        if (header[i] < '0' || header[i] > '9') return -3;
        n = n * 10 + (size_t)(header[i] - '0');
    }
    if (n > cap) return -4;
    r = recv_bytes(fd, buf, n, deadline);
    if (r != 0) return r;
    *len = n;
    return 0;
}

#define MAX_FDS 4

/* Close the descriptors of a control message that is not the one expected. */
static void close_received(const struct cmsghdr *h) {
    size_t count = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    int got[MAX_FDS];
    if (count > MAX_FDS) count = MAX_FDS;  /* (the buffer holds no more) */
    memcpy(got, CMSG_DATA(h), count * sizeof(int));
    for (size_t k = 0; k < count; k++) close(got[k]);
}

int rlk_net_recv_fds(int sock, int *fds, int count, double timeout_s) {
    char byte;
    struct iovec iov = {&byte, 1};
    union { struct cmsghdr h; char buf[CMSG_SPACE(MAX_FDS * sizeof(int))]; } ctl;
    struct msghdr msg;
    if (count < 1 || count > MAX_FDS) return -1;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl.buf;
    msg.msg_controllen = sizeof ctl.buf;
    if (wait_fd(sock, POLLIN, rlk_now() + timeout_s) != 1 || recvmsg(sock, &msg, MSG_CMSG_CLOEXEC) != 1) return -1;
    struct cmsghdr *h = CMSG_FIRSTHDR(&msg);
    int rights = h && h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS;
    if (rights && h->cmsg_len == CMSG_LEN((size_t)count * sizeof(int)) && !(msg.msg_flags & MSG_CTRUNC) &&
        byte == RLK_FD_BYTE) {
        memcpy(fds, CMSG_DATA(h), (size_t)count * sizeof(int));
        return 0;
    }
    if (rights && h->cmsg_len > CMSG_LEN(0)) close_received(h);
    return -1;
}
