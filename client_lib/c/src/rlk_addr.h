/*
 * rlk_addr.h - the address grammar shared with client_lib's Python (client_lib/protocol/
 * addresses.py; both are checked against tests/addresses.tsv, one case a line):
 *
 *     tcp://HOST:PORT, tcp://HOST, HOST:PORT, HOST   TCP (port 5555 when left out; [::1] for IPv6)
 *     tls://HOST:PORT                                TLS (Python only: the C client refuses it)
 *     unix:///PATH                                   the daemon's Unix socket at PATH
 *     shm, shm:DIR, shm:///DIR                       shared memory with the daemon of state dir DIR
 *                                                    (default: $STATE_DIRECTORY, $XDG_STATE_HOME/rlinkd,
 *                                                    ~/.local/state/rlinkd), found through DIR/daemon.json
 *     shm:///PATH.sock, shm:PATH.sock                shared memory through the Unix socket PATH.sock
 *     auto, auto:DIR, auto:PATH.sock                 as shm when that daemon runs here, else tcp://127.0.0.1:5555
 *
 * A path after "shm:" / "auto:" names a socket when it ends in ".sock", else a state directory.
 */
#ifndef RLK_ADDR_H
#define RLK_ADDR_H

#include <stddef.h>

typedef enum { RLK_ADDR_TCP, RLK_ADDR_TLS, RLK_ADDR_UNIX, RLK_ADDR_SHM_SOCKET, RLK_ADDR_SHM_STATE,
               RLK_ADDR_AUTO_SOCKET, RLK_ADDR_AUTO_STATE } rlk_addr_kind;

typedef struct {
    rlk_addr_kind kind;
    char host[256];   /* tcp / tls: the host, without IPv6 brackets */
    int port;         /* tcp / tls */
    char path[512];   /* unix / *_SOCKET: the socket; *_STATE: the state dir ("" = the default) */
} rlk_addr;

/* Parse text by the grammar above: 0, or -1 with the reason in err. */
int rlk_addr_parse(const char *text, rlk_addr *a, char *err, size_t err_cap);

/* The canonical form the shared cases compare: "tcp HOST PORT", "tls HOST PORT", "unix PATH",
 * "shm-socket PATH", "shm-state DIR|-", "auto-socket PATH", "auto-state DIR|-". */
void rlk_addr_describe(const rlk_addr *a, char *out, size_t cap);

/* The state directory dir names ("" = the default) into out: 0, or -1 (no HOME, too long). */
int rlk_addr_state_dir(const char *dir, char *out, size_t cap);

/* The Unix socket of the daemon running in state dir dir ("" = the default), from its
 * daemon.json (whose pid must be alive): 0, or -1 with the reason (naming the file) in err. */
int rlk_addr_daemon_socket(const char *dir, char *out, size_t cap, char *err, size_t err_cap);

#endif /* RLK_ADDR_H */
