"""Sample a process tree (RSS, CPU time) from outside while a command runs."""
from __future__ import annotations

import threading
import time

import psutil


class TreeSampler:
    """Background sampler of a root pid and all its descendants.

    ``peak_rss_bytes`` is the largest *summed* RSS seen in one sample; ``cpu_s`` sums
    user+system CPU of every process seen (last reading per pid).
    """

    def __init__(self, pid: int, interval_s: float = 0.2) -> None:
        self.pid, self.interval_s = pid, interval_s
        self.peak_rss_bytes = 0
        self.cpu_by_pid: dict[int, float] = {}
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "TreeSampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def cpu_s(self) -> float:
        return sum(self.cpu_by_pid.values())

    def _procs(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def _run(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set():
            total = 0
            for p in self._procs():
                try:
                    with p.oneshot():
                        total += p.memory_info().rss
                        t = p.cpu_times()
                        self.cpu_by_pid[p.pid] = t.user + t.system
                except psutil.Error:
                    continue
            self.samples.append((time.monotonic() - t0, total))
            self.peak_rss_bytes = max(self.peak_rss_bytes, total)
            self._stop.wait(self.interval_s)
