"""``rlinkd demo`` as a measured subprocess: its command and its closing summary line.

Used by the scenarios that time the demo (``solve``, ``rlinkd_solve``'s own criterion,
``tune``, ``profile_demo``). The demo prints progress lines and ends with
``SOLVED {json}`` or ``NOT SOLVED {json}`` (``rlinkd.daemon.demo.run_demo``).
"""
from __future__ import annotations

import json
import tempfile

from rlinkd.daemon.launch import rlinkd_command, set_args


def demo_command(clients: int, transport: str = "tcp", seed: int = 0, overrides: list[str] = (),
                 timeout_s: float = 900.0, state_dir: str | None = None) -> list[str]:
    """``rlinkd demo`` with these settings (a fresh temporary state dir unless given)."""
    state_dir = state_dir or tempfile.mkdtemp(prefix="rlinkd-bench-")
    return rlinkd_command("demo", "--clients", str(clients), "--transport", transport, "--seed", str(seed),
                          "--timeout-s", str(timeout_s), "--state-dir", state_dir, *set_args(overrides))


def demo_summary(output: str) -> dict:
    """The JSON of the demo's ``SOLVED``/``NOT SOLVED`` line ({} when there is none)."""
    for line in reversed(output.strip().splitlines()):
        for prefix in ("SOLVED ", "NOT SOLVED "):
            if line.startswith(prefix):
                return json.loads(line[len(prefix):])
    return {}
