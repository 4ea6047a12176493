/* rlk_json.c - bounded JSON tokenizer and writer (contract in rlk_json.h). */
#define _POSIX_C_SOURCE 200809L /* (newlocale, uselocale) */
#include "rlk_json.h"

#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *s;
    size_t len, pos;
    rlk_jtok *toks;
    int max_toks, n;
} parser;

/* Numbers are read and written in the C locale whatever the process's LC_NUMERIC (an engine
 * may run in a comma-decimal locale): a per-thread switch around strtod / snprintf. */
static locale_t c_numeric;
static pthread_once_t c_numeric_once = PTHREAD_ONCE_INIT;

static void make_c_numeric(void) { c_numeric = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0); }

static locale_t c_numeric_begin(void) {
    pthread_once(&c_numeric_once, make_c_numeric);
    return c_numeric ? uselocale(c_numeric) : (locale_t)0;
}

static void c_numeric_end(locale_t prev) {
    if (prev) uselocale(prev);
}

static void skip_ws(parser *p) {
    while (p->pos < p->len) {
        char ch = p->s[p->pos];
        if (ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r') break;
        p->pos++;
    }
}

static int new_tok(parser *p, rlk_jtype type) {
    if (p->n >= p->max_toks) return -2;
    rlk_jtok *t = &p->toks[p->n];
    t->type = type;
    t->start = (int)p->pos;
    t->len = 0;
    t->count = 0;
    t->next = p->n + 1;
    return p->n++;
}

static int is_hex(char ch) {
    return (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f') || (ch >= 'A' && ch <= 'F');
}

/* A string's content from the opening quote; -1 on a bad escape, a control char or no end. */
static int parse_string(parser *p) {
    int i = new_tok(p, RLK_J_STRING);
    if (i < 0) return i;
    size_t start = ++p->pos;  /* past the quote */
    while (p->pos < p->len) {
        unsigned char ch = (unsigned char)p->s[p->pos];
        if (ch == '"') {
            p->toks[i].start = (int)start;
            p->toks[i].len = (int)(p->pos - start);
            p->pos++;
            return i;
        }
        if (ch < 0x20) return -1;
        if (ch == '\\') {
            if (++p->pos >= p->len) return -1;
            char e = p->s[p->pos];
            if (e == 'u') {
                if (p->pos + 4 >= p->len) return -1;
                for (int k = 1; k <= 4; k++)
                    if (!is_hex(p->s[p->pos + (size_t)k])) return -1;
                p->pos += 4;
            } else if (!strchr("\"\\/bfnrt", e) || e == '\0') {
                return -1;
            }
        }
        p->pos++;
    }
    return -1;
}

static size_t digits(parser *p) {
    size_t n = 0;
    while (p->pos < p->len && p->s[p->pos] >= '0' && p->s[p->pos] <= '9') {
        p->pos++;
        n++;
    }
    return n;
}

/* -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static int parse_number(parser *p) {
    int i = new_tok(p, RLK_J_NUMBER);
    if (i < 0) return i;
    size_t start = p->pos;
    if (p->s[p->pos] == '-') p->pos++;
    if (p->pos >= p->len) return -1;
    if (p->s[p->pos] == '0') p->pos++;
    else if (digits(p) == 0) return -1;
    if (p->pos < p->len && p->s[p->pos] == '.') {
        p->pos++;
        if (digits(p) == 0) return -1;
    }
    if (p->pos < p->len && (p->s[p->pos] == 'e' || p->s[p->pos] == 'E')) {
        p->pos++;
        if (p->pos < p->len && (p->s[p->pos] == '+' || p->s[p->pos] == '-')) p->pos++;
        if (digits(p) == 0) return -1;
    }
    p->toks[i].start = (int)start;
    p->toks[i].len = (int)(p->pos - start);
    return i;
}

static int parse_literal(parser *p, const char *word, rlk_jtype type) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n) != 0) return -1;
    int i = new_tok(p, type);
    if (i < 0) return i;
    p->toks[i].len = (int)n;
    p->pos += n;
    return i;
}

static int parse_value(parser *p, int depth);

/* Elements of an array or members of an object, from just after the opening bracket. */
static int parse_container(parser *p, int depth, int is_object) {
    int i = new_tok(p, is_object ? RLK_J_OBJECT : RLK_J_ARRAY);
    if (i < 0) return i;
    if (depth >= RLK_JSON_MAX_DEPTH) return -3;
    char close = is_object ? '}' : ']';
    p->pos++;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
        p->toks[i].next = p->n;
        p->toks[i].len = (int)p->pos - p->toks[i].start;
        return i;
    }
    for (;;) {
        skip_ws(p);
        if (is_object) {
            if (p->pos >= p->len || p->s[p->pos] != '"') return -1;
            int k = parse_string(p);
            if (k < 0) return k;
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':') return -1;
            p->pos++;
            p->toks[i].count++;
        }
        int v = parse_value(p, depth + 1);
        if (v < 0) return v;
        p->toks[i].count++;
        skip_ws(p);
        if (p->pos >= p->len) return -1;
        if (p->s[p->pos] == ',') { p->pos++; continue; }
        if (p->s[p->pos] != close) return -1;
        p->pos++;
        p->toks[i].next = p->n;
        p->toks[i].len = (int)p->pos - p->toks[i].start;
        return i;
    }
}

