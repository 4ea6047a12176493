/*
 * rlk_json.h - the JSON the C client needs, bounded: a tokenizer into a caller-owned token
 * array (no allocation, depth-limited, strict grammar) and a writer into a caller-owned
 * buffer (overflow is reported, never written past).
 *
 * Tokens are in document order; an object's children alternate key, value. tok.next is the
 * index just past the token's subtree, so a value is skipped with i = toks[i].next.
 */
#ifndef RLK_JSON_H
#define RLK_JSON_H

#include <stddef.h>

#define RLK_JSON_MAX_DEPTH 32

typedef enum { RLK_J_OBJECT, RLK_J_ARRAY, RLK_J_STRING, RLK_J_NUMBER, RLK_J_TRUE,
               RLK_J_FALSE, RLK_J_NULL } rlk_jtype;

typedef struct {
    rlk_jtype type;
    int start, len;  /* bytes of the value (a string: its raw content, without quotes; an
                        object or array: its whole text, brackets included) */
    int count;       /* children: array elements, or object keys + values */
    int next;        /* index of the first token after this subtree */
} rlk_jtok;

/* Tokenize s[0..len). Returns the token count, or -1 malformed, -2 more than max_toks
 * tokens, -3 deeper than RLK_JSON_MAX_DEPTH. Trailing whitespace only after the value. */
int rlk_json_parse(const char *s, size_t len, rlk_jtok *toks, int max_toks);

/* The value of key in object token obj, or -1 (keys compared byte for byte, unescaped). */
int rlk_json_get(const char *s, const rlk_jtok *toks, int obj, const char *key);
/* 1 if string token t is exactly text (no escapes in either), else 0. */
int rlk_json_str_eq(const char *s, const rlk_jtok *t, const char *text);
/* Number token t as a double (read in the C locale, whatever LC_NUMERIC); -1 if t is not a number. */
int rlk_json_num(const char *s, const rlk_jtok *t, double *out);
/* String token t decoded into out (at most cap-1 bytes, NUL-terminated; \u escapes
 * outside ASCII become '?'). -1 if t is not a string. */
int rlk_json_str(const char *s, const rlk_jtok *t, char *out, size_t cap);

typedef struct {
    char *buf;
    size_t cap, len;
    int overflow;  /* set once anything did not fit; the content is then unusable */
} rlk_jw;

void rlk_jw_init(rlk_jw *w, char *buf, size_t cap);
void rlk_jw_raw(rlk_jw *w, const char *text);
/* A JSON string (quotes added, control characters and " \ escaped). */
void rlk_jw_str(rlk_jw *w, const char *text);
/* A finite number (9 significant digits, C locale); returns -1 for NaN/inf (nothing written). */
int rlk_jw_num(rlk_jw *w, double v);
void rlk_jw_int(rlk_jw *w, long v);

#endif /* RLK_JSON_H */
