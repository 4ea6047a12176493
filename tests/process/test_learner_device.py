"""A learner.device the host does not have: a boot error (one line naming learner.device,
exit 3, no restart), or a config error (exit 78) when the name itself is not a device."""
from __future__ import annotations

import json
import subprocess

import pytest

from rlinkd.daemon.launch import ServeProcess, stop_processes

pytestmark = pytest.mark.process
torch = pytest.importorskip("torch")


def _exit_code(tmp_path, device: str) -> tuple[int, str]:
    daemon = ServeProcess(tmp_path / "state", ["--set", f"learner.device={device}"]).launch()
    try:
        code = daemon.proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        stop_processes([daemon.proc])
        raise
    return code, daemon.log_path.read_text()


@pytest.mark.skipif(torch.cuda.device_count() > 7, reason="this host has a cuda:7")
def test_a_missing_cuda_device_stops_the_daemon_at_once_with_exit_3(tmp_path):
    code, log = _exit_code(tmp_path, "cuda:7")
    assert code == 3, log[-2000:]
    events = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    boot = [e for e in events if e["event"] == "boot_error"]
    assert len(boot) == 1 and boot[0]["role"] == "learner"
    assert boot[0]["error"].startswith("learner.device = 'cuda:7': this host has")
    assert "\n" not in boot[0]["error"] and "Traceback" not in log
    assert not [e for e in events if e["event"] == "restart_scheduled"]


def test_a_device_name_that_is_no_device_is_a_config_error(tmp_path):
    code, log = _exit_code(tmp_path, "gpu")
    assert code == 78 and "learner.device = 'gpu'" in log
