/*
 * test_client.c - unit and fuzz tests of the C client, run under AddressSanitizer and
 * UndefinedBehaviorSanitizer by `make check`:
 *   - the JSON tokenizer (valid, invalid, too deep, too many tokens) and writer (overflow);
 *   - the reply parsers on good replies and on mutated and truncated ones (an error code,
 *     never a crash or an out-of-bounds access);
 *   - client-side inference's pieces: ATTACHED and WEIGHTS_READY (good, mutated, truncated),
 *     the step ring and weights board as the daemon makes them and corrupted ones (refused
 *     with an error code), records written and wrapped around the ring;
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
#include <fcntl.h>
#include <locale.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <netinet/in.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rlinkd.h"
#include "rlk_addr.h"
#include "rlk_json.h"
#include "rlk_net.h"
#include "rlk_local.h"
#include "rlk_proto.h"
#include "rlk_ring.h"

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
    "\"box_dist\": \"squashed_gaussian\", \"max_agents_per_connection\": 64}";
static const char *ACTIONS_2 = "{\"type\": \"ACTIONS\", \"actions\": [1, null], \"weights_seq_nos\": [7, -1]}";
static const char *ACTIONS_BOX = "{\"type\": \"ACTIONS\", \"actions\": [[0.5], [-1.25]], \"weights_seq_nos\": [3, 3]}";

/* What the daemon sends a CartPole client (a 4 -> 8 -> 2 actor; 115 parameters in all). */
static const char *ATTACHED_CARTPOLE =
    "{\"type\": \"ATTACHED\", \"ring_name\": \"rlinkd.1.ab.client-1-default-00\", \"board_path\": \"/dev/shm/board\", "
    "\"doorbell_path\": \"/run/doorbell\", \"layout\": {\"obs_fields\": [[\"obs\", \"<f4\", [4]]], \"action_size\": 1, "
    "\"dist_size\": 2, \"record_bytes\": 64}, \"policy_spec\": {\"x\": 1}, \"env_steps_per_sample\": 64, "
    "\"force_on_policy\": true, \"policy\": \"default\", \"network\": {\"ops\": [{\"op\": \"Input\", \"out\": "
    "\"onnx::Gemm_0\", \"key\": \"\", \"dtype\": \"<f4\", \"shape\": [4]}, {\"op\": \"Normalize\", \"out\": \"obs/norm\", "
    "\"x\": \"onnx::Gemm_0\", \"mean\": \"obs_mean\", \"std\": \"obs_std\"}, {\"op\": \"Linear\", \"out\": \"pi.0.pre\", "
    "\"x\": \"obs/norm\", \"weight\": \"pi.0.weight\", \"bias\": \"pi.0.bias\"}, {\"op\": \"Act\", \"out\": \"pi.0.out\", "
    "\"x\": \"pi.0.pre\", \"kind\": \"tanh\"}, {\"op\": \"Linear\", \"out\": \"action_dist_inputs\", \"x\": \"pi.0.out\", "
    "\"weight\": \"pi.1.weight\", \"bias\": \"pi.1.bias\"}], \"params\": [[\"obs_mean\", [4]], [\"obs_std\", [4]], "
    "[\"pi.0.weight\", [8, 4]], [\"pi.0.bias\", [8]], [\"pi.1.weight\", [2, 8]], [\"pi.1.bias\", [2]], [\"vf.0.weight\", [8, 4]], "
    "[\"vf.0.bias\", [8]], [\"vf.1.weight\", [1, 8]], [\"vf.1.bias\", [1]]], \"dist\": [{\"kind\": \"categorical\", "
    "\"dist\": 0, \"width\": 2, \"action\": 0, \"low\": [], \"high\": []}]}}";
/* ... and a GRU policy's client (4 -> GRU of 3 -> 8 -> 2; a state of 3 floats, L = 5). */
static const char *ATTACHED_GRU =
    "{\"type\": \"ATTACHED\", \"board_path\": \"/dev/shm/board\", \"doorbell_path\": \"/run/doorbell\", "
    "\"layout\": {\"obs_fields\": [[\"obs\", \"<f4\", [4]]], \"action_size\": 1, \"dist_size\": 2, "
    "\"record_bytes\": 72, \"state_size\": 3}, \"env_steps_per_sample\": 64, \"policy\": \"default\", "
    "\"network\": {\"ops\": [{\"op\": \"Input\", \"out\": \"onnx::Gemm_0\", \"key\": \"\", \"dtype\": \"<f4\", "
    "\"shape\": [4]}, {\"op\": \"State\", \"out\": \"state_in\", \"width\": 3}, {\"op\": \"Recurrent\", "
    "\"out\": \"state_out\", \"x\": \"onnx::Gemm_0\", \"state\": \"state_in\", \"cell\": \"gru\", \"size\": 3, "
    "\"weight_ih\": \"rnn.weight_ih\", \"weight_hh\": \"rnn.weight_hh\", \"bias_ih\": \"rnn.bias_ih\", "
    "\"bias_hh\": \"rnn.bias_hh\"}, {\"op\": \"Slice\", \"out\": \"rnn.h\", \"x\": \"state_out\", \"start\": 0, "
    "\"stop\": 3}, {\"op\": \"Linear\", \"out\": \"pi.0.pre\", \"x\": \"rnn.h\", \"weight\": \"pi.0.weight\", "
    "\"bias\": \"pi.0.bias\"}, {\"op\": \"Act\", \"out\": \"pi.0.out\", \"x\": \"pi.0.pre\", \"kind\": \"tanh\"}, "
    "{\"op\": \"Linear\", \"out\": \"action_dist_inputs\", \"x\": \"pi.0.out\", \"weight\": \"pi.1.weight\", "
    "\"bias\": \"pi.1.bias\"}], \"params\": [[\"rnn.weight_ih\", [9, 4]], [\"rnn.weight_hh\", [9, 3]], "
    "[\"rnn.bias_ih\", [9]], [\"rnn.bias_hh\", [9]], [\"pi.0.weight\", [8, 3]], [\"pi.0.bias\", [8]], "
    "[\"pi.1.weight\", [2, 8]], [\"pi.1.bias\", [2]]], \"dist\": [{\"kind\": \"categorical\", \"dist\": 0, "
    "\"width\": 2, \"action\": 0, \"low\": [], \"high\": []}]}, \"state\": {\"cell\": \"gru\", \"max_seq_len\": 5}}";
