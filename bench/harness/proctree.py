"""Sample process trees (RSS, CPU time) from outside while commands run."""
from __future__ import annotations

import threading
import time

import psutil


class TreeSampler:
    """Background sampler of one or more root pids and all their descendants.

    ``peak_rss_bytes`` is the largest *summed* RSS (every process of every tree) seen in one
    sample; ``cpu_s`` sums user+system CPU of every process seen (last reading per pid, so a
    process that exits loses at most one interval of CPU). ``peak_rss_by_pid`` keeps each
    process's own peak and ``names`` its command line, for per-process tables.
    """

    def __init__(self, pid: int, *more_pids: int, interval_s: float = 0.2) -> None:
        self.pid, self.roots, self.interval_s = pid, [pid, *more_pids], interval_s
        self.peak_rss_bytes = 0
        self.cpu_by_pid: dict[int, float] = {}
        self.peak_rss_by_pid: dict[int, int] = {}
        self.names: dict[int, str] = {}
        self.samples: list[tuple[float, int]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> TreeSampler:
        self._thread.start()
        return self

    def add_root(self, pid: int) -> None:
        """Also sample ``pid``'s tree from now on (e.g. a client started later)."""
        with self._lock:
            self.roots.append(pid)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def cpu_s(self) -> float:
        return sum(self.cpu_by_pid.values())

    def _procs(self) -> list[psutil.Process]:
        with self._lock:
            roots = list(self.roots)
        procs: dict[int, psutil.Process] = {}
        for pid in roots:
            try:
                root = psutil.Process(pid)
                for p in (root, *root.children(recursive=True)):
                    procs[p.pid] = p
            except psutil.NoSuchProcess:
                continue
        return list(procs.values())

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set():
            self._sample(time.monotonic() - t0)
            self._stop.wait(self.interval_s)
        self._sample(time.monotonic() - t0)

    def _sample(self, t: float) -> None:
        total = 0
        for p in self._procs():
            try:
                with p.oneshot():
                    rss = p.memory_info().rss
                    cpu = p.cpu_times()
                    if p.pid not in self.names:
                        self.names[p.pid] = " ".join(p.cmdline())[:200]
            except psutil.Error:
                continue
            total += rss
            self.cpu_by_pid[p.pid] = cpu.user + cpu.system
            self.peak_rss_by_pid[p.pid] = max(self.peak_rss_by_pid.get(p.pid, 0), rss)
        self.samples.append((t, total))
        self.peak_rss_bytes = max(self.peak_rss_bytes, total)


def tree_cpu_s(pid: int) -> dict[int, float]:
    """user+system CPU seconds of ``pid`` and each of its descendants right now."""
    root = psutil.Process(pid)
    out = {}
    for p in (root, *root.children(recursive=True)):
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        out[p.pid] = t.user + t.system
    return out
