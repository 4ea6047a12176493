"""Image ingest: 84x84x3 uint8 observations into the connector's episode ring, over shared
memory and over TCP (compact arrays), each beside its copy/encoding limit measured in the same run.

    .venv/bin/python -m bench.scenarios.image_ingest [--runs 5] [--quick] [--profile]

Observation space Dict(camera = Box(0, 255, [84, 84, 3], uint8)), action Discrete(6)
(21,232-byte step records: the camera field, a 1-float action, 6 logits). A client sends
fragments of ``FRAGMENT_STEPS`` steps (the default ``sampling.env_steps_per_sample``),
terminated, with log-probs and dist inputs. "Steps" are env steps (FINAL_OBS records are
not counted).

a) ``shm``: transport's producer/consumer pair (``bench.scenarios.transport.run_pair``) with
   this layout. The producer does what client_lib's ShmLink does per fragment:
   ``fragment_records`` (the columns -> step records) and ``write_batch`` into its sealed
   ring; the consumer is the collector's ingestion code (``ShmClients.read``: read_batch +
   ``validate_records`` with the Box bound checks of every image leaf, episode accounting;
   stream/ingest ids) writing into an episode ring that is drained at once, as by the
   connector. steps/s = steps / (consumer's last validated record - producer's first write).
   Limit: ``memcpy`` = ``np.copyto`` of the same fragments' record bytes into a ring-sized
   area, once (one copy; the path makes five: into the client's records, into its ring,
   out of it, into the episode ring, out of it), in this process between the runs.
b) ``tcp``: ``--senders`` processes send the same pre-encoded EPISODES frame (one fragment,
   observations as ONE compact array {"b64", "dtype", "shape"} of [257, 84, 84, 3], made by
   ``Fragment.to_wire(..., compact=True)`` as client_lib does when the server announces
   ``compact_arrays``) as fast as the socket takes them into the real collector alone
   (``bench.harness.collector``: asyncio server, framing, orjson, ``to_columns`` with
   ``decode_compact`` and the Box checks, records, episode ring, a consumer draining it).
   steps/s = growth of the collector's ``env_steps`` over the window (status every 0.5 s).
   Limits, in this process: ``decode`` = ``orjson.loads`` of the frame's body + ``b64decode``
   of its compact arrays (the least the collector must do per frame); ``round trip`` = the
   client's ``b64encode`` + ``orjson.dumps`` too.

Targets (issue 10): (a) >= 50,000 steps/s, (b) >= 5,000 steps/s. Median (min-max) of
``--runs``. Writes ``bench/results/image_ingest.json``.
"""
from __future__ import annotations

import argparse
import base64
import sys
import time

import numpy as np
import orjson

from bench.harness.collector import IsolatedCollector
from bench.harness.common import fmt_mr, median_range, print_table, write_result
from bench.report import targets
from bench.scenarios.transport import _profiled, run_pair, tcp_run

FRAGMENT_STEPS = 256
CAMERA = (84, 84, 3)
EPISODE_RING_RECORDS = 8192
"""The episode ring of both paths (174 MB of image records; the daemon's default would be 1 GB)."""
OBS_TOML = ('{ type = "Dict", spaces = { camera = { type = "Box", shape = [84, 84, 3], '
            'dtype = "uint8", low = 0, high = 255 } } }')
ACT_TOML = '{ type = "Discrete", n = 6 }'


def image_spaces():
    """(collector ``Spaces``, StepLayout) of the benchmark (module level: spawn-picklable)."""
    from rlinkd.client_lib.protocol.spaces import Box, Dict, Discrete, record_fields
    from rlinkd.daemon.collector.ingest import Spaces
    from rlinkd.shm.records import StepLayout
    obs, act = Dict({"camera": Box(CAMERA, "uint8", 0, 255)}), Discrete(6)
    return Spaces(obs, act, act.dist_size), StepLayout(record_fields(obs), act.action_size, act.dist_size)


def fragment(seed: int = 0):
    """One terminated client fragment of FRAGMENT_STEPS steps in canonical form."""
    from rlinkd.client_lib.protocol.fragments import Fragment
    rng = np.random.default_rng(seed)
    t = FRAGMENT_STEPS
    camera = rng.integers(0, 256, (t + 1, *CAMERA), dtype=np.uint8)
    return Fragment(obs={"camera": camera}, actions=rng.integers(0, 6, (t, 1)).astype(np.float32),
                    rewards=np.ones(t), is_terminated=True, is_truncated=False,
                    action_logp=np.full(t, -1.79), action_dist_inputs=rng.normal(0, 0.1, (t, 6)))


