"""The systemd unit verifies and its offline security exposure is 3.0 or less."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

UNIT = REPO / "systemd" / "rlinkd.service"
INSTALLED_BIN = "/opt/rlinkd/bin/rlinkd"


def rendered_unit(tmp_path: Path) -> Path:
    """The unit with its ExecStart binary pointed at this checkout's rlinkd (verify checks it exists)."""
    rlinkd = Path(sys.executable).with_name("rlinkd")
    assert rlinkd.exists(), f"{rlinkd} missing: install the package first"
    path = tmp_path / "rlinkd.service"
    path.write_text(UNIT.read_text().replace(INSTALLED_BIN, str(rlinkd)))
    return path


def analyze(*args: str) -> subprocess.CompletedProcess:
    assert shutil.which("systemd-analyze"), "systemd-analyze is required (install systemd)"
    return subprocess.run(["systemd-analyze", *args], capture_output=True, text=True, timeout=120)


def test_unit_verifies(tmp_path):
    result = analyze("verify", str(rendered_unit(tmp_path)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rlinkd.service" not in result.stderr, result.stderr  # no warnings about our unit


def test_unit_security_exposure_at_most_3(tmp_path):
    result = analyze("security", "--offline=true", str(rendered_unit(tmp_path)))
    match = re.search(r"Overall exposure level for rlinkd\.service:\s*([\d.]+)", result.stdout)
    assert match, result.stdout[-2000:] + result.stderr
    assert float(match.group(1)) <= 3.0, result.stdout[-3000:]


def test_unit_has_the_promised_settings():
    text = UNIT.read_text()
    for line in ("Type=notify", "KillMode=mixed", "StateDirectory=rlinkd", "RuntimeDirectory=rlinkd",
                 "ConfigurationDirectory=rlinkd", "DynamicUser=yes", "NoNewPrivileges=yes",
                 "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
                 "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6", "WatchdogSec=",
                 "DeviceAllow=char-nvidia-frontend rw", "ExecReload="):
        assert line in text, line


def test_an_incomplete_drain_fails_the_unit_and_is_not_restarted():
    """A stop whose final checkpoint was not written (or whose roles were killed) must show
    as failed: neither code is a success, and a daemon told to stop is not restarted."""
    from rlinkd.daemon.errors import ExitCode
    lines = UNIT.read_text().splitlines()
    assert not [line for line in lines if line.startswith("SuccessExitStatus")]
    [prevent] = [line for line in lines if line.startswith("RestartPreventExitStatus=")]
    codes = {int(c) for c in prevent.split("=", 1)[1].split()}
    assert {ExitCode.DRAIN_NO_CHECKPOINT, ExitCode.DRAIN_KILLED, ExitCode.CONFIG, ExitCode.BOOT_ERROR} == codes
