/*
 * rlk_lanes.h - the shared-memory path of server-side actions: a lane area received from the
 * daemon (SERVE_ATTACH on its Unix socket, then one byte carrying three descriptors: the
 * sealed memfd area, the request doorbell, this client's response doorbell). One lane per
 * agent; a request is written into the lane and published by bumping req_seq; the inference
 * role answers in the same lane and sets resp_seq = req_seq. The layout is shm/lanes.py's:
 *
 *   area header (64 bytes, little-endian):
 *     0 magic "RLKLANE1" | 8 layout_version u32 (2) | 12 lane_bytes u32 | 16 capacity u32
 *     20 writer_pid u32 | 24 reader_pid u32 | 28 layout_bytes u32 | 32 server_sleeping u32
 *     36 client_waiting u32 | 40 requests u64 | 48 pad[16] | 64 layout JSON | lanes at
 *     align(64 + layout_bytes, 64)
 *   lane (lane_bytes, a multiple of 64):
 *     0 req_seq u32 | 4 resp_seq u32 | 8 op u8 | 9 flags u8 | 10 group_size u16 | 12 reward f32
 *     16 status i32 | 20 group u32 | 24 weights_seq_no i64 | 32 logp f32 | 36 pad
 *     40 action f32[A] | align(40 + 4A, 8) obs (one float32 field: a flat float Box)
 *
 * Wake-ups follow the Dekker handshake of shm/_sync.py with full fences on both sides.
 * Memory ordering uses the GCC/Clang __atomic builtins (the one compiler extension used).
 */
#ifndef RLK_LANES_H
#define RLK_LANES_H

#include <stddef.h>

#include "rlinkd.h"
#include "rlk_json.h"
#include "rlk_declared.h"  /* ops, flags, statuses and offsets: generated from shm/lanes.py */
#include "rlk_proto.h"

typedef struct rlk_lanes rlk_lanes;

/* After a SERVE_ATTACHED frame (s[0..len)) on sock: receive the three descriptors, map the
 * area and check its header and layout against sp and the lane count. RLK_E_UNSUPPORTED for
 * an observation layout other than one float32 field. */
rlk_status rlk_lanes_attach(int sock, double timeout_s, const char *s, size_t len, rlk_jtok *toks,
                            int max_toks, const rlk_spaces *sp, int lanes, rlk_lanes **out, char *err,
                            size_t cap);
void rlk_lanes_close(rlk_lanes *l);

/* Write a request into a lane (its previous request must be answered). */
void rlk_lanes_write(rlk_lanes *l, int lane, int op, int flags, float reward, const float *obs);
/* Publish the written requests of lanes[0..n) as one group (n > 1) or a lone request; ring the
 * daemon if it sleeps. */
void rlk_lanes_publish(rlk_lanes *l, const int *lanes, int n);
/* Wait until lanes[0..n) are answered: 0; 1 the socket became readable first (the caller reads
 * the frame: an ERROR or EOF); -2 the deadline passed; -1 an I/O error on a descriptor. */
int rlk_lanes_wait(rlk_lanes *l, const int *lanes, int n, int sock, double timeout_s);
/* 1 when a lane has no request in flight. */
int rlk_lanes_answered(const rlk_lanes *l, int lane);
/* An answered lane's status (RLK_LANE_*), its action (act_size floats) and weights version. */
int rlk_lanes_result(const rlk_lanes *l, int lane, float *action, long *seq);

#endif /* RLK_LANES_H */