static const char *WEIGHTS_READY =
    "{\"type\": \"WEIGHTS_READY\", \"weights_seq_no\": 5, \"weights_seq_nos\": {\"default\": 6, \"b\": 1}, "
    "\"exploration\": {\"default\": {\"epsilon\": 0.25}}}";
#define CARTPOLE_PARAMS 115

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
    CHECK(sp.max_agents == 0);  /* (not said) */
    float actions[4];
    long seqs[2];
    unsigned char nulls[2];
    CHECK(rlk_parse_actions(ACTIONS_2, strlen(ACTIONS_2), toks, MAX_TOKS, &sp, 2, actions, seqs, nulls, &i) == RLK_OK);
    CHECK(actions[0] == 1.0f && seqs[0] == 7 && !nulls[0] && nulls[1] && seqs[1] == -1);
    CHECK(rlk_parse_actions(ACTIONS_2, strlen(ACTIONS_2), toks, MAX_TOKS, &sp, 3, actions, seqs, nulls, &i) == RLK_E_PROTOCOL);
    CHECK(rlk_parse_set_config(PENDULUM_CONFIG, strlen(PENDULUM_CONFIG), toks, MAX_TOKS, &sp, &i) == RLK_OK);
    CHECK(sp.obs_size == 3 && sp.act_kind == RLK_ACT_BOX && sp.act_size == 1 && sp.max_agents == 64);
    CHECK(rlk_parse_actions(ACTIONS_BOX, strlen(ACTIONS_BOX), toks, MAX_TOKS, &sp, 2, actions, seqs, nulls, &i) == RLK_OK);
    CHECK(actions[0] == 0.5f && actions[1] == -1.25f);
    const char *err = "{\"type\": \"ERROR\", \"message\": \"daemon shutting down\"}";
    CHECK(rlk_parse_pong(err, strlen(err), toks, MAX_TOKS, &i) == RLK_E_SERVER && i.retry);
    CHECK(!strcmp(errbuf, "daemon shutting down"));
    const char *retryable[] = {RLK_RETRYABLE_ERRORS};  /* each start, as the Python declares them */
    char reply[256];
    for (size_t k = 0; k < sizeof retryable / sizeof retryable[0]; k++) {
        snprintf(reply, sizeof reply, "{\"type\": \"ERROR\", \"message\": \"%s x\"}", retryable[k]);
        CHECK(rlk_parse_pong(reply, strlen(reply), toks, MAX_TOKS, &i) == RLK_E_SERVER && i.retry);
    }
    const char *final = "{\"type\": \"ERROR\", \"message\": \"bad frame: x\"}";
    CHECK(rlk_parse_pong(final, strlen(final), toks, MAX_TOKS, &i) == RLK_E_SERVER && !i.retry);
    const char *img = "{\"type\": \"SET_CONFIG\", \"observation_space\": {\"type\": \"Discrete\", \"n\": 3}, "
                      "\"action_space\": {\"type\": \"Discrete\", \"n\": 2}}";
    CHECK(rlk_parse_set_config(img, strlen(img), toks, MAX_TOKS, &sp, &i) == RLK_E_UNSUPPORTED);
}

/* ATTACHED with (and pieces without) a recurrent policy's state: the network, the record
 * layout (state_size) and the "state" grid must agree. */
static void test_recurrent_attached(const rlk_spaces *sp) {
    rlk_attached a;
    rlk_reply_info i = info();
    CHECK(rlk_parse_attached(ATTACHED_GRU, strlen(ATTACHED_GRU), toks, MAX_TOKS, sp, 4, &a, &i) == RLK_OK);
    CHECK(a.layout.state_size == 3 && a.layout.record_bytes == 72 && a.max_seq_len == 5 && rlk_mlp_state_width(a.mlp) == 3);
    rlk_attached_free(&a);
    const char *edits[][2] = {{"\"max_seq_len\": 5", "\"max_seq_len\": 0"}, {"\"max_seq_len\": 5", "\"max_seq_lex\": 5"},
                              {"\"state\": {", "\"stale\": {"}, {"\"state_size\": 3", "\"state_size\": 4"},
                              {"\"width\": 3", "\"width\": 6"}, {"\"gru\", \"size\": 3", "\"gru\", \"size\": 2"}};
    for (size_t k = 0; k < sizeof edits / sizeof edits[0]; k++) {
        char *bad = strdup(ATTACHED_GRU);
        memcpy(strstr(bad, edits[k][0]), edits[k][1], strlen(edits[k][1]));
        CHECK(rlk_parse_attached(bad, strlen(bad), toks, MAX_TOKS, sp, 4, &a, &i) == RLK_E_PROTOCOL);
        free(bad);
    }
    char *cell = strdup(ATTACHED_GRU);  /* a cell the C client does not know */
    memcpy(strstr(cell, "\"gru\", \"size\""), "\"rnn\"", 5);
    CHECK(rlk_parse_attached(cell, strlen(cell), toks, MAX_TOKS, sp, 4, &a, &i) == RLK_E_UNSUPPORTED);
    free(cell);
    char *state = strdup(ATTACHED_CARTPOLE);  /* a "state" for a feed-forward network */
    memcpy(strstr(state, "\"force_on_policy\": true"), "\"state\": {}           ", 23);
    CHECK(rlk_parse_attached(state, strlen(state), toks, MAX_TOKS, sp, 4, &a, &i) == RLK_E_PROTOCOL);
    free(state);
    rlk_layout lay = rlk_layout_flat(4, 1, 2, 3);  /* (shm/records.py: state at 60, 72 bytes) */
    unsigned char rec[72];
    float st[3] = {1, 2, 3};
    CHECK(lay.record_bytes == 72 && rlk_layout_flat(4, 1, 2, 4).record_bytes == 80);
    rlk_record_fill(rec, &lay, RLK_REC_HAS_STATE, 0, 0, 0.0f, 0.0f, NULL, NULL, NULL, st);
    CHECK(rec[0] == RLK_REC_HAS_STATE && !memcmp(rec + 60, st, sizeof st));
}

