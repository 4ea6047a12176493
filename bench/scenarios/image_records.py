"""Image step records through a StepRing: uint8 observations copied as bytes, measured in one run.

    .venv/bin/python -m bench.scenarios.image_records [--runs 5] [--records 100000] [--quick]

One process, one ring of ``RING_RECORDS`` records of an Atari-like layout: an 84x84x3 uint8
camera field, a 1-float action, 6 dist floats (21,232-byte records).

a) ``ring``: ``write_batch`` of a 256-record block, then ``read_batch(256)`` (a fresh array,
   as the collector and connector get), repeated until ``--records`` records went through.
b) ``memcpy``: the same two copies of the same bytes with plain numpy (``np.copyto`` of a
   [256, record_bytes] uint8 block into a ring-sized buffer at the same slots, then out into
   a freshly allocated array): the floor the ring's bookkeeping is compared with.
c) ``write_step``: the generic single-step path (``StepRing.write_step`` with a dict obs
   holding a uint8 image), drained every 256 steps with ``read_batch``.
d) ``flat write_step``: the generated fast path for a CartPole record (4 obs floats,
   1 action, 2 dist floats), drained every 4,096 steps, to watch that it did not slow down.

records/s = records / wall time of the loop (``time.perf_counter``); GB/s counts each
record's bytes once (a) and (b) copy every byte twice, in and out). Median (min-max) of
``--runs``. Issue 10's target: >= 50,000 image steps/s into the connector over shared memory.
Results go to ``bench/results/image_records.json``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np

from bench.harness.common import fmt_mr, median_range, print_table, write_result
from rlinkd.shm.records import StepLayout
from rlinkd.shm.ring import StepRing

IMAGE = StepLayout((("camera", "|u1", (84, 84, 3)),), 1, 6)
FLAT = StepLayout.flat(4, 1, 2)
RING_RECORDS = 1024
BLOCK = 256


def _block(n: int) -> np.ndarray:
    rec = IMAGE.empty(n)
    rec["obs"]["camera"] = np.random.default_rng(0).integers(0, 256, (n, 84, 84, 3), dtype=np.uint8)
    rec["action"][:, 0] = np.arange(n) % 6
    return rec


def ring_loop(ring: StepRing, n_records: int) -> float:
    """(a): seconds for ``n_records`` through write_batch + read_batch."""
    block = _block(BLOCK)
    started = time.perf_counter()
    for _ in range(n_records // BLOCK):
        ring.write_batch(block)
        out = ring.read_batch(BLOCK)
    elapsed = time.perf_counter() - started
    assert out.tobytes() == block.tobytes()
    return elapsed


def memcpy_loop(n_records: int) -> float:
    """(b): the same copies with plain numpy."""
    block = _block(BLOCK).view(np.uint8).reshape(BLOCK, IMAGE.record_bytes)
    area = np.zeros((RING_RECORDS, IMAGE.record_bytes), np.uint8)
    started = time.perf_counter()
    for i in range(n_records // BLOCK):
        start = (i * BLOCK) % RING_RECORDS
        np.copyto(area[start:start + BLOCK], block)
        out = np.empty_like(block)
        np.copyto(out, area[start:start + BLOCK])
    return time.perf_counter() - started


def write_step_loop(ring: StepRing, n_steps: int) -> float:
    """(c): seconds for ``n_steps`` generic write_step calls (plus the drains)."""
    image = _block(1)["obs"]["camera"][0]
    write = ring.write_step
    started = time.perf_counter()
    for i in range(n_steps):
        write(0, {"camera": image}, i % 6, 1.0)
        if i % BLOCK == BLOCK - 1:
            ring.read_batch(BLOCK)
    return time.perf_counter() - started


def flat_write_step_loop(ring: StepRing, n_steps: int) -> float:
    """(d): seconds for ``n_steps`` fast-path write_step calls of CartPole records."""
    obs, dist, drain = (0.01, -0.02, 0.03, -0.04), (0.05, -0.05), 4096
    write = ring.write_step
    started = time.perf_counter()
    for i in range(n_steps):
        write(0, obs, i & 1, 1.0, -0.69, dist)
        if i % drain == drain - 1:
            ring.read_batch(drain)
    return time.perf_counter() - started


def one_run(shm_dir: str, n_records: int) -> dict:
    image_ring = StepRing.create(os.path.join(shm_dir, "image"), IMAGE, RING_RECORDS)
    flat_ring = StepRing.create(os.path.join(shm_dir, "flat"), FLAT, 8192)
    try:
        n = n_records // BLOCK * BLOCK
        ring_s, memcpy_s = ring_loop(image_ring, n), memcpy_loop(n)
        steps = max(BLOCK, n // 4)
        step_s = write_step_loop(image_ring, steps)
        flat_steps = 20 * n
        flat_s = flat_write_step_loop(flat_ring, flat_steps)
    finally:
        for ring in (image_ring, flat_ring):
            ring.close()
            ring.unlink()
    gb = n * IMAGE.record_bytes / 1e9
    figures = {"ring_records_per_s": n / ring_s, "ring_gb_per_s": gb / ring_s,
               "memcpy_records_per_s": n / memcpy_s, "memcpy_gb_per_s": gb / memcpy_s,
               "write_step_per_s": steps / step_s, "flat_write_step_per_s": flat_steps / flat_s}
    return {key: round(value, 3) for key, value in figures.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--quick", action="store_true", help="1 run of 20,000 records")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    runs, records = (1, 20_000) if args.quick else (args.runs, args.records)
    shm_dir = tempfile.mkdtemp(prefix="rlinkd-bench-img-", dir="/dev/shm")
    try:
        results = [one_run(shm_dir, records) for _ in range(runs)]
    finally:
        shutil.rmtree(shm_dir, ignore_errors=True)
    summary = {key: median_range([r[key] for r in results], 2) for key in results[0]}
    print_table(f"Image records ({IMAGE.record_bytes}-byte records, 84x84x3 uint8), median (min - max) "
                f"of {runs}", ("path", "records/s", "GB/s"), [
        ("ring: write_batch + read_batch", fmt_mr(summary["ring_records_per_s"]), fmt_mr(summary["ring_gb_per_s"], 2)),
        ("numpy memcpy, same two copies", fmt_mr(summary["memcpy_records_per_s"]),
         fmt_mr(summary["memcpy_gb_per_s"], 2)),
        ("generic write_step (dict obs)", fmt_mr(summary["write_step_per_s"]), "–"),
        ("flat write_step (CartPole, fast path)", fmt_mr(summary["flat_write_step_per_s"]), "–"),
    ])
    write_result("image_records", {"layout": IMAGE.to_json(), "block_records": BLOCK, "ring_records": RING_RECORDS,
                                   "records_per_run": records, "runs": results, "summary": summary}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
