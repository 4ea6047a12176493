"""collector.pacing: a paced policy's sampling client is held while its learner lags more
than the limit, released by the first report within it or after max_wait_s; unpaced
policies never wait."""
from __future__ import annotations

import asyncio
import time

from rlinkd.daemon.collector.pacing import Pacer


def test_held_until_the_learner_catches_up_or_the_wait_runs_out():
    async def main() -> None:
        pacer = Pacer({"default": 100, "red": 0}, max_wait_s=5.0)
        pacer.on_report("default", 500)
        pacer.on_report("red", 10_000)  # red is not paced (limit 0)
        task = asyncio.create_task(pacer.wait(["default", "red"]))
        await asyncio.sleep(0.05)
        assert not task.done()
        pacer.on_report("default", 200)  # still beyond the limit
        await asyncio.sleep(0.05)
        assert not task.done()
        pacer.on_report("default", 50)
        await asyncio.wait_for(task, 1.0)
        assert pacer.held == 1
        await asyncio.wait_for(pacer.wait(["default", "red"]), 0.1)  # within: at once
        slow = Pacer({"default": 1}, max_wait_s=0.1)
        slow.on_report("default", 10)
        started = time.monotonic()
        await slow.wait(["default"])
        assert 0.08 <= time.monotonic() - started < 1.0
    asyncio.run(main())


def test_steps_ingested_since_the_last_report_count_on_top():
    ingested = {"default": 1000}
    pacer = Pacer({"default": 100}, max_wait_s=5.0, steps_of=lambda p: ingested[p])
    pacer.on_report("default", 60)
    assert pacer.behind("default") == 60
    ingested["default"] += 50           # a sample arrived after the report
    assert pacer.behind("default") == 110

    async def main() -> None:
        task = asyncio.create_task(pacer.wait(["default"]))
        await asyncio.sleep(0.05)
        assert not task.done()          # 110 > 100 although the report said 60
        pacer.on_report("default", 0)   # the learner caught up on it
        await asyncio.wait_for(task, 1.0)
    asyncio.run(main())
