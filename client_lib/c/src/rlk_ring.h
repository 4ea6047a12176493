/*
 * rlk_ring.h - the shared-memory data path of client-side inference: this client's step ring
 * (a sealed memfd received after ATTACHED), the daemon's weights board, and the doorbell FIFO.
 * The layouts are shm/ring.py's, shm/records.py's and shm/board.py's (little-endian):
 *
 *   ring header (320 bytes), then the layout JSON, then capacity records:
 *     0 magic "RLKRING1" | 8 layout_version u32 (3) | 12 record_bytes u32 | 16 capacity u64
 *     24 writer_pid u32 | 28 reader_pid u32 | 32 layout_bytes u32 | 64 tail u64 (producer)
 *     128 head u64 (consumer) | 192 reader_sleeping u32 | 256 closed u32 | 260 writer_waiting u32
 *     320 layout JSON | records at align(320 + layout_bytes, 64); record i at slot i & (capacity-1)
 *   step record (a flat float observation of O floats, A action and D dist floats):
 *     0 flags u8 | 1 pad[3] | 4 stream_id u32 (the agent slot) | 8 weights_seq_no i64
 *     16 ingest_id u64 (0) | 24 reward f32 | 28 logp f32 | 32 obs f32[O] | 32+4O action f32[A]
 *     32+4(O+A) dist f32[D] | 32+4(O+A+D) state f32[S] (a recurrent policy's; S = 0 otherwise)
 *     | pad to a multiple of 8
 *   weights board:
 *     0 magic "RLKBOARD" | 8 layout_version u32 (1) | 12 spec_json_len u32 | 16 n_params u64
 *     24 writer_pid u32 | 64 seqlock u64 | 72 active u32 | 80 buffer_seq_no i64[2]
 *     128 spec JSON (16384 bytes) | 16512 buffer 0 f32[n_params] | 16512 + S buffer 1, S = 4 n rounded to 64
 *
 * The ring is single-producer: one client, one thread. The tail is published with release
 * order, then a full fence before reading reader_sleeping (the Dekker handshake of
 * shm/_sync.py); the board is read under its seqlock (retried until consistent).
 */
#ifndef RLK_RING_H
#define RLK_RING_H

#include <stddef.h>
#include <stdint.h>

#include "rlinkd.h"
#include "rlk_json.h"

#include "rlk_declared.h"  /* RLK_REC_ flags and header size: generated from shm/records.py */

typedef struct {
    size_t obs_size, act_size, dist_size, state_size, record_bytes;
} rlk_layout;

/* The record layout of these sizes (record_bytes computed as shm/records.py does). */
rlk_layout rlk_layout_flat(size_t obs_size, size_t act_size, size_t dist_size, size_t state_size);

/* A step layout JSON object token ({"obs_fields": [[name, "<f4", [dims]]], "action_size",
 * "dist_size", "record_bytes", "state_size" (absent: 0)}) equal to want: RLK_OK; one float32
 * field of another size or other sizes: RLK_E_PROTOCOL; several fields or another dtype:
 * RLK_E_UNSUPPORTED. */
rlk_status rlk_layout_check(const char *s, const rlk_jtok *toks, int obj, const rlk_layout *want);

/* Fill record `rec` (want->record_bytes bytes). obs, action, dist, state may be NULL (zeros). */
void rlk_record_fill(unsigned char *rec, const rlk_layout *l, int flags, uint32_t slot, int64_t seq, float reward,
                     float logp, const float *obs, const float *action, const float *dist, const float *state);

typedef struct rlk_ring rlk_ring;

/* Map the sealed ring memfd ring_fd (taken over: closed on failure too) and open the doorbell
 * FIFO; checks the seals, every header field and the layout JSON against want. */
rlk_status rlk_ring_attach(int ring_fd, const char *doorbell_path, const rlk_layout *want, rlk_jtok *toks,
                           int max_toks, rlk_ring **out, char *err, size_t cap);
void rlk_ring_close(rlk_ring *r);
size_t rlk_ring_capacity(const rlk_ring *r);

/* Append n records (records: n * record_bytes bytes) all at once, waiting for space (polling
 * with backoff) while the collector drains; wakes it if it sleeps. 0; 1 the socket became
 * readable first (an ERROR or EOF: the caller reads it); -2 deadline; -3 n exceeds the
 * capacity; -1 an I/O error or the collector gone (its doorbell has no reader). Nothing is
 * published unless everything is. */
int rlk_ring_write(rlk_ring *r, const unsigned char *records, size_t n, int sock, double timeout_s);

typedef struct rlk_board rlk_board;

/* Map the weights board at path read-only and check its header; n_params must match. */
rlk_status rlk_board_attach(const char *path, size_t n_params, rlk_board **out, char *err, size_t cap);
void rlk_board_close(rlk_board *b);
/* The version the board holds now (-1 before the first publish). */
int64_t rlk_board_latest(const rlk_board *b);
/* Copy the current weights (n_params floats) into out: their version (-1: none yet). */
int64_t rlk_board_read(const rlk_board *b, float *out);

#endif /* RLK_RING_H */
