"""MinAtar (pixel observations, bool Box [10, 10, C]) trained by ``rlinkd serve``: learning
curve, env steps/s and the learner's time per update, for comparison with later GPU runs.

    .venv/bin/python -m bench.scenarios.minatar [--game Breakout] [--steps 500000] [--runs 3]
        [--clients 2] [--transport shm|tcp] [--learner-device auto|cpu|cuda ...] [--timeout-s 900]
        [--quick] [--out FILE]

One ``rlinkd serve`` with ``env.id = bench.harness.minatar_env:MinAtar/<game>-v1`` (the
module prefix registers MinAtar's ids with gymnasium in the daemon and the clients) and the
[ppo] settings of ``PPO`` (the only settings changed from the defaults; the network is the
default one for a 10x10 image: conv 16 3x3, conv 32 3x3, dense 128, then the (64, 64) tanh
trunks). ``--clients`` ``bench.scenarios.solve_client --env ...`` processes (client_lib's
``run_env``, numpy inference, exploring) are launched once the daemon is ready; each prints
every complete episode, pooled in time order. The run stops when the clients' summed env
steps reach ``--steps`` (or at ``--timeout-s``).

Figures:
- ``curve`` (``bench.harness.curves``' shape): the pooled clients' mean return of the last
  100 episodes after every episode, against wall time and pooled env steps;
- ``windows``: mean return of the episodes completed in each window of
  ``CURVE_WINDOW_STEPS`` env steps, at the pooled steps and wall time (s since the clients'
  launch) of the window's last episode (the episodes themselves are not kept: the windows
  and the thinned ``curve`` hold what the report shows, in a file a reviewer can open);
- env steps/s = summed client steps / wall time from launch to the last episode;
- the learner's ``update_time_s`` (one PPO update: epochs x minibatches over a train batch),
  sampled from ``rlinkd status`` every 2 s, median (min-max) over the updates sampled, and
  ``updates``/``trained_steps`` at the end.
- learner updates/s = the learner's ``updates`` at the end / the same wall time.
Each run has its own daemon (``learner.seed`` = run index) and client seeds; the summary
holds medians (min-max) over the runs.

``--learner-device`` sets ``learner.device`` (default ``auto``, the daemon's default); given
several (``--learner-device cpu cuda``, the end-to-end GPU-against-CPU comparison) the runs
alternate between them, run i of each device with the same seeds, and the result adds
``by_device`` (each device's summary and runs) and ``comparison_markdown``; ``summary``,
``runs`` and ``table_markdown`` are the first device's. ``cuda`` on a host without one is
the daemon's boot error. Writes ``bench/results/minatar.json``.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from rlinkd.daemon.launch import stop_processes

from bench.harness.common import REPO, fmt_mr, fmt_num, median_range, print_table, write_result
from bench.harness.curves import make_curve
from bench.harness.daemon import Daemon
from bench.scenarios.rlinkd_solve import EpisodePool

ENV_MODULE = "bench.harness.minatar_env"
"""The module gymnasium imports for a MinAtar id (it registers the games; importing it here
would load minatar and its plotting dependencies for every caller of this module)."""
PPO = {"ppo.lr": "0.0005", "ppo.ent_coef": "0.01", "ppo.num_epochs": "4", "ppo.minibatch_size": "128"}
"""[ppo] settings of the benchmark (everything else at the daemon's defaults)."""
CURVE_WINDOW_STEPS = 50_000
STATUS_EVERY_S = 2.0


def env_id(game: str) -> str:
    """The gymnasium id the daemon and the clients make (module prefix registers MinAtar)."""
    return f"{ENV_MODULE}:MinAtar/{game}-v1"


def overrides(game: str) -> list[str]:
    """``--set`` overrides of the benchmark's daemon."""
    return [f"env.id={env_id(game)}", *(f"{k}={v}" for k, v in PPO.items())]


def learning_curve(episodes: list[tuple[float, float, int]], window_steps: int) -> list[dict]:
    """(t, return, pooled env steps at its end) in time order -> one point per window of
    ``window_steps`` that has complete episodes: {"env_steps", "wall_s": at the window's last
    episode, "return_mean", "episodes": of the window's episodes}."""
    points: dict[int, list] = {}
    for t, ret, steps in episodes:
        points.setdefault(steps // window_steps, []).append((t, ret, steps))
    return [{"env_steps": v[-1][2], "wall_s": round(v[-1][0], 1),
             "return_mean": round(sum(r for _, r, _ in v) / len(v), 3), "episodes": len(v)}
            for _, v in sorted(points.items())]


def running_means(episodes: list[tuple[float, float, int]], last: int = 100) -> list[tuple[float, float, float]]:
    """(t, pooled steps, mean return of the last ``last`` episodes) after every episode:
    the points of the result's ``curve`` (``bench.harness.curves`` shape)."""
    out, window, total = [], [], 0.0
    for t, ret, steps in episodes:
        window.append(ret)
        total += ret
        if len(window) > last:
            total -= window.pop(0)
        out.append((t, steps, total / len(window)))
    return out


class CurvePool(EpisodePool):
    """EpisodePool that also keeps every episode as (t since launch, return, pooled steps)."""

    def __init__(self, n_clients: int, t0: float) -> None:
        super().__init__(n_clients)
        self.t0 = t0
        self.episodes: list[tuple[float, float, int]] = []

    def add(self, client: int, t: float, ret: float, steps: int) -> None:
        with self.lock:
            self.steps_by_client[client] = steps
            self.episodes.append((t - self.t0, ret, sum(self.steps_by_client)))

    @property
    def steps(self) -> int:
        with self.lock:
            return sum(self.steps_by_client)


def _sample_learner(daemon: Daemon, samples: list[dict]) -> None:
    """One status sample: the learner section's update_time_s, updates, trained steps."""
    learner = daemon.status().get("learner") or {}
    if "update_time_s" in learner:
        samples.append({"t": time.monotonic(), "update_time_s": learner["update_time_s"],
                        "updates": learner.get("updates"), "trained_steps": learner.get("trained_steps"),
                        "n_rows": learner.get("n_rows"), "entropy": learner.get("entropy")})


def run(game: str, n_clients: int, transport: str, budget_steps: int, timeout_s: float, seed: int = 0,
        device: str = "auto") -> dict:
    """Daemon (``learner.seed`` = ``seed``, ``learner.device`` = ``device``), then the clients
    (seeds 1000 + 10 x seed + i); until the budget (or timeout); the figures of one run."""
    env = {"PYTHONPATH": str(REPO)}  # the daemon imports bench.harness.minatar_env for env.id
    samples: list[dict] = []
    with Daemon([*overrides(game), f"learner.seed={seed}", f"learner.device={device}"], env=env) as daemon:
        address = f"tcp://127.0.0.1:{daemon.port}" if transport == "tcp" else f"shm:{daemon.state_dir}"
        t0 = time.monotonic()
        clients = [_start_client(address, game, 1000 + 10 * seed + i, Path(daemon.state_dir))
                   for i in range(n_clients)]
        pool = CurvePool(n_clients, t0)
        for i, c in enumerate(clients):
            threading.Thread(target=pool.follow, args=(i, c.stdout), daemon=True).start()
        try:
            while pool.steps < budget_steps and time.monotonic() - t0 < timeout_s:
                if any(c.poll() is not None for c in clients):
                    raise RuntimeError(f"a client exited early; logs in {daemon.state_dir}")
                _sample_learner(daemon, samples)
                time.sleep(STATUS_EVERY_S)
            status = daemon.status()
        finally:
            stop_processes(clients)
    return summarize(pool.episodes, samples, status)


def _start_client(address: str, game: str, seed: int, state_dir: Path) -> subprocess.Popen:
    with open(state_dir / f"client{seed}.log", "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "bench.scenarios.solve_client", "--connect", address,
                                 "--seed", str(seed), "--env", env_id(game)],
                                stdout=subprocess.PIPE, stderr=log, text=True, cwd=REPO,
                                env=dict(os.environ, PYTHONPATH=str(REPO)))


def summarize(episodes: list, samples: list[dict], status: dict) -> dict:
    """The result document's figures from the pooled episodes and the status samples."""
    wall = episodes[-1][0] if episodes else None
    steps = episodes[-1][2] if episodes else 0
    last = [r for _, r, _ in episodes[-100:]]
    learner = status.get("learner") or {}
    seen = {s["updates"]: s["update_time_s"] for s in samples}  # one value per update sampled
    return {"env_steps": steps, "wall_s": None if wall is None else round(wall, 1),
            "env_steps_per_s": round(steps / wall, 1) if wall else None,
            "updates_per_s": round(learner["updates"] / wall, 3) if wall and learner.get("updates") else None,
            "learner_device": learner.get("device"), "learner_device_choice": learner.get("device_choice"),
            "episodes": len(episodes), "return_mean_last_100": round(sum(last) / len(last), 3) if last else None,
            "windows": learning_curve(episodes, CURVE_WINDOW_STEPS),
            "curve": make_curve(running_means(episodes)),
            "update_time_s": median_range(list(seen.values()), 4),
            "updates": learner.get("updates"), "trained_steps": learner.get("trained_steps"),
            "daemon_env_steps": status.get("env_steps"), "protocol_errors": status.get("protocol_errors"),
            "learner_samples": samples}


def table(res: dict) -> str:
    """The BENCHMARKS.md table: each run's windows (mean return, wall time) side by side; the
    few episodes that end past the budget (the last status poll's overshoot) are left out."""
    runs = res["runs"]
    ends = sorted({p["env_steps"] // CURVE_WINDOW_STEPS for r in runs for p in r["windows"]
                   if p["env_steps"] // CURVE_WINDOW_STEPS * CURVE_WINDOW_STEPS < res["budget_steps"]})
    rows = []
    for k in ends:
        cells = []
        for r in runs:
            p = next((p for p in r["windows"] if p["env_steps"] // CURVE_WINDOW_STEPS == k), None)
            cells.append("–" if p is None else f"{p['return_mean']:.2f} ({fmt_num(p['wall_s'])} s)")
        rows.append((f"{fmt_num(k * CURVE_WINDOW_STEPS)} – {fmt_num((k + 1) * CURVE_WINDOW_STEPS)}", *cells))
    return print_table(f"MinAtar {res['game']}-v1, {res['clients']} {res['transport']} clients: mean return "
                       f"of the episodes ending in each {CURVE_WINDOW_STEPS:,}-step window (wall time at the "
                       "window's last episode)", ("env steps", *(f"run {i + 1}" for i in range(len(runs)))), rows)


def summary(runs: list[dict]) -> dict:
    """Medians (min-max) over the runs of the throughput, learner and final-return figures."""
    keys = ("env_steps_per_s", "updates_per_s", "wall_s", "return_mean_last_100")
    return {k: median_range([r[k] for r in runs], 3) for k in keys} | {
        "update_time_s_median": median_range([r["update_time_s"]["median"] for r in runs], 4)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--game", default="Breakout", help="MinAtar game")
    ap.add_argument("--steps", type=int, default=500_000, help="pooled env steps per run")
    ap.add_argument("--runs", type=int, default=3, help="runs per learner device")
    ap.add_argument("--clients", type=int, default=2, help="client processes (all cores: nproc - 2)")
    ap.add_argument("--transport", choices=("shm", "tcp"), default="shm", help="clients' transport")
    ap.add_argument("--learner-device", nargs="+", default=["auto"], choices=("auto", "cpu", "cuda"),
                    help="learner.device of the runs; several: runs alternate between them")
    ap.add_argument("--timeout-s", type=float, default=900.0, help="per run")
    ap.add_argument("--quick", action="store_true", help="1 run of 20,000 steps (plumbing check)")
    ap.add_argument("--out", default=None, help="result file (default bench/results/minatar.json)")
    args = ap.parse_args()
    steps, n_runs = (20_000, 1) if args.quick else (args.steps, args.runs)
    by_device: dict[str, list[dict]] = {d: [] for d in args.learner_device}
    for i in range(n_runs):
        for device, runs in by_device.items():
            runs.append(run(args.game, args.clients, args.transport, steps, args.timeout_s, i, device))
            print(f"run {i + 1}, learner.device={device}: {run_line(runs[-1])}", flush=True)
    first = by_device[args.learner_device[0]]
    res = {"game": args.game, "env_id": env_id(args.game), "ppo": PPO, "quick": args.quick,
           "clients": args.clients, "transport": args.transport, "budget_steps": steps,
           "learner_device": args.learner_device, "summary": summary(first), "runs": first}
    res["table_markdown"] = table(res)
    if len(by_device) > 1:
        res["by_device"] = {d: {"summary": summary(runs), "runs": runs} for d, runs in by_device.items()}
        res["comparison_markdown"] = comparison(res["by_device"], steps)
    write_result("minatar", res, args.out)
    return 0


def run_line(r: dict) -> str:
    """One run's figures in a line."""
    u = r["update_time_s"]
    return (f"trained on {r['learner_device']} ({r['learner_device_choice']}); env steps/s "
            f"{fmt_num(r['env_steps_per_s'])}; learner updates/s {r['updates_per_s']}; update_time_s median "
            f"{u['median']} (min {u['min']}, max {u['max']}, {u['n']} updates sampled); last-100 mean "
            f"return {r['return_mean_last_100']}")


def comparison(by_device: dict[str, dict], steps: int) -> str:
    """The devices side by side: medians (min – max) over each device's runs."""
    rows = [(d, fmt_mr(s["env_steps_per_s"]), fmt_mr(s["updates_per_s"], 2), fmt_mr(s["update_time_s_median"], 3),
             fmt_mr(s["return_mean_last_100"], 2), ", ".join(sorted({str(r["learner_device"]) for r in v["runs"]})))
            for d, v in by_device.items() for s in [v["summary"]]]
    return print_table(f"learner.device compared at {steps:,} env steps", ("learner.device", "env steps/s",
                       "learner updates/s", "update_time_s", "last-100 mean return", "trained on"), rows)


if __name__ == "__main__":
    sys.exit(main())
