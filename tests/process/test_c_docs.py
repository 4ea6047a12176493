"""docs/c-client.md's loops, as written: its two C programs (one agent; a batch of agents
with episode ends, resets and going on after a failed call) are extracted from the page,
built out of tree with the flags the page documents (the include path, the static library,
-lm -pthread) and run against a real daemon over TCP and over shared memory (``shm:STATE_DIR``,
the state-dir form), a few hundred steps each."""
from __future__ import annotations

import re
import subprocess

import pytest

from tests.helpers import REPO

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

C_DIR = REPO / "client_lib" / "c"
PAGE = REPO / "docs" / "c-client.md"


def programs() -> dict[str, str]:
    """The page's C programs by file name (each block's first line names it)."""
    blocks = re.findall(r"```c\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)
    named = {m.group(1): b for b in blocks if (m := re.match(r"/\* (\w+\.c) ", b))}
    assert set(named) == {"one_agent.c", "agents.c"}, sorted(named)
    return named


@pytest.fixture(scope="module")
def built(c_build, tmp_path_factory):
    """The library (the session's C build) and the page's programs built against it."""
    lib, out = c_build("librlinkd.a") / "librlinkd.a", tmp_path_factory.mktemp("c-docs")
    for name, source in programs().items():
        (out / name).write_text(source)
        subprocess.run(["cc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", f"-I{C_DIR / 'include'}",
                        str(out / name), str(lib), "-lm", "-pthread", "-o",
                        str(out / name.removesuffix(".c"))], check=True, capture_output=True, timeout=120)
    return out


@pytest.mark.parametrize("transport", ["tcp", "shm"])
def test_the_documented_loops_run_against_a_daemon(built, shared_daemon, transport):
    address = f"tcp://127.0.0.1:{shared_daemon.port}" if transport == "tcp" else f"shm:{shared_daemon.state_dir}"
    for command in ([built / "one_agent", address, "300"], [built / "agents", address, "400", "8"]):
        proc = subprocess.run([str(a) for a in command], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        steps, episodes, _, status = re.fullmatch(
            r"steps (\d+) episodes (\d+) weights (-?\d+) status (\S+)\n", proc.stdout).groups()
        assert status == "RLK_OK" and int(steps) >= 300 and int(episodes) >= 6, proc.stdout
