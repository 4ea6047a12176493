"""Memory-ordering and waiting helpers shared by the shm data structures.

Memory model (x86-64 TSO, the only target): stores become visible in program
order and loads are not reordered with other loads or with later stores, so
"write the data, then store the counter" on one side and "load the counter,
then read the data" on the other side is safe without fences.  Counters are
aligned 8-byte cells stored/loaded through ``memoryview.cast("Q")``, which
CPython compiles to single aligned 8-byte moves (atomic on x86-64).  Between
two bytecodes CPython runs opaque C calls, so the C compiler cannot move
shared-memory accesses across them either.

The one reordering TSO allows is a later load passing an earlier store
(store buffer).  The sleep/wake handshake is the classic Dekker pattern that
this breaks: the consumer stores ``reader_sleeping=1`` then loads ``tail``,
the producer stores ``tail`` then loads ``reader_sleeping``; without a full
barrier on BOTH sides each may read the other's old value and the wake-up
is lost.  Python has no fence primitive, so ``store_load_fence`` takes and
releases an uncontended ``threading.Lock``: CPython implements that with
``sem_trywait``/``sem_post`` (3.10-3.12) or an atomic compare-exchange
(3.13+), i.e. a ``lock``-prefixed instruction, which is a full barrier on
x86.  This relies on a CPython implementation detail; the consumer's bounded
sleep slices (see ``StepRing.wait_readable``) cap the damage if it ever stops
holding.
"""

from __future__ import annotations

import threading
import time

_FENCE_LOCK = threading.Lock()
fence_acquire = _FENCE_LOCK.acquire
fence_release = _FENCE_LOCK.release

BACKOFF_FIRST_SLEEP_S = 10e-6
BACKOFF_MAX_SLEEP_S = 1e-3


def store_load_fence() -> None:
    """Full memory barrier (~90 ns): a locked RMW via an uncontended lock."""
    fence_acquire()
    fence_release()


def spin_until(condition, spin_s: float) -> bool:
    """Busy-poll ``condition()`` for up to ``spin_s`` seconds; True once it holds."""
    if spin_s <= 0:
        return False
    deadline = time.perf_counter() + spin_s
    while time.perf_counter() < deadline:
        if condition():
            return True
    return False


def backoff_until(condition, timeout_s: float | None, spin_s: float = 20e-6) -> bool:
    """Poll ``condition()`` with a short spin, then sleeps doubling up to 1 ms.

    Returns True as soon as the condition holds, False at the deadline
    (``timeout_s`` None: wait forever).  Used where no doorbell exists, e.g.
    a producer waiting for ring space.
    """
    if condition() or spin_until(condition, spin_s if timeout_s is None else min(spin_s, timeout_s)):
        return True
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    sleep_s = BACKOFF_FIRST_SLEEP_S
    while True:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return condition()
        time.sleep(sleep_s if remaining is None else min(sleep_s, remaining))
        if condition():
            return True
        sleep_s = min(sleep_s * 2, BACKOFF_MAX_SLEEP_S)
