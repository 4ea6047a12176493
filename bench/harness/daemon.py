"""``rlinkd serve`` for a benchmark: a fresh state directory, ready once weights exist.

``Daemon`` is ``rlinkd.daemon.launch.ServeProcess`` (the one launcher) with what the
scenarios add: ``--fresh`` and ``--set`` overrides, an optional fixed port (to launch
clients before the daemon is ready), a temporary state directory removed at ``stop``,
readiness meaning "the first weights are published", and the role -> pid map.
"""
from __future__ import annotations

import shutil
import signal
import tempfile
from pathlib import Path

from rlinkd.daemon.launch import ServeProcess, set_args, weights_published


class Daemon(ServeProcess):
    """``with Daemon(["sampling.force_on_policy=false"]) as d: ... d.port, d.status()``."""

    def __init__(self, overrides: list[str] | None = None, port: int = 0, env: dict | None = None,
                 state_dir: Path | None = None) -> None:
        self._own_state_dir = state_dir is None
        state = state_dir or Path(tempfile.mkdtemp(prefix="rlinkd-bench-"))
        super().__init__(state, ["--port", str(port), "--fresh", *set_args(overrides or [])], env)

    def wait_ready(self, timeout_s: float = 120.0, until=weights_published) -> dict:
        """Until daemon.json names our pid and the first weights are published."""
        return super().wait_ready(timeout_s, until)

    def role_pids(self) -> dict[str, int]:
        """{"supervisor": pid, "collector": pid, ...} from the status ``children``."""
        children = self.status().get("children") or {}
        return {"supervisor": self.pid} | {role: int(c["pid"]) for role, c in children.items()
                                           if c.get("pid")}

    def stop(self, timeout_s: float = 60.0, sig: int = signal.SIGTERM) -> int | None:
        """Stop the daemon (see ServeProcess.stop); remove the state directory we made."""
        code = super().stop(timeout_s, sig)
        if self._own_state_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        return code
