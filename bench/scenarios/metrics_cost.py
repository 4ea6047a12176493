"""What a Prometheus scrape of ``/metrics`` costs: wall time per scrape and CPU per scrape.

    python -m bench.scenarios.metrics_cost [--scrapes 200] [--clients 2] [--window-s 10]
        [--windows 4] [--out FILE]

One daemon with ``metrics.listen = 127.0.0.1:0``. Idle (no client): ``--scrapes`` scrapes one
after another, timed from the request to the parsed answer; the CPU time the supervisor (it
serves the endpoint) and the collector (it answers the scrape's STATUS) spent during them,
minus what they spend in an equally long window without scrapes, per scrape. Under load
(``--clients`` CartPole clients training): ``--windows`` pairs of ``--window-s`` windows,
alternately without scrapes and with one scrape a second: the scrapes' wall times and the
daemon's env steps/s (median per kind of window). Writes bench/results/metrics.json.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
import urllib.request

import psutil
from prometheus_client.parser import text_string_to_metric_families

from bench.harness.common import LOOPBACK, median_range, percentiles, write_result
from bench.harness.daemon import Daemon
from rlinkd.daemon.launch import rlinkd_command, stop_processes

SERVING_ROLES = ("supervisor", "collector")


def scrape(url: str) -> tuple[float, int]:
    """One scrape, parsed: (seconds, bytes)."""
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    families = list(text_string_to_metric_families(text))
    assert families, "an empty scrape"
    return time.perf_counter() - t0, len(text)


def cpu_s(pids: dict[str, int]) -> dict[str, float]:
    out = {}
    for role, pid in pids.items():
        times = psutil.Process(pid).cpu_times()
        out[role] = times.user + times.system
    return out


def timed_window(pids: dict[str, int], action) -> tuple[dict[str, float], float]:
    """CPU seconds per role spent while ``action()`` ran, and its wall time."""
    before, t0 = cpu_s(pids), time.perf_counter()
    action()
    after, wall = cpu_s(pids), time.perf_counter() - t0
    return {role: after[role] - before[role] for role in pids}, wall


def idle_phase(d: Daemon, url: str, n: int) -> dict:
    pids = {role: pid for role, pid in d.role_pids().items() if role in SERVING_ROLES}
    scrape(url)  # warm-up: first connection, imports
    times: list[float] = []
    sizes: list[int] = []

    def scrapes() -> None:
        for _ in range(n):
            seconds, size = scrape(url)
            times.append(seconds)
            sizes.append(size)
    busy, wall = timed_window(pids, scrapes)
    quiet, _ = timed_window(pids, lambda: time.sleep(wall))
    per_scrape_ms = {role: round(1000 * (busy[role] - quiet[role]) / n, 3) for role in pids}
    return {"scrapes": n, "scrape_ms": percentiles([1000 * t for t in times], ndigits=2),
            "cpu_ms_per_scrape": per_scrape_ms | {"total": round(sum(per_scrape_ms.values()), 3)},
            "bytes": max(sizes)}


def steps_per_s(d: Daemon, seconds: float, url: str | None, times: list[float]) -> float:
    """Env steps/s over ``seconds``; scraping ``url`` once a second meanwhile when given."""
    start, t0 = d.status()["env_steps"], time.monotonic()
    while (left := t0 + seconds - time.monotonic()) > 0:
        if url is not None:
            times.append(scrape(url)[0])
        time.sleep(min(1.0, max(0.0, left)))
    return (d.status()["env_steps"] - start) / (time.monotonic() - t0)


def load_phase(d: Daemon, url: str, clients: int, seconds: float, windows: int) -> dict:
    procs = [subprocess.Popen(rlinkd_command("client", "--connect", f"tcp://{LOOPBACK}:{d.port}",
                                             "--steps", "100000000"),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for _ in range(clients)]
    try:
        deadline = time.monotonic() + 120
        while d.status()["env_steps_per_s"] <= 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        time.sleep(5)  # past the first updates
        times: list[float] = []
        without, scraped = [], []
        for _ in range(windows):  # alternating windows: slow drifts hit both sides alike
            without.append(steps_per_s(d, seconds, None, times))
            scraped.append(steps_per_s(d, seconds, url, times))
    finally:
        stop_processes(procs)
    return {"clients": clients, "window_s": seconds, "windows_each": windows,
            "scrape_ms": percentiles([1000 * t for t in times], ndigits=2),
            "env_steps_per_s": {"without_scrapes": median_range(without, 0),
                                "scraped_1hz": median_range(scraped, 0)}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--window-s", type=float, default=10.0)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--out", help="result file (default: bench/results/metrics.json)")
    args = ap.parse_args()
    with Daemon(["metrics.listen=127.0.0.1:0"]) as d:
        url = d.info["metrics_url"]
        idle = idle_phase(d, url, args.scrapes)
        print({"idle": idle}, flush=True)
        load = load_phase(d, url, args.clients, args.window_s, args.windows)
        print({"load": load}, flush=True)
    write_result("metrics", {"idle": idle, "load": load}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