static void test_local_parsers(void) {
    rlk_spaces sp;
    rlk_attached a;
    rlk_reply_info i = info();
    long seq;
    double eps;
    rlk_parse_set_config(CARTPOLE_CONFIG, strlen(CARTPOLE_CONFIG), toks, MAX_TOKS, &sp, &i);
    CHECK(rlk_parse_attached(ATTACHED_CARTPOLE, strlen(ATTACHED_CARTPOLE), toks, MAX_TOKS, &sp, 4, &a, &i) == RLK_OK);
    CHECK(a.env_steps_per_sample == 64 && !strcmp(a.policy, "default") && !strcmp(a.board_path, "/dev/shm/board"));
    CHECK(a.layout.record_bytes == 64 && a.layout.dist_size == 2 && rlk_mlp_n_params(a.mlp) == CARTPOLE_PARAMS);
    CHECK(rlk_dist_single_categorical(a.dist));
    char *relu = strdup(ATTACHED_CARTPOLE);  /* another activation: another network */
    memcpy(strstr(relu, "\"tanh\""), "\"relu\"", 6);
    rlk_attached b;
    CHECK(rlk_parse_attached(relu, strlen(relu), toks, MAX_TOKS, &sp, 4, &b, &i) == RLK_OK);
    CHECK(!rlk_mlp_same(a.mlp, b.mlp));
    rlk_attached_free(&b);
    CHECK(rlk_parse_attached(ATTACHED_CARTPOLE, strlen(ATTACHED_CARTPOLE), toks, MAX_TOKS, &sp, 4, &b, &i) == RLK_OK);
    CHECK(rlk_mlp_same(a.mlp, b.mlp));
    rlk_attached_free(&b);
    free(relu);
    rlk_attached_free(&a);
    char *old = strdup(ATTACHED_CARTPOLE);  /* an older daemon: no network description */
    memcpy(strstr(old, "\"network\""), "\"netwerk\"", 9);
    CHECK(rlk_parse_attached(old, strlen(old), toks, MAX_TOKS, &sp, 4, &a, &i) == RLK_E_UNSUPPORTED);
    free(old);
    CHECK(rlk_parse_weights_ready(WEIGHTS_READY, strlen(WEIGHTS_READY), toks, MAX_TOKS, "default", &seq, &eps, &i) == RLK_OK);
    CHECK(seq == 6 && eps == 0.25);
    CHECK(rlk_parse_weights_ready(WEIGHTS_READY, strlen(WEIGHTS_READY), toks, MAX_TOKS, "c", &seq, &eps, &i) == RLK_OK);
    CHECK(seq == 5 && eps < 0);
    char *frozen = strdup(ATTACHED_CARTPOLE);  /* no board: a frozen model */
    memcpy(strstr(frozen, "/dev/shm/board") - 1, "\"\"              ", 16);
    CHECK(rlk_parse_attached(frozen, strlen(frozen), toks, MAX_TOKS, &sp, 4, &a, &i) == RLK_E_UNSUPPORTED);
    free(frozen);
    char *conv = strdup(ATTACHED_CARTPOLE);  /* an op the C client does not run */
    memcpy(strstr(conv, "\"Act\""), "\"Cnv\"", 5);
    CHECK(rlk_parse_attached(conv, strlen(conv), toks, MAX_TOKS, &sp, 4, &a, &i) == RLK_E_UNSUPPORTED);
    free(conv);
    rlk_spaces wrong = sp;  /* a layout that does not fit the spaces */
    wrong.obs_size = 5;
    CHECK(rlk_parse_attached(ATTACHED_CARTPOLE, strlen(ATTACHED_CARTPOLE), toks, MAX_TOKS, &wrong, 4, &a, &i) == RLK_E_PROTOCOL);
    test_recurrent_attached(&sp);
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

/* Mutated and truncated ATTACHED / WEIGHTS_READY: an error code or a description whose pieces
 * are all freed (ASan's leak check). */
static void fuzz_local_parsers(void) {
    rlk_spaces sp;
    rlk_reply_info i = info();
    rlk_parse_set_config(CARTPOLE_CONFIG, strlen(CARTPOLE_CONFIG), toks, MAX_TOKS, &sp, &i);
    for (int round = 0; round < 30000; round++) {
        const char *seed = round % 3 == 0 ? WEIGHTS_READY : round % 3 == 1 ? ATTACHED_CARTPOLE : ATTACHED_GRU;
        size_t len = strlen(seed), n;
        char *buf = malloc(len + 8);
        if (round < 3000) {
            n = (size_t)round % (len + 1);
            memcpy(buf, seed, n);
        } else {
            n = mutate(seed, buf, len + 8);
        }
        char *exact = malloc(n ? n : 1);
        memcpy(exact, buf, n);
        rlk_attached a;
        long seq;
        double eps;
        rlk_status st = rlk_parse_attached(exact, n, toks, MAX_TOKS, &sp, 4, &a, &i);
        CHECK(known(st));
        if (st == RLK_OK) CHECK(a.mlp && a.dist && rlk_mlp_n_params(a.mlp) <= RLK_MLP_MAX_PARAM_FLOATS);
        rlk_attached_free(&a);
        CHECK(known(rlk_parse_weights_ready(exact, n, toks, MAX_TOKS, "default", &seq, &eps, &i)));
        free(exact);
        free(buf);
    }
}

/* ----------------------------------------------------------------- ring and board */
#define RING_LAYOUT "{\"action_size\":1,\"dist_size\":2,\"obs_fields\":[[\"obs\",\"<f4\",[4]]],\"record_bytes\":64}"
#define GRU_RING_LAYOUT \
    "{\"action_size\":1,\"dist_size\":2,\"obs_fields\":[[\"obs\",\"<f4\",[4]]],\"record_bytes\":72,\"state_size\":3}"
#define RING_CAPACITY 1024u

static size_t records_offset_of(const char *layout) { return (320 + strlen(layout) + 63) / 64 * 64; }
static size_t ring_records_offset(void) { return records_offset_of(RING_LAYOUT); }

/* A ring of `layout` (records of record_bytes) as the collector makes it: a sealed memfd;
 * `corrupt` damages one field. */
static int make_ring_of(const char *ring_layout, uint32_t record_bytes, int corrupt, int seal) {
    size_t bytes = records_offset_of(ring_layout) + RING_CAPACITY * record_bytes;
    unsigned char header[320 + 128];
    uint32_t version = corrupt == 2 ? 2 : 3, record = record_bytes + (corrupt == 3 ? 8 : 0), pid = 1;
    uint32_t layout = (uint32_t)strlen(ring_layout);
    uint64_t capacity = corrupt == 4 ? RING_CAPACITY - 1 : RING_CAPACITY;
    memset(header, 0, sizeof header);
    memcpy(header, corrupt == 1 ? "RLKRINGX" : "RLKRING1", 8);
    memcpy(header + 8, &version, 4);
    memcpy(header + 12, &record, 4);
    memcpy(header + 16, &capacity, 8);
    memcpy(header + 24, &pid, 4);
    memcpy(header + 32, &layout, 4);
    memcpy(header + 320, ring_layout, layout);
    if (corrupt == 5) memcpy(header + 320 + strlen("{\"action_size\":"), "2", 1);
    int fd = memfd_create("test-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, (off_t)(bytes + (corrupt == 6 ? 64 : 0))) != 0 || pwrite(fd, header, sizeof header, 0) != (ssize_t)sizeof header)
        return -1;
    if (seal) fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    return fd;
}

/* The CartPole ring of the tests below. */
static int make_ring(int corrupt, int seal) { return make_ring_of(RING_LAYOUT, 64, corrupt, seal); }

static int keep_reader = -1;  /* the collector's end of the doorbell FIFO */

static void test_ring(const char *fifo) {
    rlk_layout want = rlk_layout_flat(4, 1, 2, 0);
    rlk_ring *r;
    char err[RLK_ERROR_CHARS];
    CHECK(want.record_bytes == 64);
    for (int corrupt = 1; corrupt <= 6; corrupt++)
        CHECK(rlk_ring_attach(make_ring(corrupt, 1), fifo, &want, toks, MAX_TOKS, &r, err, sizeof err) != RLK_OK && !r);
    CHECK(rlk_ring_attach(make_ring(0, 0), fifo, &want, toks, MAX_TOKS, &r, err, sizeof err) != RLK_OK);  /* unsealed */
    int fd = make_ring(0, 1), view = dup(fd);
    CHECK(rlk_ring_attach(fd, fifo, &want, toks, MAX_TOKS, &r, err, sizeof err) == RLK_OK);
    CHECK(r && rlk_ring_capacity(r) == RING_CAPACITY);
    size_t off = ring_records_offset(), bytes = off + RING_CAPACITY * 64;
    unsigned char *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, view, 0);
    uint64_t head = RING_CAPACITY - 3;  /* (as if the collector had read that far: the batch wraps) */
    memcpy(m + 64, &head, 8);
    memcpy(m + 128, &head, 8);
    unsigned char recs[5 * 64];
    float obs[4] = {1, 2, 3, 4}, action = 1, dist[2] = {0.5f, -0.5f};
    for (int k = 0; k < 5; k++) rlk_record_fill(recs + 64 * k, &want, RLK_REC_HAS_LOGP, (uint32_t)k, 9, 1.0f, -0.7f, obs, &action, dist, NULL);
    CHECK(rlk_ring_write(r, recs, 5, -1, 1.0) == 0);
    uint64_t tail;
    memcpy(&tail, m + 64, 8);
    CHECK(tail == head + 5);
    CHECK(!memcmp(m + off + (RING_CAPACITY - 1) * 64, recs + 2 * 64, 64) && !memcmp(m + off + 64, recs + 4 * 64, 64));
    unsigned char *many = calloc(RING_CAPACITY + 1, 64);
    CHECK(rlk_ring_write(r, recs, 5, -1, 0.05) == 0 && rlk_ring_write(r, many, RING_CAPACITY, -1, 0.05) == -2);  /* full */
    CHECK(rlk_ring_write(r, many, RING_CAPACITY + 1, -1, 0.05) == -3);  /* never fits */
    memcpy(&tail, m + 64, 8);
    CHECK(tail == head + 10);  /* (nothing of the refused batches was published) */
    free(many);
    uint32_t sleeping = 1;  /* the collector sleeps, then dies: the doorbell has no reader */
    memcpy(m + 192, &sleeping, 4);
    close(keep_reader);
    keep_reader = -1;
    memcpy(m + 128, &tail, 8);
    signal(SIGPIPE, SIG_DFL);  /* (a simulator that never heard of SIGPIPE: it must not die) */
    CHECK(rlk_ring_write(r, recs, 1, -1, 0.05) == -1);
    signal(SIGPIPE, SIG_IGN);
    munmap(m, bytes);
    close(view);
    rlk_ring_close(r);
}

/* A board file with n parameters (w[0..n), or all of value v when w is NULL) at version seq. */
static void make_board(const char *path, uint64_t n, const float *w, float v, int64_t seq, int corrupt) {
    size_t stride = (4 * n + 63) / 64 * 64, bytes = 16512 + 2 * stride;
    unsigned char *b = calloc(1, bytes);
    uint32_t version = corrupt == 1 ? 2 : 1, pid = 1, active = 1;
    memcpy(b, "RLKBOARD", 8);
    memcpy(b + 8, &version, 4);
    memcpy(b + 16, &n, 8);
    memcpy(b + 24, &pid, 4);
    memcpy(b + 72, &active, 4);
    memcpy(b + 88, &seq, 8);
    for (uint64_t k = 0; k < n; k++) memcpy(b + 16512 + stride + 4 * k, w ? &w[k] : &v, 4);
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, bytes - (corrupt == 2 ? 4 : 0), f);
    fclose(f);
    free(b);
}

