/*
 * fuzz_raw.c - raw-byte fuzzing of the C client's reply parsers, run by `make check` under
 * AddressSanitizer and UndefinedBehaviorSanitizer.
 *
 *   fuzz_raw SECONDS CORPUS_FILE...
 *
 * Each round takes a corpus reply (or random bytes), applies 1-4 byte-level mutations (any
 * byte value; insertions, deletions, duplicated and spliced ranges, a truncation), copies it
 * into a buffer of exactly its length (ASan sees any read past it) and hands it to every
 * parser: the JSON tokenizer, SET_CONFIG, ACTIONS (discrete and Box spaces), PONG/ERROR,
 * ATTACHED (its network and distribution too) and WEIGHTS_READY. Each must return a known
 * status, and ATTACHED's pieces must all be freed (the leak check). Rounds follow a fixed
 * seed and stop after SECONDS (and at least MIN_ROUNDS): a failing round can be replayed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rlinkd.h"
#include "rlk_json.h"
#include "rlk_local.h"
#include "rlk_proto.h"

#define MAX_TOKS 512
#define MAX_SEEDS 64
#define MIN_ROUNDS 2000

static rlk_jtok toks[MAX_TOKS];
static char errbuf[RLK_ERROR_CHARS];
static unsigned long long state = 0x2545F4914F6CDD1Dull;

static unsigned next(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return (unsigned)(state >> 33);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct { char *data; size_t len; } blob;

static blob read_file(const char *path) {
    blob b = {NULL, 0};
    FILE *f = fopen(path, "rb");
    if (!f) return b;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    b.data = malloc(n > 0 ? (size_t)n : 1);
    if (b.data && n > 0 && fread(b.data, 1, (size_t)n, f) == (size_t)n) b.len = (size_t)n;
    fclose(f);
    return b;
}

/* One input into out (capacity cap): seeds[k] mutated, or random bytes. Returns its length. */
static size_t mutate(const blob *seeds, int n_seeds, char *out, size_t cap) {
    size_t n;
    if (next() % 20 == 0) {
        n = next() % 64;
        for (size_t i = 0; i < n; i++) out[i] = (char)(next() & 0xff);
        return n;
    }
    const blob *s = &seeds[next() % (unsigned)n_seeds];
    n = s->len < cap ? s->len : cap;
    memcpy(out, s->data, n);
    for (unsigned k = 1 + next() % 4; k > 0; k--) {
        size_t at = next() % (n + 1), span = 1 + next() % 16;
        switch (next() % 6) {
        case 0:
            if (at < n) out[at] = (char)(next() & 0xff);
            break;
        case 1:  /* insert random bytes */
            if (span > 8) span -= 8;
            if (n + span > cap) break;
            memmove(out + at + span, out + at, n - at);
            for (size_t i = 0; i < span; i++) out[at + i] = (char)(next() & 0xff);
            n += span;
            break;
        case 2:  /* delete */
            if (at + span > n) span = n - at;
            memmove(out + at, out + at + span, n - at - span);
            n -= span;
            break;
        case 3:  /* duplicate a range */
            if (at + span > n) span = n - at;
            if (n + span > cap) break;
            memmove(out + at + span, out + at, n - at);
            n += span;
            break;
        case 4: {  /* splice another seed's tail */
            const blob *o = &seeds[next() % (unsigned)n_seeds];
            size_t from = next() % (o->len + 1), take = o->len - from;
            if (at + take > cap) take = cap - at;
            memcpy(out + at, o->data + from, take);
            n = at + take;
            break;
        }
        default:
            n = at;
        }
    }
    return n;
}

static int known(rlk_status st) {
    return st == RLK_OK || st == RLK_E_PROTOCOL || st == RLK_E_LIMIT || st == RLK_E_SERVER ||
           st == RLK_E_UNSUPPORTED;
}

static int feed(const char *s, size_t n, const rlk_spaces *cart, const rlk_spaces *pend) {
    rlk_reply_info i = {errbuf, sizeof errbuf, 0};
    rlk_spaces sp;
    float actions[4];
    long seqs[2], seq;
    unsigned char nulls[2];
    double eps;
    rlk_attached a;
    int bad = rlk_json_parse(s, n, toks, MAX_TOKS) < -1000;  /* (any value; ASan watches the reads) */
    bad |= !known(rlk_parse_set_config(s, n, toks, MAX_TOKS, &sp, &i));
    bad |= !known(rlk_parse_actions(s, n, toks, MAX_TOKS, cart, 2, actions, seqs, nulls, &i));
    bad |= !known(rlk_parse_actions(s, n, toks, MAX_TOKS, pend, 2, actions, seqs, nulls, &i));
    bad |= !known(rlk_parse_pong(s, n, toks, MAX_TOKS, &i));
    bad |= !known(rlk_parse_weights_ready(s, n, toks, MAX_TOKS, "default", &seq, &eps, &i));
    bad |= !known(rlk_parse_attached(s, n, toks, MAX_TOKS, cart, 4, &a, &i));
    rlk_attached_free(&a);
    return bad;
}

int main(int argc, char **argv) {
    blob seeds[MAX_SEEDS];
    int n_seeds = 0;
    size_t cap = 0;
    if (argc < 3) {
        fprintf(stderr, "usage: fuzz_raw SECONDS CORPUS_FILE...\n");
        return 2;
    }
    for (int k = 2; k < argc && n_seeds < MAX_SEEDS; k++) {
        seeds[n_seeds] = read_file(argv[k]);
        if (!seeds[n_seeds].len) {
            fprintf(stderr, "fuzz_raw: cannot read %s\n", argv[k]);
            return 2;
        }
        if (seeds[n_seeds].len > cap) cap = seeds[n_seeds].len;
        n_seeds++;
    }
    cap = 2 * cap + 64;
    rlk_spaces cart, pend;
    rlk_reply_info i = {errbuf, sizeof errbuf, 0};
    const char *c = "{\"type\": \"SET_CONFIG\", \"observation_space\": {\"type\": \"Box\", \"shape\": [4], "
                    "\"low\": -1, \"high\": 1}, \"action_space\": {\"type\": \"Discrete\", \"n\": 2}}";
    const char *p = "{\"type\": \"SET_CONFIG\", \"observation_space\": {\"type\": \"Box\", \"shape\": [3], "
                    "\"low\": -1, \"high\": 1}, \"action_space\": {\"type\": \"Box\", \"shape\": [1], "
                    "\"low\": -2, \"high\": 2}}";
    if (rlk_parse_set_config(c, strlen(c), toks, MAX_TOKS, &cart, &i) != RLK_OK ||
        rlk_parse_set_config(p, strlen(p), toks, MAX_TOKS, &pend, &i) != RLK_OK) {
        fprintf(stderr, "fuzz_raw: the spaces did not parse: %s\n", errbuf);
        return 2;
    }
    char *work = malloc(cap);
    double deadline = now() + atof(argv[1]);
    long round = 0;
    for (; round < MIN_ROUNDS || now() < deadline; round++) {
        size_t n = mutate(seeds, n_seeds, work, cap);
        char *exact = malloc(n ? n : 1);  /* exactly sized: a read past the input is caught */
        memcpy(exact, work, n);
        if (feed(exact, n, &cart, &pend)) {
            fprintf(stderr, "fuzz_raw: round %ld: an unknown status for %zu bytes\n", round, n);
            return 1;
        }
        free(exact);
    }
    free(work);
    for (int k = 0; k < n_seeds; k++) free(seeds[k].data);
    printf("fuzz_raw: %ld rounds, no finding\n", round);
    return 0;
}
