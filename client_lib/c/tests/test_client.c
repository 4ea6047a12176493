/*
 * test_client.c - unit and fuzz tests of the C client, run under AddressSanitizer and
 * UndefinedBehaviorSanitizer by `make check`:
 *   - the JSON tokenizer (valid, invalid, too deep, too many tokens) and writer (overflow);
 *   - the reply parsers on good replies and on mutated and truncated ones (an error code,
 *     never a crash or an out-of-bounds access);
 *   - the whole client against a scripted server (a forked process on a Unix socket):
 *     malformed and truncated replies give error codes and nothing leaks; a lost connection
 *     is re-established and the episode goes on.
 * Exit status 0 when every check passed; each failure prints its line.
 */
#define _GNU_SOURCE /* memmem */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rlinkd.h"
#include "rlk_json.h"
#include "rlk_net.h"
#include "rlk_proto.h"

static int failures = 0;
#define CHECK(cond)                                                   \
    do {                                                              \
        if (!(cond)) {                                                \
            fprintf(stderr, "%s:%d: CHECK(%s)\n", __FILE__, __LINE__, #cond); \
            failures++;                                               \
        }                                                             \
    } while (0)

#define MAX_TOKS 512
static rlk_jtok toks[MAX_TOKS];
static char errbuf[RLK_ERROR_CHARS];

static const char *CARTPOLE_CONFIG =
    "{\"type\": \"SET_CONFIG\", \"env_steps_per_sample\": 256, \"force_on_policy\": true, "
    "\"observation_space\": {\"type\": \"Box\", \"shape\": [4], \"low\": -3.4e38, \"high\": 3.4e38}, "
    "\"action_space\": {\"type\": \"Discrete\", \"n\": 2}, \"protocol_version\": 3}";
static const char *PENDULUM_CONFIG =
    "{\"type\": \"SET_CONFIG\", \"env_steps_per_sample\": 200, \"force_on_policy\": false, "
    "\"observation_space\": {\"type\": \"Box\", \"shape\": [3], \"low\": [-1, -1, -8], \"high\": [1, 1, 8]}, "
    "\"action_space\": {\"type\": \"Box\", \"shape\": [1], \"low\": -2.0, \"high\": 2.0}, "
    "\"box_dist\": \"squashed_gaussian\"}";
static const char *ACTIONS_2 = "{\"type\": \"ACTIONS\", \"actions\": [1, null], \"weights_seq_nos\": [7, -1]}";
static const char *ACTIONS_BOX = "{\"type\": \"ACTIONS\", \"actions\": [[0.5], [-1.25]], \"weights_seq_nos\": [3, 3]}";

static rlk_reply_info info(void) {
    rlk_reply_info i = {errbuf, sizeof errbuf, 0};
    return i;
}

/* ----------------------------------------------------------------- JSON */
static void test_json(void) {
    const char *doc = " {\"a\": [1, -2.5e3, true, null], \"b\": {\"c\": \"x\\\"y\\u0041\"}, \"d\": false} ";
    int n = rlk_json_parse(doc, strlen(doc), toks, MAX_TOKS);
    CHECK(n == 13);
    int a = rlk_json_get(doc, toks, 0, "a"), b = rlk_json_get(doc, toks, 0, "b");
    CHECK(a == 2 && toks[a].type == RLK_J_ARRAY && toks[a].count == 4);
    double v = 0;
    CHECK(rlk_json_num(doc, &toks[a + 2], &v) == 0 && v == -2500.0);
    int cc = rlk_json_get(doc, toks, b, "c");
    char text[16];
    CHECK(cc > 0 && rlk_json_str(doc, &toks[cc], text, sizeof text) == 0 && !strcmp(text, "x\"y?"));
    CHECK(rlk_json_get(doc, toks, 0, "zz") == -1 && toks[toks[0].next - 1].type == RLK_J_FALSE);
    const char *bad[] = {"", "{", "[1,]", "{\"a\" 1}", "{\"a\": 01}", "\"\\x\"", "[1] 2", "tru", "-",
                         "1.", "1e", "\"abc", "{\"a\": [}", "\"\\u12G4\"", "[\"\x01\"]", "{1: 2}", "nul"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        CHECK(rlk_json_parse(bad[i], strlen(bad[i]), toks, MAX_TOKS) < 0);
    char deep[200];
    memset(deep, '[', 40);
    memset(deep + 40, ']', 40);
    CHECK(rlk_json_parse(deep, 80, toks, MAX_TOKS) == -3);
    CHECK(rlk_json_parse("[1,2,3,4]", 9, toks, 3) == -2);
}

static void test_writer(void) {
    char buf[32];
    rlk_jw w;
    rlk_jw_init(&w, buf, sizeof buf);
    rlk_jw_str(&w, "a\"b\n");
    rlk_jw_raw(&w, " ");
    CHECK(rlk_jw_num(&w, 0.25) == 0 && rlk_jw_num(&w, 1.0 / 0.0) == -1);
    CHECK(!w.overflow && w.len == 17 && !memcmp(buf, "\"a\\\"b\\u000a\" 0.25", 17));
    rlk_jw_raw(&w, "0123456789012345678901234567890123456789");
    CHECK(w.overflow && w.len == 17);
}

/* ----------------------------------------------------------------- reply parsers */
static void test_parsers(void) {
    rlk_spaces sp;
    rlk_reply_info i = info();
    CHECK(rlk_parse_set_config(CARTPOLE_CONFIG, strlen(CARTPOLE_CONFIG), toks, MAX_TOKS, &sp, &i) == RLK_OK);
    CHECK(sp.obs_size == 4 && sp.act_kind == RLK_ACT_DISCRETE && sp.act_n == 2 && sp.act_size == 1);
    float actions[4];
    long seqs[2];
    unsigned char nulls[2];
    CHECK(rlk_parse_actions(ACTIONS_2, strlen(ACTIONS_2), toks, MAX_TOKS, &sp, 2, actions, seqs, nulls, &i) == RLK_OK);
    CHECK(actions[0] == 1.0f && seqs[0] == 7 && !nulls[0] && nulls[1] && seqs[1] == -1);
    CHECK(rlk_parse_actions(ACTIONS_2, strlen(ACTIONS_2), toks, MAX_TOKS, &sp, 3, actions, seqs, nulls, &i) == RLK_E_PROTOCOL);
    CHECK(rlk_parse_set_config(PENDULUM_CONFIG, strlen(PENDULUM_CONFIG), toks, MAX_TOKS, &sp, &i) == RLK_OK);
    CHECK(sp.obs_size == 3 && sp.act_kind == RLK_ACT_BOX && sp.act_size == 1);
    CHECK(rlk_parse_actions(ACTIONS_BOX, strlen(ACTIONS_BOX), toks, MAX_TOKS, &sp, 2, actions, seqs, nulls, &i) == RLK_OK);
    CHECK(actions[0] == 0.5f && actions[1] == -1.25f);
    const char *err = "{\"type\": \"ERROR\", \"message\": \"daemon shutting down\"}";
    CHECK(rlk_parse_pong(err, strlen(err), toks, MAX_TOKS, &i) == RLK_E_SERVER && i.retry);
    CHECK(!strcmp(errbuf, "daemon shutting down"));
    const char *img = "{\"type\": \"SET_CONFIG\", \"observation_space\": {\"type\": \"Discrete\", \"n\": 3}, "
                      "\"action_space\": {\"type\": \"Discrete\", \"n\": 2}}";
    CHECK(rlk_parse_set_config(img, strlen(img), toks, MAX_TOKS, &sp, &i) == RLK_E_UNSUPPORTED);
}

static unsigned long long fuzz_state = 0x9E3779B97F4A7C15ull;
static unsigned fuzz_rand(void) {
    fuzz_state ^= fuzz_state << 13;
    fuzz_state ^= fuzz_state >> 7;
    fuzz_state ^= fuzz_state << 17;
    return (unsigned)(fuzz_state >> 33);
}

static int known(rlk_status st) {
    return st == RLK_OK || st == RLK_E_PROTOCOL || st == RLK_E_LIMIT || st == RLK_E_SERVER ||
           st == RLK_E_UNSUPPORTED;
}

/* One mutation of src into dst (at most cap bytes): flips, inserts, deletes, a truncation. */
static size_t mutate(const char *src, char *dst, size_t cap) {
    static const char alphabet[] = "{}[],:\"\\0123456789.-eE ntruefalsnl\x01\xff";
    size_t n = strlen(src);
    memcpy(dst, src, n);
    for (unsigned k = 1 + fuzz_rand() % 4; k > 0; k--) {
        size_t at = n ? fuzz_rand() % n : 0;
        unsigned op = fuzz_rand() % 4;
        char ch = alphabet[fuzz_rand() % (sizeof alphabet - 1)];
        if (op == 0 && n) dst[at] = ch;
        else if (op == 1 && n + 1 < cap) { memmove(dst + at + 1, dst + at, n - at); dst[at] = ch; n++; }
        else if (op == 2 && n) { memmove(dst + at, dst + at + 1, n - at - 1); n--; }
        else n = at;
    }
    return n;
}

static void fuzz_parsers(void) {
    const char *seeds[] = {CARTPOLE_CONFIG, PENDULUM_CONFIG, ACTIONS_2, ACTIONS_BOX,
                           "{\"type\": \"PONG\"}", "{\"type\": \"ERROR\", \"message\": \"evicted: x\"}"};
    rlk_spaces cart, pend;
    rlk_reply_info i = info();
    rlk_parse_set_config(CARTPOLE_CONFIG, strlen(CARTPOLE_CONFIG), toks, MAX_TOKS, &cart, &i);
    rlk_parse_set_config(PENDULUM_CONFIG, strlen(PENDULUM_CONFIG), toks, MAX_TOKS, &pend, &i);
    for (int round = 0; round < 60000; round++) {
        const char *seed = seeds[round % 6];
        size_t len = strlen(seed);
        char *buf = malloc(len + 8);  /* exactly sized: ASan catches any read past the reply */
        size_t n = round < 2000 ? (size_t)round % (len + 1) : mutate(seed, buf, len + 8);
        if (round < 2000) memcpy(buf, seed, n);  /* every truncation */
        char *exact = malloc(n ? n : 1);
        memcpy(exact, buf, n);
        rlk_spaces sp;
        float actions[4];
        long seqs[2];
        unsigned char nulls[2];
        CHECK(known(rlk_parse_set_config(exact, n, toks, MAX_TOKS, &sp, &i)));
        CHECK(known(rlk_parse_actions(exact, n, toks, MAX_TOKS, round % 2 ? &cart : &pend, 2, actions, seqs, nulls, &i)));
        CHECK(known(rlk_parse_pong(exact, n, toks, MAX_TOKS, &i)));
        free(exact);
        free(buf);
    }
}

/* ----------------------------------------------------------------- scripted server */
static void serve_reply(int fd, const char *body) {
    rlk_net_send(fd, body, strlen(body), 5.0);
}

static int read_request(int fd, char *buf, size_t cap) {
    size_t got = 0;
    if (rlk_net_recv(fd, buf, cap - 1, &got, 10.0) != 0) return -1;
    buf[got] = '\0';
    return 0;
}

/* A well-formed ACTIONS for a STEP_BATCH: action 1 (version 9) per entry, null for an end.
 * (An entry is "{...}" with no nested braces: observations are flat arrays here.) */
static void serve_actions(int fd, const char *req) {
    char reply[4096] = "{\"type\": \"ACTIONS\", \"actions\": [", seqs[2048] = "], \"weights_seq_nos\": [";
    int k = 0;
    for (const char *e = strstr(req, "{\"episode_id\""); e; e = strstr(e + 1, "{\"episode_id\""), k++) {
        const char *close = strchr(e, '}');
        size_t n = close ? (size_t)(close - e) : strlen(e);
        int end = memmem(e, n, "\"terminated\"", 12) || memmem(e, n, "\"truncated\"", 11);
        strcat(reply, k ? ", " : "");
        strcat(reply, end ? "null" : "1");
        strcat(seqs, k ? ", " : "");
        strcat(seqs, end ? "-1" : "9");
    }
    strcat(reply, seqs);
    strcat(reply, "]}");
    serve_reply(fd, reply);
}

/* Child: one connection per script entry; each answers the handshake, then replies script[k]
 * to the first STEP_BATCH and well-formed ACTIONS after. "CLOSE": hang up at the first
 * STEP_BATCH; "?TEXT": the first STEP_BATCH must contain TEXT (else exit 4), then ACTIONS.
 * Every later request on a "?" connection must keep ends before starts (else exit 5). */
static void scripted_server(int listener, const char *const *script, int n) {
    char req[8192];
    for (int k = 0; k < n; k++) {
        int fd = accept(listener, NULL, NULL);
        if (fd < 0) _exit(3);
        if (read_request(fd, req, sizeof req) == 0) serve_reply(fd, "{\"type\": \"PONG\"}");
        if (read_request(fd, req, sizeof req) == 0) serve_reply(fd, CARTPOLE_CONFIG);
        if (read_request(fd, req, sizeof req) == 0 && strcmp(script[k], "CLOSE") != 0) {
            if (script[k][0] == '?' && !strstr(req, script[k] + 1)) _exit(4);
            if (script[k][0] == '?') serve_actions(fd, req);
            else serve_reply(fd, script[k]);
            while (read_request(fd, req, sizeof req) == 0) {
                const char *end = strstr(req, "\"terminated\""), *start = strstr(req, "\"start\"");
                if (end && start && end > start) _exit(5);
                serve_actions(fd, req);
            }
        }
        close(fd);
    }
    _exit(0);
}

static pid_t start_server(const char *path, const char *const *script, int n) {
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    unlink(path);
    int listener = socket(AF_UNIX, SOCK_STREAM, 0);
    if (listener < 0 || bind(listener, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(listener, 8) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) scripted_server(listener, script, n);
    close(listener);
    return pid;
}

static rlk_client *client_for(const char *address, double reconnect_s) {
    rlk_options o;
    rlk_options_init(&o);
    o.address = address;
    o.reconnect_timeout_s = reconnect_s;
    o.io_timeout_s = 5.0;
    rlk_client *c = NULL;
    CHECK(rlk_connect(&o, &c) == RLK_OK);
    return c;
}

static void test_bad_replies_give_error_codes(void) {
    const char *const script[] = {
        "{\"type\": \"ACTIONS\", \"actions\": [1, 0], \"weights_seq_nos\": [1, 1]}",  /* count */
        "{\"type\": \"ACTIONS\", \"actions\": [\"left\"], \"weights_seq_nos\": [1]}",  /* kind */
        "{\"type\": \"ACTIONS\", \"actions\": [1], \"weights_seq_nos\": [1]",          /* truncated */
        "{\"type\": \"ERROR\", \"message\": \"episode 'x' already ended\"}",
        "{\"type\": \"PONG\"}"};
    const rlk_status expected[] = {RLK_E_PROTOCOL, RLK_E_PROTOCOL, RLK_E_PROTOCOL, RLK_E_SERVER, RLK_E_PROTOCOL};
    char path[64], address[80];
    snprintf(path, sizeof path, "/tmp/rlk-test-%ld.sock", (long)getpid());
    snprintf(address, sizeof address, "unix://%s", path);
    pid_t pid = start_server(path, script, 5);
    CHECK(pid > 0);
    float obs[4] = {0.01f, 0.0f, -0.02f, 0.0f}, action[1];
    for (int k = 0; k < 5; k++) {
        rlk_client *c = client_for(address, 0.0);
        if (!c) continue;
        rlk_status st = rlk_act(c, obs, action);
        CHECK(st == expected[k]);
        CHECK(strlen(rlk_error(c)) > 0);
        /* the failed request's episode is abandoned: the next act starts a new one */
        CHECK(rlk_act(c, obs, action) == RLK_OK && action[0] == 1.0f);
        rlk_close(c);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    unlink(path);
}

static void test_a_lost_connection_is_reestablished_and_the_episode_goes_on(void) {
    const char *const script[] = {"CLOSE", "{\"type\": \"ACTIONS\", \"actions\": [0], \"weights_seq_nos\": [4]}",
                                  "?\"start\": true"};
    char path[64], address[80];
    snprintf(path, sizeof path, "/tmp/rlk-test-r%ld.sock", (long)getpid());
    snprintf(address, sizeof address, "unix://%s", path);
    pid_t pid = start_server(path, script, 3);
    rlk_client *c = client_for(address, 5.0);
    float obs[4] = {0}, action[1] = {-1}, nan_obs[4] = {0.0f, 0.0f / 0.0f, 0.0f, 0.0f};
    if (c) {
        CHECK(rlk_act(c, nan_obs, action) == RLK_E_ARG);  /* refused before anything changes */
        CHECK(rlk_act(c, obs, action) == RLK_OK && action[0] == 0.0f && rlk_reconnects(c) == 1);
        CHECK(rlk_weights_seq_no(c) == 4);
        CHECK(rlk_step(c, 0.0f / 0.0f, obs, 1, 0) == RLK_E_ARG);
        CHECK(rlk_step(c, 1.0f, obs, 0, 0) == RLK_OK);
        CHECK(rlk_act(c, obs, action) == RLK_OK && action[0] == 1.0f && rlk_weights_seq_no(c) == 9);
        CHECK(rlk_act(c, obs, action) == RLK_E_STATE);  /* act twice without a step */
        CHECK(rlk_step(c, 1.0f, obs, 1, 0) == RLK_OK);   /* the end waits for the next request */
        CHECK(rlk_step(c, 1.0f, obs, 1, 0) == RLK_E_STATE);
        CHECK(rlk_act(c, obs, action) == RLK_OK && action[0] == 1.0f);  /* END, then START */
        rlk_close(c);
    }
    rlk_client *d = client_for(address, 5.0);  /* the third connection checks a START is sent */
    if (d) {
        CHECK(rlk_act(d, obs, action) == RLK_OK);
        rlk_close(d);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);  /* (4, 5: a request broke a rule) */
    unlink(path);
}

static void test_arguments_are_checked(void) {
    rlk_options o;
    rlk_client *c = (rlk_client *)&o;
    rlk_options_init(&o);
    CHECK(rlk_connect(&o, &c) == RLK_E_ARG && c == NULL);  /* no address */
    o.address = "udp://x";
    CHECK(rlk_connect(&o, &c) == RLK_E_ARG);
    o.address = "unix:///nonexistent/rlinkd.sock";
    CHECK(rlk_connect(&o, &c) == RLK_E_CONNECT);
    o.max_agents = RLK_MAX_AGENTS + 1;
    CHECK(rlk_connect(&o, &c) == RLK_E_ARG);
    CHECK(!strcmp(rlk_status_name(RLK_E_TIMEOUT), "RLK_E_TIMEOUT"));
    rlk_close(NULL);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    test_json();
    test_writer();
    test_parsers();
    fuzz_parsers();
    test_arguments_are_checked();
    test_bad_replies_give_error_codes();
    test_a_lost_connection_is_reestablished_and_the_episode_goes_on();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("test_client: all checks passed\n");
    return 0;
}
