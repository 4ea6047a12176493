/*
 * rlk_net.h - RLlink frames over a stream socket: connect (tcp:// or unix://), send one frame,
 * receive one frame, each bounded by a deadline and a size limit.
 *
 * Frame (both directions): an 8-byte header of ASCII decimal digits, zero-padded, giving the
 * body length, then the body (UTF-8 JSON):
 *
 *     offset 0        8                     8 + N
 *            +--------+---------------------+
 *            |00000042|{"type": "PING", ...}|
 *            +--------+---------------------+
 */
#ifndef RLK_NET_H
#define RLK_NET_H

#include <stddef.h>

#define RLK_HEADER_BYTES 8

/* Connect to "tcp://HOST:PORT" or "unix:///PATH" within timeout_s: the socket fd (TCP_NODELAY
 * set), or -1 with a reason in err (bad address: -2). */
int rlk_net_connect(const char *address, double timeout_s, char *err, size_t err_cap);

/* Send header + body; 0, or -1 (the connection is unusable) / -2 (deadline passed). */
int rlk_net_send(int fd, const char *body, size_t len, double timeout_s);

/* Receive one frame into buf (cap bytes): 0 with *len set, -1 connection lost, -2 deadline,
 * -3 malformed header, -4 body longer than cap (nothing read past the header). */
int rlk_net_recv(int fd, char *buf, size_t cap, size_t *len, double timeout_s);

/* The one data byte (0x01) a daemon sends after ATTACHED / SERVE_ATTACHED with exactly `count`
 * descriptors (SCM_RIGHTS, close-on-exec) into fds: 0, or -1 (EOF, deadline, another count:
 * whatever descriptors did arrive are closed). count <= 4. */
int rlk_net_recv_fds(int sock, int *fds, int count, double timeout_s);

/* Seconds on a monotonic clock. */
double rlk_now(void);

#endif /* RLK_NET_H */
