"""The ONNX opset and IR version rlinkd stamps: the default engines load, ``--opset N``, and the
export run by the oldest onnxruntime supported (1.15, in build/ort-old: `make ort-old`)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from rlinkd.client_lib.protocol import netops
from rlinkd.client_lib.protocol.netnumpy import NumpyNet
from rlinkd.client_lib.protocol.netonnx import OnnxWeightWriter, build_onnx_model
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.onnx_opsets import (IR_VERSION_OF_OPSET, ONNX_OPSET, OPSET_SINCE,
                                                    OpsetError)
from rlinkd.daemon import cli, export
from rlinkd.daemon.errors import ExitCode
from tests.helpers import REPO
from tests.unit.test_export import CARTPOLE, IMAGE_BOX, write_ckpt
from tests.unit.test_networks import (ACT_FAMILIES, MASKED, OBS_FAMILIES, onnx_feed, random_flat,
                                      random_obs, spec_for)

ORT_OLD = REPO / "build" / "ort-old"  # onnxruntime 1.15.1 + numpy<2 (make ort-old)
SPECS = {"image_sac": PolicySpec(OBS_FAMILIES["dict_image_vector"], ACT_FAMILIES["box"],
                                 hidden_sizes=(16,), box_dist="squashed_gaussian"),
         "nested": spec_for("nested", "nested"), "masked": MASKED}


def lowest_opset(model: onnx.ModelProto) -> int:
    return max(OPSET_SINCE[n.op_type] for n in model.graph.node)


def test_default_opset_and_ir_version_are_pinned(tmp_path):
    write_ckpt(tmp_path / "state", *IMAGE_BOX)
    export.export_policy(tmp_path / "p.onnx", tmp_path / "state")
    model = onnx.load(tmp_path / "p.onnx")
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 11)]
    assert model.ir_version == 6  # the IR of ONNX 1.6, which brought opset 11
    assert export.json.loads((tmp_path / "p.json").read_text())["onnx"]["opset"] == 11
    served = onnx.load_from_string(OnnxWeightWriter(SPECS["masked"], with_value=True).template)
    assert (served.opset_import[0].version, served.ir_version) == (11, 6)


def test_the_default_is_the_lowest_opset_carrying_every_operator():
    recurrent = [PolicySpec(OBS_FAMILIES["flat_box"], ACT_FAMILIES["discrete"], recurrent=cell)
                 for cell in netops.CELLS]  # Add, Sigmoid: only the recurrent cell has them
    used = {n.op_type for spec in (*SPECS.values(), *recurrent)
            for n in build_onnx_model(spec).graph.node}
    assert used == set(OPSET_SINCE)  # the specs above exercise every operator
    assert ONNX_OPSET == max(OPSET_SINCE.values()) <= 15


@pytest.mark.parametrize("op_type", sorted(t for t, v in OPSET_SINCE.items() if v > 7))
def test_an_operator_below_its_opset_fails_the_checker(op_type):
    spec = next(s for s in SPECS.values()
                if op_type in {n.op_type for n in build_onnx_model(s).graph.node})
    model = build_onnx_model(spec, random_flat(spec))
    model.opset_import[0].version = OPSET_SINCE[op_type] - 1
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model, full_check=True)


@pytest.mark.parametrize("name", list(SPECS))
def test_every_accepted_opset_checks_and_runs_like_numpy(name):
    spec = SPECS[name]
    flat, obs = random_flat(spec, seed=3), random_obs(spec, 4, seed=4)
    expected = NumpyNet(spec, flat).run(obs)[netops.DIST]
    lowest = lowest_opset(build_onnx_model(spec))
    for opset in range(max(lowest, 7), max(IR_VERSION_OF_OPSET) + 1):
        model = build_onnx_model(spec, flat, opset=opset)
        onnx.checker.check_model(model, full_check=True)
        assert model.ir_version == IR_VERSION_OF_OPSET[opset]
        got = ort.InferenceSession(model.SerializeToString()).run([netops.DIST], onnx_feed(spec, obs))
        np.testing.assert_allclose(got[0], expected, atol=1e-5, rtol=0)


def test_an_opset_that_cannot_carry_the_network_names_the_operators():
    with pytest.raises(OpsetError, match=r"opset 9 cannot carry Clip \(from opset 11\), "
                                         r"Slice \(from opset 10\); this network needs opset 11"):
        build_onnx_model(SPECS["image_sac"], opset=9)
    for opset in (6, 22):
        with pytest.raises(OpsetError, match=f"opset {opset}: rlinkd writes opsets 7 to 21"):
            build_onnx_model(SPECS["nested"], opset=opset)


def test_cli_export_opset(tmp_path, capsys):
    write_ckpt(tmp_path / "state", *CARTPOLE)
    args = ["export", "--state-dir", str(tmp_path / "state"), "--out", str(tmp_path / "p.onnx")]
    assert cli.main([*args, "--opset", "9"]) == 0  # a Discrete MLP: Gemm, Tanh, Sub, Div
    model = onnx.load(tmp_path / "p.onnx")
    assert (model.opset_import[0].version, model.ir_version) == (9, 4)
    write_ckpt(tmp_path / "box", *IMAGE_BOX)
    box = ["export", "--state-dir", str(tmp_path / "box"), "--out", str(tmp_path / "b.onnx")]
    assert cli.main([*box, "--opset", "7"]) == ExitCode.USAGE  # a Gaussian's log-std: Expand
    assert "opset 7 cannot carry Expand (from opset 8)" in capsys.readouterr().err


def test_the_oldest_supported_onnxruntime_runs_the_export_like_numpy(tmp_path):
    if not (ORT_OLD / "onnxruntime").is_dir():
        assert not os.environ.get("CI"), "make test installs build/ort-old (make ort-old)"
        pytest.skip("onnxruntime 1.15 is not installed in build/ort-old: run `make ort-old`")
    spec = SPECS["image_sac"]
    flat, obs = random_flat(spec, seed=8), random_obs(spec, 6, seed=9)
    (tmp_path / "model.onnx").write_bytes(OnnxWeightWriter(spec).encode(flat))
    np.savez(tmp_path / "feed.npz", **onnx_feed(spec, obs))
    env = dict(os.environ, PYTHONPATH=str(ORT_OLD))
    run = subprocess.run([sys.executable, "-s", str(REPO / "tests" / "tools" / "ort_run.py"),
                          str(tmp_path / "model.onnx"), str(tmp_path / "feed.npz"),
                          str(tmp_path / "out.npy"), netops.DIST],
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "onnxruntime 1.15.1"
    expected = NumpyNet(spec, flat).run(obs)[netops.DIST]
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), expected, atol=1e-5, rtol=0)