static int parse_value(parser *p, int depth) {
    skip_ws(p);
    if (p->pos >= p->len) return -1;
    char ch = p->s[p->pos];
    if (ch == '{' || ch == '[') return parse_container(p, depth, ch == '{');
    if (ch == '"') return parse_string(p);
    if (ch == '-' || (ch >= '0' && ch <= '9')) return parse_number(p);
    if (ch == 't') return parse_literal(p, "true", RLK_J_TRUE);
    if (ch == 'f') return parse_literal(p, "false", RLK_J_FALSE);
    if (ch == 'n') return parse_literal(p, "null", RLK_J_NULL);
    return -1;
}

int rlk_json_parse(const char *s, size_t len, rlk_jtok *toks, int max_toks) {
    parser p = {s, len, 0, toks, max_toks, 0};
    if (s == NULL || toks == NULL || max_toks < 1) return -1;
    int r = parse_value(&p, 0);
    if (r < 0) return r;
    skip_ws(&p);
    return p.pos == len ? p.n : -1;
}

int rlk_json_str_eq(const char *s, const rlk_jtok *t, const char *text) {
    size_t n = strlen(text);
    return t->type == RLK_J_STRING && (size_t)t->len == n && memcmp(s + t->start, text, n) == 0;
}

int rlk_json_get(const char *s, const rlk_jtok *toks, int obj, const char *key) {
    if (obj < 0 || toks[obj].type != RLK_J_OBJECT) return -1;
    int i = obj + 1;
    for (int k = 0; k < toks[obj].count / 2; k++) {
        int value = i + 1;
        if (rlk_json_str_eq(s, &toks[i], key)) return value;
        i = toks[value].next;
    }
    return -1;
}

int rlk_json_num(const char *s, const rlk_jtok *t, double *out) {
    char tmp[64];
    if (t->type != RLK_J_NUMBER || t->len <= 0 || (size_t)t->len >= sizeof tmp) return -1;
    memcpy(tmp, s + t->start, (size_t)t->len);
    tmp[t->len] = '\0';
    locale_t prev = c_numeric_begin();
    *out = strtod(tmp, NULL);
    c_numeric_end(prev);
    return 0;
}

int rlk_json_str(const char *s, const rlk_jtok *t, char *out, size_t cap) {
    size_t o = 0;
    if (t->type != RLK_J_STRING || cap == 0) return -1;
    for (int k = 0; k < t->len && o + 1 < cap; k++) {
        char ch = s[t->start + k];
        if (ch == '\\' && k + 1 < t->len) {
            char e = s[t->start + ++k];
            const char *from = "bfnrt", *to = "\b\f\n\r\t";
            const char *hit = strchr(from, e);
            if (e == 'u') { ch = '?'; k += 4; }
            else ch = hit && e ? to[hit - from] : e;
        }
        out[o++] = ch;
    }
    out[o] = '\0';
    return 0;
}

/* ----------------------------------------------------------------- writer */
void rlk_jw_init(rlk_jw *w, char *buf, size_t cap) {
    w->buf = buf;
    w->cap = cap;
    w->len = 0;
    w->overflow = cap == 0;
}

static void put(rlk_jw *w, const char *bytes, size_t n) {
    if (w->overflow || w->cap - w->len < n) {
        w->overflow = 1;
        return;
    }
    memcpy(w->buf + w->len, bytes, n);
    w->len += n;
}

void rlk_jw_raw(rlk_jw *w, const char *text) { put(w, text, strlen(text)); }

void rlk_jw_str(rlk_jw *w, const char *text) {
    put(w, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        char esc[8];
        if (*c == '"' || *c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)*c;
            put(w, esc, 2);
        } else if (*c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", *c);
            put(w, esc, 6);
        } else {
            put(w, (const char *)c, 1);
        }
    }
    put(w, "\"", 1);
}

int rlk_jw_num(rlk_jw *w, double v) {
    char tmp[32];
    if (!isfinite(v)) return -1;
    locale_t prev = c_numeric_begin();
    int n = snprintf(tmp, sizeof tmp, "%.9g", v);
    c_numeric_end(prev);
    put(w, tmp, (size_t)n);
    return 0;
}

void rlk_jw_int(rlk_jw *w, long v) {
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%ld", v);
    put(w, tmp, (size_t)n);
}
