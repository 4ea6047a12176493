"""``rlinkd export`` and ``rlinkd --version`` as a user runs them: exit codes, stdout, stderr."""
from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from rlinkd.daemon.errors import ExitCode
from rlinkd.daemon.launch import rlinkd_command
from rlinkd.daemon.version import package_version
from tests.unit.test_export import CARTPOLE, run_onnx, write_ckpt

pytestmark = pytest.mark.process


def rlinkd(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(rlinkd_command(*args), capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_export_writes_onnx_and_description(tmp_path):
    ckpt, spec, flat = write_ckpt(tmp_path / "state", *CARTPOLE, seq_no=11)
    out = tmp_path / "cartpole.onnx"
    done = rlinkd("export", "--state-dir", str(tmp_path / "state"), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"wrote {out} and {tmp_path / 'cartpole.json'} (weights_seq_no 11")
    assert json.loads((tmp_path / "cartpole.json").read_text())["checkpoint"]["path"] == str(ckpt.path)
    obs = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    np.testing.assert_allclose(run_onnx(out, obs), spec.actor_forward(flat, obs), atol=1e-5, rtol=0)


def test_export_without_a_checkpoint_fails_with_one_line(tmp_path):
    done = rlinkd("export", "--state-dir", str(tmp_path / "empty"), "--out", str(tmp_path / "p.onnx"))
    assert done.returncode == ExitCode.NO_INPUT == 66
    assert done.stderr == f"rlinkd: no valid checkpoint in {tmp_path / 'empty' / 'checkpoints'}\n"
    assert not (tmp_path / "p.onnx").exists()


def test_export_usage_and_output_errors(tmp_path):
    write_ckpt(tmp_path / "state", *CARTPOLE)
    state = ("--state-dir", str(tmp_path / "state"))
    done = rlinkd("export", *state, "--policy", "walker", "--out", str(tmp_path / "p.onnx"))
    assert done.returncode == ExitCode.USAGE and done.stderr.startswith("rlinkd: unknown policy 'walker'")
    done = rlinkd("export", *state, "--out", str(tmp_path / "no" / "p.onnx"))
    assert done.returncode == ExitCode.CANT_CREATE and len(done.stderr.splitlines()) == 1
    done = rlinkd("export", *state, "--checkpoint", str(tmp_path), "--out", str(tmp_path / "p.onnx"))
    assert done.returncode == ExitCode.USAGE and "not allowed with argument" in done.stderr


def test_version():
    done = rlinkd("--version")
    assert done.returncode == 0 and done.stdout == f"rlinkd {package_version()}\n"