static void test_board(const char *path) {
    rlk_board *b;
    char err[RLK_ERROR_CHARS];
    float w[CARTPOLE_PARAMS];
    make_board(path, CARTPOLE_PARAMS, NULL, 0.5f, 3, 0);
    CHECK(rlk_board_attach(path, CARTPOLE_PARAMS, &b, err, sizeof err) == RLK_OK);
    CHECK(rlk_board_latest(b) == 3 && rlk_board_read(b, w) == 3 && w[0] == 0.5f && w[CARTPOLE_PARAMS - 1] == 0.5f);
    rlk_board_close(b);
    CHECK(rlk_board_attach(path, CARTPOLE_PARAMS + 1, &b, err, sizeof err) == RLK_E_UNSUPPORTED && !b);
    make_board(path, CARTPOLE_PARAMS, NULL, 0.5f, 3, 1);
    CHECK(rlk_board_attach(path, CARTPOLE_PARAMS, &b, err, sizeof err) == RLK_E_PROTOCOL);
    make_board(path, CARTPOLE_PARAMS, NULL, 0.5f, 3, 2);
    CHECK(rlk_board_attach(path, CARTPOLE_PARAMS, &b, err, sizeof err) == RLK_E_PROTOCOL);
    CHECK(rlk_board_attach("/nonexistent/board", CARTPOLE_PARAMS, &b, err, sizeof err) == RLK_E_IO);
}

