/* rlk_addr.c - the address grammar (contract and grammar in rlk_addr.h). */
#define _POSIX_C_SOURCE 200809L
#include "rlk_addr.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlk_json.h"

#define DEFAULT_PORT 5555

static int fail(char *err, size_t cap, const char *why, const char *text) {
    snprintf(err, cap, "%s: \"%s\" (see the address table in docs/c-client.md)", why, text);
    return -1;
}

static int copy(char *dst, size_t cap, const char *src, size_t n) {
    if (n >= cap) return -1;
    memcpy(dst, src, n);
    dst[n] = '\0';
    return 0;
}

static int ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), t = strlen(tail);
    return n >= t && strcmp(s + n - t, tail) == 0;
}

/* PORT: decimal digits, 0..65535. */
static int parse_port(const char *s, int *port) {
    long v = 0;
    if (!*s || strlen(s) > 5) return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return -1;
        v = v * 10 + (*s - '0');
    }
    *port = (int)v;
    return v <= 65535 ? 0 : -1;
}

/* HOST[:PORT] or [V6][:PORT] after tcp:// or tls:// (or bare). */
static int parse_host_port(const char *s, rlk_addr *a) {
    const char *host = s, *rest;
    size_t n;
    if (*s == '[') {
        const char *close = strchr(s, ']');
        if (!close) return -1;
        host = s + 1;
        n = (size_t)(close - host);
        rest = close + 1;
    } else {
        const char *colon = strchr(s, ':');
        n = colon ? (size_t)(colon - s) : strlen(s);
        rest = s + n;
    }
    if (n == 0 || copy(a->host, sizeof a->host, host, n) != 0 || strpbrk(a->host, "/@?#")) return -1;
    a->port = DEFAULT_PORT;
    if (*rest == '\0') return 0;
    return *rest == ':' ? parse_port(rest + 1, &a->port) : -1;
}

/* After "shm:" / "auto:": "///DIR" or "DIR" (a socket when it ends in ".sock"). */
static int parse_local(const char *where, rlk_addr *a, int is_auto) {
    if (strncmp(where, "//", 2) == 0) where += 2;
    if (!*where || copy(a->path, sizeof a->path, where, strlen(where)) != 0) return -1;
    int sock = ends_with(a->path, ".sock");
    a->kind = is_auto ? (sock ? RLK_ADDR_AUTO_SOCKET : RLK_ADDR_AUTO_STATE)
                      : (sock ? RLK_ADDR_SHM_SOCKET : RLK_ADDR_SHM_STATE);
    return 0;
}

int rlk_addr_parse(const char *text, rlk_addr *a, char *err, size_t err_cap) {
    memset(a, 0, sizeof *a);
    if (!text || !*text) return fail(err, err_cap, "empty address", "");
    if (!strcmp(text, "shm") || !strcmp(text, "auto")) {
        a->kind = text[0] == 's' ? RLK_ADDR_SHM_STATE : RLK_ADDR_AUTO_STATE;
        return 0;
    }
    if (!strncmp(text, "shm:", 4) || !strncmp(text, "auto:", 5)) {
        int is_auto = text[0] == 'a';
        if (parse_local(text + (is_auto ? 5 : 4), a, is_auto) == 0) return 0;
        return fail(err, err_cap, "bad local address (want shm, shm:STATE_DIR or shm:///PATH.sock)", text);
    }
    if (!strncmp(text, "unix://", 7)) {
        a->kind = RLK_ADDR_UNIX;
        if (text[7] && copy(a->path, sizeof a->path, text + 7, strlen(text + 7)) == 0) return 0;
        return fail(err, err_cap, "bad unix address (want unix:///PATH)", text);
    }
    const char *scheme_end = strstr(text, "://");
    a->kind = !strncmp(text, "tls://", 6) ? RLK_ADDR_TLS : RLK_ADDR_TCP;
    if (scheme_end && strncmp(text, "tcp://", 6) != 0 && a->kind != RLK_ADDR_TLS)
        return fail(err, err_cap, "unknown scheme (want tcp://, unix://, shm or auto)", text);
    if (parse_host_port(scheme_end ? scheme_end + 3 : text, a) == 0) return 0;
    return fail(err, err_cap, "bad tcp address (want tcp://HOST:PORT)", text);
}

void rlk_addr_describe(const rlk_addr *a, char *out, size_t cap) {
    static const char *const names[] = {"tcp", "tls", "unix", "shm-socket", "shm-state", "auto-socket",
                                        "auto-state"};
    if (a->kind == RLK_ADDR_TCP || a->kind == RLK_ADDR_TLS)
        snprintf(out, cap, "%s %s %d", names[a->kind], a->host, a->port);
    else
        snprintf(out, cap, "%s %s", names[a->kind], a->path[0] ? a->path : "-");
}

int rlk_addr_state_dir(const char *dir, char *out, size_t cap) {
    const char *env = getenv("STATE_DIRECTORY"), *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    int n;
    if (dir && *dir) n = snprintf(out, cap, "%s", dir);
    else if (env && *env) n = snprintf(out, cap, "%.*s", (int)strcspn(env, ":"), env);  /* (the first) */
    else if (xdg && *xdg) n = snprintf(out, cap, "%s/rlinkd", xdg);
    else if (home && *home) n = snprintf(out, cap, "%s/.local/state/rlinkd", home);
    else return -1;
    return n > 0 && (size_t)n < cap ? 0 : -1;
}

/* The file's text into buf (NUL-terminated): its length, or -1. */
static long read_small_file(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    int whole = feof(f) && !ferror(f);
    fclose(f);
    buf[n] = '\0';
    return whole ? (long)n : -1;
}

int rlk_addr_daemon_socket(const char *dir, char *out, size_t cap, char *err, size_t err_cap) {
    char state[512], file[600], text[8192];
    rlk_jtok toks[256];
    double pid = 0;
    if (rlk_addr_state_dir(dir, state, sizeof state) != 0)
        return fail(err, err_cap, "no state directory (set STATE_DIRECTORY or HOME)", dir ? dir : "");
    snprintf(file, sizeof file, "%s/daemon.json", state);
    long len = read_small_file(file, text, sizeof text);
    if (len < 0) {
        snprintf(err, err_cap, "no running rlinkd in state dir %s (%s: %s)", state, file, strerror(errno));
        return -1;
    }
    int n = rlk_json_parse(text, (size_t)len, toks, 256);
    int pid_at = n > 0 ? rlk_json_get(text, toks, 0, "pid") : -1;
    int sock_at = n > 0 ? rlk_json_get(text, toks, 0, "unix_socket") : -1;
    if (pid_at < 0 || sock_at < 0 || rlk_json_num(text, &toks[pid_at], &pid) != 0 ||
        rlk_json_str(text, &toks[sock_at], out, cap) != 0 || !out[0]) {
        snprintf(err, err_cap, "unreadable %s (no pid or unix_socket)", file);
        return -1;
    }
    if (pid < 1 || kill((pid_t)pid, 0) != 0) {  /* (as client_lib: a pid not ours to signal is not ours) */
        snprintf(err, err_cap, "no running rlinkd in state dir %s (%s names pid %.0f, which is gone)", state,
                 file, pid);
        return -1;
    }
    return 0;
}
