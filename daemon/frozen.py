"""Frozen policies: weights loaded once from a checkpoint or an ONNX file, never trained.

``[policies.NAME] trainable = false, load_from = ...`` names either an rlinkd checkpoint
directory (its policy NAME, else its ``default``) or an ``.onnx`` file. An ONNX file made
by rlinkd (``rlinkd export``, a checkpoint's ``policy.onnx``) for the same network carries
every actor parameter as a named initializer: its weights go onto the policy's weights
board like any trained version, so TCP and shared-memory clients both act with it. A
model trained elsewhere is accepted when its inputs and output fit the policy's spaces
(one input per observation leaf, named as rlinkd names them or a single input for a
single-leaf space; an output of ``dist_size`` numbers per row): it is served as is to TCP
clients (SET_STATE), and the board stays empty.

``check_frozen`` (supervisor, at start, no torch) refuses what cannot work with a
ConfigError naming the key; ``load_frozen`` (learner, at boot) reads the weights.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlinkd.client_lib.policy import onnx_input_key
from rlinkd.client_lib.protocol.agents import DEFAULT_POLICY
from rlinkd.client_lib.protocol.netonnx import _outputs
from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.daemon.checkpoint import store
from rlinkd.daemon.errors import CheckpointError, ConfigError
from rlinkd.daemon.export import checkpoint_policies, describe_checkpoint
from rlinkd.daemon.policies import PolicyDef

MAX_ONNX_BYTES = 512 << 20


@dataclass(frozen=True)
class FrozenWeights:
    """What a frozen policy acts with: board weights (``flat``) or a foreign model (``onnx``)."""

    flat: np.ndarray | None
    onnx: bytes | None


def check_frozen(d: PolicyDef) -> None:
    """ConfigError unless ``d.load_from`` can give this policy's weights (called once by the
    supervisor before any child starts; reads manifests and ONNX graphs, not weights)."""
    where = f"policies.{d.name}.load_from = {d.load_from!r}"
    path = Path(d.load_from).expanduser()
    if path.is_dir():
        _checkpoint_policy(d, path, where)
    elif path.is_file():
        if onnx_flat_weights(d.spec, _read_onnx(path, where)) is None:
            check_foreign_onnx(d.spec, _read_onnx(path, where), where)
    else:
        raise ConfigError(f"{where}: no such checkpoint directory or ONNX file")


def load_frozen(d: PolicyDef) -> FrozenWeights:
    """The weights of a frozen policy (learner boot). ConfigError as ``check_frozen``."""
    where = f"policies.{d.name}.load_from = {d.load_from!r}"
    path = Path(d.load_from).expanduser()
    if path.is_dir():
        from rlinkd.daemon.export import load_policy
        ckpt, name = _checkpoint_policy(d, path, where)
        return FrozenWeights(load_policy(ckpt, name).flat, None)
    data = _read_onnx(path, where)
    flat = onnx_flat_weights(d.spec, data)
    return FrozenWeights(flat, None if flat is not None else data)


def foreign_onnx(d: PolicyDef) -> bytes | None:
    """The model file of a frozen policy trained elsewhere (served as is), else None (its
    weights are on the board). For the collector: reads no checkpoint, imports no torch."""
    path = Path(d.load_from).expanduser()
    if d.trainable or not path.is_file():
        return None
    data = _read_onnx(path, f"policies.{d.name}.load_from = {d.load_from!r}")
    return data if onnx_flat_weights(d.spec, data) is None else None


def _checkpoint_policy(d: PolicyDef, path: Path, where: str) -> tuple[store.Checkpoint, str]:
    """The verified checkpoint and which of its policies to load (same name, else default);
    ConfigError when it holds neither or was trained for another network."""
    try:
        ckpt = store.verify(path)
        held = checkpoint_policies(ckpt)
        name = d.name if d.name in held else DEFAULT_POLICY
        if name not in held:
            raise CheckpointError(f"holds no policy {d.name!r} or {DEFAULT_POLICY!r}")
        _, _, spec = describe_checkpoint(ckpt, name)
    except CheckpointError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if spec.to_json() != d.spec.to_json():
        raise ConfigError(f"{where}: its policy {name!r} was trained for other spaces or another "
                          "network than this policy declares")
    return ckpt, name


def _read_onnx(path: Path, where: str) -> bytes:
    try:
        if path.stat().st_size > MAX_ONNX_BYTES:
            raise ConfigError(f"{where}: larger than {MAX_ONNX_BYTES >> 20} MiB")
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read ({exc.strerror})") from None


def onnx_flat_weights(spec: PolicySpec, data: bytes) -> np.ndarray | None:
    """The layout-ordered weights of an rlinkd-built ONNX model of ``spec`` (critic params,
    absent from an actor-only model, are zeros: a frozen policy never computes values);
    None when the model lacks an actor parameter of the right name and shape."""
    import onnx
    from onnx import numpy_helper
    try:
        model = onnx.load_from_string(data)
    except Exception:  # noqa: BLE001 - the ONNX-file boundary: not ours, treated as foreign
        return None
    inits = {t.name: t for t in model.graph.initializer}
    actor = set(spec.net.param_names(_outputs(False)))
    parts = []
    for name, shape in spec.param_layout():
        tensor = inits.get(name)
        if tensor is None or tuple(tensor.dims) != tuple(shape):
            if name in actor:
                return None
            parts.append(np.zeros(int(np.prod(shape)), np.float32))
            continue
        parts.append(numpy_helper.to_array(tensor).astype(np.float32).ravel())
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def check_foreign_onnx(spec: PolicySpec, data: bytes, where: str) -> None:
    """ConfigError unless a model trained elsewhere fits the policy: it loads, each input
    feeds one observation leaf (a single input may feed a single-leaf space), and its first
    output has ``dist_size`` numbers per row."""
    import onnx
    try:
        model = onnx.load_from_string(data)
        onnx.checker.check_model(model)
    except Exception as exc:  # noqa: BLE001 - the ONNX-file boundary
        raise ConfigError(f"{where}: not a valid ONNX model ({type(exc).__name__})") from None
    init_names = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in init_names]
    leaves = [leaf.key for leaf in spec.obs_space.leaves()]
    fed = sorted(_leaf_of(i.name) for i in inputs)
    if not (len(inputs) == 1 == len(leaves) or fed == sorted(leaves)):
        raise ConfigError(f"{where}: inputs {[i.name for i in inputs]} do not match the "
                          f"observation leaves {leaves} of this policy")
    out = model.graph.output[0].type.tensor_type.shape.dim
    width = out[-1].dim_value if out else 0
    if width != spec.dist_size:
        raise ConfigError(f"{where}: output {model.graph.output[0].name!r} has {width or '?'} "
                          f"numbers per row, this policy's action space needs {spec.dist_size}")


def _leaf_of(name: str) -> str:
    """The leaf an input feeds; "\0" (no leaf key can hold it) when it names none."""
    try:
        return onnx_input_key(name)
    except ValueError:
        return "\0"