/* The collector's side of ATTACHED's descriptor: fd over sock with the marker byte. */
static int send_fd(int sock, int fd) {
    char byte = RLK_FD_BYTE;
    struct iovec iov = {&byte, 1};
    union { struct cmsghdr h; char buf[CMSG_SPACE(sizeof(int))]; } ctl;
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    memset(&ctl, 0, sizeof ctl);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl.buf;
    msg.msg_controllen = sizeof ctl.buf;
    struct cmsghdr *h = CMSG_FIRSTHDR(&msg);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(h), &fd, sizeof(int));
    return sendmsg(sock, &msg, 0) == 1 ? 0 : -1;
}

#define GRU_PARAMS 131
#define GRU_STEPS 12

/* The test's own chain of one agent's states (another copy of the network, one row at a
 * time): zeros when its episode opens, else the state after its previous step. */
static void oracle_step(rlk_mlp *m, const float *w, const float *obs, int opens, float *state, float *fed) {
    float dist[2];
    if (opens) memset(state, 0, 3 * sizeof(float));
    memcpy(fed, state, 3 * sizeof(float));
    rlk_mlp_forward(m, w, obs, fed, 1, dist, state);
}

/* Two agents of a GRU policy (L = 5) over 12 steps: agent 0's episode ends at step 6 and a
 * new one opens, a sample cuts both fragments after step 8; fed: the oracle's states. */
static void drive_gru(rlk_local *l, rlk_mlp *oracle, const float *w, float fed[2][GRU_STEPS][3]) {
    float obs[8], next[8], actions[2], rewards[2] = {1.0f, 1.0f}, state[2][3];
    unsigned char term[2] = {0, 0}, trunc[2] = {0, 0};
    int due, ended;
    for (int t = 0; t < GRU_STEPS; t++) {
        for (int i = 0; i < 2; i++) {
            int opens = t == 0 || (i == 0 && t == 7);
            for (int k = 0; k < 4 && opens; k++) obs[4 * i + k] = 0.1f * (float)(k - i);
            oracle_step(oracle, w, obs + 4 * i, opens, state[i], fed[i][t]);
            for (int k = 0; k < 4; k++) next[4 * i + k] = 0.3f * (float)(t % 3) - 0.05f * (float)(k + i);
        }
        CHECK(rlk_local_act(l, 2, obs, actions) == RLK_OK);
        term[0] = t == 6;
        CHECK(rlk_local_step(l, 2, rewards, next, term, trunc, &due, &ended) == RLK_OK && ended == (t == 6));
        memcpy(obs, next, sizeof obs);
        if (t == 8) rlk_local_cut(l);
        rlk_local_next(l, 2);
    }
    rlk_local_cut(l);
}

/* drive_gru's records as the ring holds them (24 steps, 5 FINAL_OBS): HAS_STATE and the state
 * fed before the step exactly at fragment positions 0 and 5, zeros elsewhere. */