# ---------------------------------------------------------------- (a) shared memory
def _write_fragments(ring, layout, frag, n_fragments: int) -> None:
    """What ShmLink does per fragment: records from the columns, then one write_batch."""
    from rlinkd.client_lib.protocol.records import fragment_records
    for _ in range(n_fragments):
        ring.write_batch(fragment_records(frag, layout, 0, 0), timeout_s=60.0)


def image_producer(conn, ring_fd, ring_name: str, fifo_path: str, n_steps: int, profile: bool) -> None:
    """Producer process: attach like client_lib's ShmLink, then write ``n_steps`` steps."""
    import os

    from rlinkd.shm.doorbell import Doorbell
    from rlinkd.shm.ring import StepRing
    _, layout = image_spaces()
    fifo = os.open(fifo_path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    ring = StepRing.attach_fd(ring_fd.fd, ring_name, expected_layout=layout, doorbell=Doorbell(fifo))
    frag, n_fragments = fragment(), max(1, n_steps // FRAGMENT_STEPS)
    conn.send("ready")
    conn.recv()
    t0 = time.perf_counter_ns()
    _, prof = _profiled(profile, _write_fragments, ring, layout, frag, n_fragments)
    t1 = time.perf_counter_ns()
    ring.mark_closed()
    conn.send({"t_start_ns": t0, "t_written_ns": t1, "steps": n_fragments * FRAGMENT_STEPS, "profile": prof})
    ring.close()


def memcpy_limit(n_steps: int) -> float:
    """Steps/s of one numpy copy of the fragments' record bytes into a ring-sized area."""
    from rlinkd.client_lib.protocol.records import fragment_records
    _, layout = image_spaces()
    block = fragment_records(fragment(), layout).view(np.uint8).reshape(FRAGMENT_STEPS + 1, -1)
    area = np.ones((EPISODE_RING_RECORDS, layout.record_bytes), np.uint8)  # pages touched: no faults timed
    n_fragments = max(1, n_steps // FRAGMENT_STEPS)
    per = len(block)
    started = time.perf_counter()
    for i in range(n_fragments):
        at = (i * per) % (EPISODE_RING_RECORDS - per)
        np.copyto(area[at:at + per], block)
    return n_fragments * FRAGMENT_STEPS / (time.perf_counter() - started)


def shm(runs: int, n_steps: int, profile: bool) -> dict:
    """(a): ``runs`` producer/consumer pairs, each followed by a memcpy-limit measurement."""
    results = []
    for i in range(runs):
        prof = profile and i == 0
        r = run_pair((prof, image_spaces, EPISODE_RING_RECORDS), image_producer, (n_steps, prof), prof)
        r["memcpy_steps_per_s"] = round(memcpy_limit(n_steps))
        results.append(r)
        print(f"  shm: {r['steps_per_s']:,} steps/s ingested (producer alone {r['producer_steps_per_s']:,}; "
              f"memcpy once {r['memcpy_steps_per_s']:,})", flush=True)
    return _summary(results, ("steps_per_s", "producer_steps_per_s", "memcpy_steps_per_s"))


# ---------------------------------------------------------------- (b) TCP, compact arrays
def episodes_frame() -> bytes:
    """The pre-encoded EPISODES frame client_lib would send for one fragment (compact form)."""
    from rlinkd.client_lib.protocol import codec
    spaces, _ = image_spaces()
    wire = fragment().to_wire(spaces.obs, spaces.act, compact=True)
    return codec.encode(codec.Episodes((wire,)))


def _compact_arrays(value) -> list[str]:
    """The b64 strings of every compact array in a JSON value."""
    if isinstance(value, dict):
        if "b64" in value:
            return [value["b64"]]
        return [s for v in value.values() for s in _compact_arrays(v)]
    if isinstance(value, list):
        return [s for v in value for s in _compact_arrays(v)]
    return []


def codec_limits(frame: bytes, repeats: int) -> dict:
    """Steps/s of the decode (orjson.loads + b64decode) and the round trip (+ b64encode +
    orjson.dumps) of ``frame``'s body, ``repeats`` times each."""
    body = frame[8:]
    raw = [base64.b64decode(s) for s in _compact_arrays(orjson.loads(body))]
    started = time.perf_counter()
    for _ in range(repeats):
        for s in _compact_arrays(orjson.loads(body)):
            base64.b64decode(s)
    decode_s = time.perf_counter() - started
    doc = orjson.loads(body)
    started = time.perf_counter()
    for _ in range(repeats):
        doc["episodes"][0]["obs"]["camera"]["b64"] = base64.b64encode(raw[0]).decode("ascii")
        for s in _compact_arrays(orjson.loads(orjson.dumps(doc))):
            base64.b64decode(s)
    round_s = time.perf_counter() - started
    steps = repeats * FRAGMENT_STEPS
    return {"decode_steps_per_s": round(steps / decode_s), "round_trip_steps_per_s": round(steps / round_s)}


def tcp(runs: int, duration_s: float, senders: int) -> dict:
    """(b): the collector alone, ``runs`` windows of ``senders`` senders, limits after each."""
    frame = episodes_frame()
    overrides = [f"env.observation_space={OBS_TOML}", f"env.action_space={ACT_TOML}",
                 "sampling.force_on_policy=false", f"sampling.episode_ring_records={EPISODE_RING_RECORDS}"]
    results = []
    with IsolatedCollector(overrides) as c:
        for _ in range(runs):
            r = tcp_run(c.port, c.unix_socket, duration_s, frame, FRAGMENT_STEPS, senders)
            r |= codec_limits(frame, 20)
            results.append(r)
            print(f"  tcp: {r['steps_per_s']:,} steps/s into the collector (decode limit "
                  f"{r['decode_steps_per_s']:,}, round trip {r['round_trip_steps_per_s']:,})", flush=True)
    summary = _summary(results, ("steps_per_s", "decode_steps_per_s", "round_trip_steps_per_s"))
    return summary | {"frame_bytes": len(frame), "senders": senders}


def _summary(results: list[dict], keys: tuple[str, ...]) -> dict:
    return {"runs": results} | {k: median_range([r[k] for r in results], 0) for k in keys}


# ---------------------------------------------------------------- report
def _ratio(a: dict, b: dict) -> str:
    return f"{a['median'] / b['median']:.2f}" if a.get("median") and b.get("median") else "–"


def table(res: dict) -> str:
    """The BENCHMARKS.md table (targets from bench.report.targets)."""
    s, t = res["shm"], res["tcp"]
    rows = [
        ("shm: client fragments → collector → episode ring", f"{fmt_mr(s['steps_per_s'])} steps/s",
         targets.IMAGE_SHM.bound_text(), _verdict(targets.IMAGE_SHM, s["steps_per_s"]["median"])),
        ("shm limit: numpy memcpy of the records, once", f"{fmt_mr(s['memcpy_steps_per_s'])} steps/s",
         f"path/limit {_ratio(s['steps_per_s'], s['memcpy_steps_per_s'])}, "
         f"target/limit {targets.IMAGE_SHM.bound / s['memcpy_steps_per_s']['median']:.3f}", "–"),
        (f"TCP compact, {t['senders']} senders → collector → episode ring", f"{fmt_mr(t['steps_per_s'])} steps/s",
         targets.IMAGE_TCP.bound_text(), _verdict(targets.IMAGE_TCP, t["steps_per_s"]["median"])),
        ("TCP limit: orjson.loads + b64decode of the frame", f"{fmt_mr(t['decode_steps_per_s'])} steps/s",
         f"path/limit {_ratio(t['steps_per_s'], t['decode_steps_per_s'])}, "
         f"target/limit {targets.IMAGE_TCP.bound / t['decode_steps_per_s']['median']:.3f}", "–"),
        ("TCP limit: + b64encode + orjson.dumps (round trip)", f"{fmt_mr(t['round_trip_steps_per_s'])} steps/s",
         f"path/limit {_ratio(t['steps_per_s'], t['round_trip_steps_per_s'])}", "–"),
    ]
    return print_table(f"Image ingest, 84x84x3 uint8 (median (min – max) of {res['runs']} runs)",
                       ("path", "result", "target / ratio", "status"), rows)


def _verdict(target: targets.Target, value: float | None) -> str:
    return "not measured" if value is None else "met" if target.met(value) else "MISSED"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="2 short runs (smoke test)")
    ap.add_argument("--senders", type=int, default=2, help="TCP sender processes")
    ap.add_argument("--profile", action="store_true", help="cProfile the first shm run")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    runs = 2 if args.quick else args.runs
    res: dict = {"quick": args.quick, "runs": runs, "fragment_steps": FRAGMENT_STEPS,
                 "record_bytes": image_spaces()[1].record_bytes}
    print("(a) shared memory", flush=True)
    res["shm"] = shm(runs, 20_480 if args.quick else 200_000, args.profile)
    print("(b) TCP, compact arrays", flush=True)
    res["tcp"] = tcp(runs, 3.0 if args.quick else 8.0, args.senders)
    res["targets"] = {t.name: t.bound_text() for t in targets.IMAGE}
    res["table_markdown"] = table(res)
    write_result("image_ingest", res, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