static void check_gru_records(const unsigned char *recs, size_t n, float fed[2][GRU_STEPS][3]) {
    int pos[2] = {0, 0}, step[2] = {0, 0};
    float zeros[3] = {0, 0, 0};
    CHECK(n == 2 * GRU_STEPS + 5);
    for (size_t r = 0; r < n; r++) {
        const unsigned char *rec = recs + 72 * r;
        uint32_t slot;
        memcpy(&slot, rec + 4, 4);
        if (slot > 1 || step[slot] >= GRU_STEPS) continue;
        int final = rec[0] & RLK_REC_FINAL_OBS, on_grid = !final && pos[slot] % 5 == 0;
        CHECK(!!(rec[0] & RLK_REC_HAS_STATE) == on_grid);
        CHECK(!memcmp(rec + 60, on_grid ? fed[slot][step[slot]] : zeros, sizeof zeros));
        pos[slot] = final ? 0 : pos[slot] + 1;
        step[slot] += !final;
    }
    CHECK(step[0] == GRU_STEPS && step[1] == GRU_STEPS && memcmp(fed[1][9], zeros, sizeof zeros) != 0);
}

/* rlk_local over a GRU policy's ring and board (the daemon's side played here). */
static void test_recurrent_records(const char *fifo, const char *board) {
    rlk_spaces sp;
    rlk_attached a;
    rlk_reply_info i = info();
    rlk_local *l = NULL;
    rlk_mlp *oracle = NULL;
    char err[RLK_ERROR_CHARS];
    int sv[2], ring = make_ring_of(GRU_RING_LAYOUT, 72, 0, 1), view = dup(ring);
    float fed[2][GRU_STEPS][3], w[GRU_PARAMS];
    for (int k = 0; k < GRU_PARAMS; k++) w[k] = 0.5f - 0.1f * (float)(k % 7);
    rlk_parse_set_config(CARTPOLE_CONFIG, strlen(CARTPOLE_CONFIG), toks, MAX_TOKS, &sp, &i);
    CHECK(rlk_parse_attached(ATTACHED_GRU, strlen(ATTACHED_GRU), toks, MAX_TOKS, &sp, 4, &a, &i) == RLK_OK);
    CHECK(rlk_mlp_parse(ATTACHED_GRU, toks, rlk_json_get(ATTACHED_GRU, toks, 0, "network"), 4, 2, 1, &oracle, err,
                        sizeof err) == RLK_OK);
    snprintf(a.board_path, sizeof a.board_path, "%s", board);
    snprintf(a.doorbell_path, sizeof a.doorbell_path, "%s", fifo);
    make_board(board, GRU_PARAMS, w, 0.0f, 0, 0);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0 && send_fd(sv[1], ring) == 0);
    close(ring);
    CHECK(rlk_local_new(&sp, 2, 0, 1, &l) == RLK_OK);
    CHECK(rlk_local_attach(l, &a, sv[0], 1.0, toks, MAX_TOKS, err, sizeof err) == RLK_OK);
    drive_gru(l, oracle, w, fed);
    CHECK(rlk_local_write(l, sv[0], 1.0) == 0);
    size_t off = records_offset_of(GRU_RING_LAYOUT), bytes = off + RING_CAPACITY * 72;
    unsigned char *m = mmap(NULL, bytes, PROT_READ, MAP_SHARED, view, 0);
    uint64_t tail;
    memcpy(&tail, m + 64, 8);
    check_gru_records(m + off, (size_t)tail, fed);
    munmap(m, bytes);
    rlk_local_free(l);
    rlk_mlp_free(oracle);
    close(view);
    close(sv[0]);
    close(sv[1]);
}

/* One attachment of l (as rlk_client's connect or reconnect does) to the GRU daemon's ATTACHED,
 * with max_seq_len L: a ring and a board of its own, the descriptor over a socket pair. */
static rlk_status attach_gru(rlk_local *l, const rlk_spaces *sp, int seq_len, const char *fifo, const char *board) {
    rlk_attached a;
    rlk_reply_info i = info();
    char err[RLK_ERROR_CHARS], *text = strdup(ATTACHED_GRU);
    int sv[2], ring = make_ring_of(GRU_RING_LAYOUT, 72, 0, 1);
    text[strstr(text, "\"max_seq_len\": 5") - text + 15] = (char)('0' + seq_len);
    CHECK(rlk_parse_attached(text, strlen(text), toks, MAX_TOKS, sp, 4, &a, &i) == RLK_OK);
    snprintf(a.board_path, sizeof a.board_path, "%s", board);
    snprintf(a.doorbell_path, sizeof a.doorbell_path, "%s", fifo);
    make_board(board, GRU_PARAMS, NULL, 0.1f, 0, 0);
    CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0 && send_fd(sv[1], ring) == 0);
    close(ring);
    rlk_status st = rlk_local_attach(l, &a, sv[0], 1.0, toks, MAX_TOKS, err, sizeof err);
    close(sv[0]);
    close(sv[1]);
    free(text);
    return st;
}

/* A reconnect to a daemon whose policy changed (here its max_seq_len) is refused, every time:
 * the refused description must not replace the first one (the buffers were sized by it). */
static void test_a_changed_policy_is_refused_at_every_reconnect(const char *fifo, const char *board) {
    rlk_spaces sp;
    rlk_reply_info i = info();
    rlk_local *l = NULL;
    float obs[4] = {0.1f, 0.2f, 0.3f, 0.4f}, action[1];
    rlk_parse_set_config(CARTPOLE_CONFIG, strlen(CARTPOLE_CONFIG), toks, MAX_TOKS, &sp, &i);
    CHECK(rlk_local_new(&sp, 1, 1, 1, &l) == RLK_OK);
    CHECK(attach_gru(l, &sp, 5, fifo, board) == RLK_OK);
    CHECK(attach_gru(l, &sp, 6, fifo, board) == RLK_E_UNSUPPORTED);
    CHECK(attach_gru(l, &sp, 6, fifo, board) == RLK_E_UNSUPPORTED);
    CHECK(attach_gru(l, &sp, 5, fifo, board) == RLK_OK);
    CHECK(rlk_local_act(l, 1, obs, action) == RLK_OK);
    rlk_local_free(l);
}

static void test_shared_memory_pieces(void) {
    char dir[] = "/tmp/rlk-test-XXXXXX", fifo[64], board[64];
    if (!mkdtemp(dir)) {
        CHECK(0);
        return;
    }
    snprintf(fifo, sizeof fifo, "%s/doorbell", dir);
    snprintf(board, sizeof board, "%s/board", dir);
    keep_reader = mkfifo(fifo, 0600) == 0 ? open(fifo, O_RDONLY | O_NONBLOCK) : -1;  /* (the collector's end) */
    CHECK(keep_reader >= 0);
    test_recurrent_records(fifo, board);
    test_a_changed_policy_is_refused_at_every_reconnect(fifo, board);
    test_ring(fifo);
    test_board(board);
    if (keep_reader >= 0) close(keep_reader);
    unlink(fifo);
    unlink(board);
    rmdir(dir);
}

/* Numbers read and written in the C locale even when the process runs in a comma-decimal one
 * (built here with localedef when the machine has the sources; skipped otherwise). */
static void test_numbers_ignore_the_locale(void) {
    char dir[] = "/tmp/rlk-locale-XXXXXX", cmd[256];
    if (!mkdtemp(dir)) return;
    snprintf(cmd, sizeof cmd, "localedef -i de_DE -f UTF-8 %s/de_DE.UTF-8 >/dev/null 2>&1", dir);
    int built = system(cmd) == 0;
    setenv("LOCPATH", dir, 1);
    if (built && setlocale(LC_NUMERIC, "de_DE.UTF-8")) {
        const char *doc = "[-1.5, 2.25e1]";
        double v = 0, e = 0;
        char buf[32];
        rlk_jw w;
        CHECK(rlk_json_parse(doc, strlen(doc), toks, MAX_TOKS) == 3);
        CHECK(rlk_json_num(doc, &toks[1], &v) == 0 && v == -1.5 && rlk_json_num(doc, &toks[2], &e) == 0 && e == 22.5);
        rlk_jw_init(&w, buf, sizeof buf);
        rlk_jw_num(&w, 0.5);
        CHECK(w.len == 3 && !memcmp(buf, "0.5", 3));
        setlocale(LC_NUMERIC, "C");
    } else {
        printf("test_numbers_ignore_the_locale: skipped (no localedef / de_DE sources)\n");
    }
    unsetenv("LOCPATH");
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) printf("could not remove %s\n", dir);
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

/* Child: one connection per script entry; each answers the handshake (SERVE_DIRECT with
 * SERVE_DIRECT_READY; a connection that does not ask for it: exit 6), then replies script[k]
 * to the first STEP_BATCH and well-formed ACTIONS after. "CLOSE": hang up at the first
 * STEP_BATCH; "REFUSE_DIRECT": the inference process's "no room" ERROR to SERVE_DIRECT;
 * "?TEXT": the first STEP_BATCH must contain TEXT (else exit 4), then ACTIONS. Every later
 * request on a "?" connection must keep ends before starts (else exit 5). */
static void scripted_server(int listener, const char *const *script, int n) {
    char req[8192];
    for (int k = 0; k < n; k++) {
        int fd = accept(listener, NULL, NULL);
        if (fd < 0) _exit(3);
        if (read_request(fd, req, sizeof req) == 0) serve_reply(fd, "{\"type\": \"PONG\"}");
        if (read_request(fd, req, sizeof req) == 0) serve_reply(fd, CARTPOLE_CONFIG);
        int got = read_request(fd, req, sizeof req);
        if (got != 0 || !strstr(req, "\"SERVE_DIRECT\"")) _exit(6);
        if (strcmp(script[k], "REFUSE_DIRECT") == 0) {
            serve_reply(fd, "{\"type\": \"ERROR\", \"message\": \"" RLK_DIRECT_REFUSED " no room\"}");
            close(fd);
            continue;
        }
        serve_reply(fd, "{\"type\": \"SERVE_DIRECT_READY\"}");
        got = read_request(fd, req, sizeof req);
        if (got == 0 && strcmp(script[k], "CLOSE") != 0) {
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

static void test_a_refused_serve_direct_is_an_error_and_the_next_connection_asks_again(void) {
    const char *const script[] = {"REFUSE_DIRECT", "?\"start\": true"};
    char path[64], address[80];
    snprintf(path, sizeof path, "/tmp/rlk-test-d%ld.sock", (long)getpid());
    snprintf(address, sizeof address, "unix://%s", path);
    pid_t pid = start_server(path, script, 2);
    rlk_options o;
    rlk_options_init(&o);
    o.address = address;
    o.io_timeout_s = 5.0;
    rlk_client *refused = NULL;
    CHECK(rlk_connect(&o, &refused) == RLK_E_SERVER && refused == NULL);
    rlk_client *c = client_for(address, 5.0);
    float obs[4] = {0}, action[1] = {-1};
    if (c) {
        CHECK(rlk_act(c, obs, action) == RLK_OK && action[0] == 1.0f);
        rlk_close(c);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);  /* (6: a connection without SERVE_DIRECT) */
    unlink(path);
}

/* ----------------------------------------------------------------- addresses and errors */
/* Every case of the grammar table both clients share (tests/addresses.tsv). */
static void test_addresses(const char *table) {
    FILE *f = fopen(table, "r");
    char line[1024], got[1024], err[RLK_ERROR_CHARS];
    int cases = 0;
    CHECK(f != NULL);
    while (f && fgets(line, sizeof line, f)) {
        char *tab = strchr(line, '\t');
        if (line[0] == '#' || !tab) continue;
        *tab = '\0';
        tab[strcspn(tab + 1, "\n") + 1] = '\0';
        rlk_addr a;
        if (rlk_addr_parse(line, &a, err, sizeof err) == 0) rlk_addr_describe(&a, got, sizeof got);
        else snprintf(got, sizeof got, "error");
        if (strcmp(got, tab + 1) != 0) fprintf(stderr, "address \"%s\": got \"%s\", want \"%s\"\n", line, got, tab + 1);
        CHECK(strcmp(got, tab + 1) == 0);
        cases++;
    }
    CHECK(cases >= 20);
    if (f) fclose(f);
}

/* A state dir's daemon.json names the socket; a dead pid or no file is a clear error. */
static void test_state_dir_lookup(void) {
    char dir[] = "/tmp/rlk-state-XXXXXX", file[128], sock[512], err[RLK_ERROR_CHARS];
    CHECK(mkdtemp(dir) != NULL);
    snprintf(file, sizeof file, "%s/daemon.json", dir);
    CHECK(rlk_addr_daemon_socket(dir, sock, sizeof sock, err, sizeof err) == -1 && strstr(err, dir));
    FILE *f = fopen(file, "w");
    if (f) {
        fprintf(f, "{\"pid\": %ld, \"unix_socket\": \"%s/run/rlinkd.sock\", \"port\": 5555}", (long)getpid(), dir);
        fclose(f);
    }
    CHECK(rlk_addr_daemon_socket(dir, sock, sizeof sock, err, sizeof err) == 0);
    CHECK(strstr(sock, "/run/rlinkd.sock") != NULL && strncmp(sock, dir, strlen(dir)) == 0);
    f = fopen(file, "w");
    if (f) {
        fprintf(f, "{\"pid\": 2147483646, \"unix_socket\": \"/x.sock\"}");  /* (no such process) */
        fclose(f);
    }
    CHECK(rlk_addr_daemon_socket(dir, sock, sizeof sock, err, sizeof err) == -1 && strstr(err, "gone"));
    unlink(file);
    rmdir(dir);
}

/* A TCP port nothing listens on (bound, never listened to, then closed). */
static int closed_port(void) {
    struct sockaddr_in sa;
    socklen_t n = sizeof sa;
    memset(&sa, 0, sizeof sa);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int ok = fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && getsockname(fd, (struct sockaddr *)&sa, &n) == 0;
    if (fd >= 0) close(fd);
    return ok ? ntohs(sa.sin_port) : 1;
}

/* rlk_connect's failures say what and where, read through rlk_error(NULL). */
static void test_connect_errors_name_the_address_and_the_reason(void) {
    rlk_options o;
    rlk_client *c = NULL;
    char address[64];
    rlk_options_init(&o);
    snprintf(address, sizeof address, "tcp://127.0.0.1:%d", closed_port());
    o.address = address;
    o.reconnect_timeout_s = 0;
    CHECK(rlk_connect(&o, &c) == RLK_E_CONNECT && c == NULL);
    CHECK(strstr(rlk_error(NULL), address) != NULL);
    CHECK(strstr(rlk_error(NULL), "onnection refused") != NULL);  /* (not "Operation now in progress") */
    o.address = "shm:/nonexistent-rlk-state";
    CHECK(rlk_connect(&o, &c) == RLK_E_CONNECT);
    CHECK(strstr(rlk_error(NULL), "state dir /nonexistent-rlk-state") != NULL);
    o.address = "tls://127.0.0.1:5555";
    CHECK(rlk_connect(&o, &c) == RLK_E_UNSUPPORTED && strstr(rlk_error(NULL), "TLS"));
    o.address = "shm:";
    CHECK(rlk_connect(&o, &c) == RLK_E_ARG && strstr(rlk_error(NULL), "\"shm:\""));
    o.max_agents = 0;
    CHECK(rlk_connect(&o, &c) == RLK_E_ARG && strstr(rlk_error(NULL), "max_agents"));
}

/* Reconnecting gives up once (after reconnect_timeout_s); later calls try once and fail fast. */
static void test_a_client_that_gave_up_fails_fast(void) {
    const char *const script[] = {"CLOSE"};
    char path[64], address[80];
    snprintf(path, sizeof path, "/tmp/rlk-test-g%ld.sock", (long)getpid());
    snprintf(address, sizeof address, "unix://%s", path);
    pid_t pid = start_server(path, script, 1);
    rlk_client *c = client_for(address, 1.0);
    float obs[4] = {0}, action[1];
    if (c) {
        double t0 = rlk_now();
        CHECK(rlk_act(c, obs, action) == RLK_E_CONNECT && strstr(rlk_error(c), "gave up reconnecting after"));
        double t1 = rlk_now();
        CHECK(t1 - t0 >= 0.5);  /* (backoff: it gives up when the next wait would pass the deadline) */
        CHECK(rlk_act(c, obs, action) == RLK_E_CONNECT && strstr(rlk_error(c), "gave up reconnecting earlier"));
        CHECK(rlk_act(c, obs, action) == RLK_E_CONNECT);
        CHECK(rlk_now() - t1 < 0.5);  /* (not another reconnect_timeout_s each) */
        CHECK(strstr(rlk_error(c), path) != NULL);
        rlk_close(c);
    }
    int status = 0;
    waitpid(pid, &status, 0);
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

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    test_addresses(argc > 1 ? argv[1] : "tests/addresses.tsv");
    test_state_dir_lookup();
    test_connect_errors_name_the_address_and_the_reason();
    test_json();
    test_writer();
    test_parsers();
    fuzz_parsers();
    test_local_parsers();
    fuzz_local_parsers();
    test_shared_memory_pieces();
    test_numbers_ignore_the_locale();
    test_arguments_are_checked();
    test_bad_replies_give_error_codes();
    test_a_refused_serve_direct_is_an_error_and_the_next_connection_asks_again();
    test_a_lost_connection_is_reestablished_and_the_episode_goes_on();
    test_a_client_that_gave_up_fails_fast();
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("test_client: all checks passed\n");
    return 0;
}
