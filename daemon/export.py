"""``rlinkd export``: a checkpoint's policy as a standalone ONNX file plus its description.

Offline and pure apart from file I/O (no daemon, no shared memory): find the checkpoint,
read its weights and space description, build the ONNX actor, write both files atomically.
Called once per ``rlinkd export``; every failure is one of four errors, which the CLI
turns into one line and an exit code: ``CheckpointError`` (no checkpoint, or one that does
not verify or cannot be read), ``UnknownPolicyError`` (``--policy``), ``OpsetError``
(``--opset`` cannot carry the network's operators), ``ExportError`` (the output cannot be
written).

Files written, for ``--out DIR/NAME.onnx``:

    DIR/NAME.onnx    the actor: input ``onnx::Gemm_0`` [batch, *obs_shape] float32,
                     output ``action_dist_inputs`` [batch, dist_size] float32
    DIR/NAME.json    its description (``sidecar_path``: the ``.onnx`` suffix replaced, any
                     other name gets ``.json`` appended), keys:
        format_version     SIDECAR_FORMAT_VERSION
        policy             the policy's name ("default")
        observation_space  space JSON (``Space.from_json`` reads it back)
        action_space       space JSON
        policy_spec        PolicySpec JSON (``PolicySpec.from_json``)
        onnx               {file, sha256, input, output, output_layout, opset, ir_version}
        state              a recurrent policy only: ``recurrent.state_contract`` (the extra
                           input ``state_in`` / output ``state_out``, their shape, columns
                           and when to reset them)
        weights_seq_no     the weights version the checkpoint holds
        checkpoint         {path, index}
        rlinkd_version     the version that exported it

Where the description comes from: checkpoints carry ``policy.json`` (``POLICY_FILE``:
the spaces and policy spec the daemon trained with, written by the checkpointer).
Checkpoints written before that file existed are described from their ``config.toml``
the way the daemon itself derives them (``wiring.resolve_spaces``/``make_policy_spec``;
an ``env.id``-only config then needs gymnasium to build that environment).
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlinkd.client_lib.protocol import netops
from rlinkd.client_lib.protocol.onnx_opsets import IR_VERSION_OF_OPSET
from rlinkd.client_lib.protocol.recurrent import state_contract
from rlinkd.client_lib.protocol.policy_spec import (ONNX_OPSET, ONNX_OUTPUT_NAME,
                                                    OnnxWeightWriter, PolicySpec)
from rlinkd.client_lib.protocol.spaces import Box, Discrete, Space, space_from_json
from rlinkd.client_lib.protocol.agents import DEFAULT_POLICY
from rlinkd.daemon.checkpoint import store
from rlinkd.daemon.errors import CheckpointError, ConfigError, ExportError, UnknownPolicyError
from rlinkd.daemon.version import package_version

POLICY_FILE = "policy.json"
POLICY_FILE_FORMAT_VERSION = 1
SIDECAR_FORMAT_VERSION = 1


@dataclass(frozen=True)
class LoadedPolicy:
    """A checkpoint's policy, ready to export: spaces, network description and weights."""

    obs_space: Space
    act_space: Space
    spec: PolicySpec
    flat: np.ndarray  # float32 [spec.n_params()], spec.param_layout() order
    weights_seq_no: int
    checkpoint: store.Checkpoint


@dataclass(frozen=True)
class ExportResult:
    onnx_path: Path
    sidecar_path: Path
    weights_seq_no: int
    checkpoint: Path


# ---------------------------------------------------------------- the checkpoint's policy.json
def policy_description(obs: Space, act: Space, spec: PolicySpec) -> dict[str, Any]:
    """The spaces and network of a policy as JSON-safe data: ``policy.json`` in a checkpoint
    (built once by the checkpointer) and the core of the exported sidecar."""
    return {"format_version": POLICY_FILE_FORMAT_VERSION, "observation_space": obs.to_json(),
            "action_space": act.to_json(), "policy_spec": spec.to_json()}


def read_policy_description(d: object, where: str) -> tuple[Space, Space, PolicySpec]:
    """Inverse of ``policy_description``; CheckpointError naming ``where`` if malformed."""
    try:
        if not isinstance(d, dict) or d.get("format_version") != POLICY_FILE_FORMAT_VERSION:
            raise ValueError("unknown format")
        return (space_from_json(d["observation_space"]), space_from_json(d["action_space"]),
                PolicySpec.from_json(d["policy_spec"]))
    except (KeyError, TypeError, ValueError) as exc:  # SpaceError is a ValueError
        raise CheckpointError(f"{where}: malformed policy description ({exc})") from None


# ---------------------------------------------------------------- finding and reading
def checkpoint_policies(ckpt: store.Checkpoint) -> list[str]:
    """The trained policies a checkpoint holds (``default`` first)."""
    files = ckpt.manifest.get("files", {})
    others = sorted({n.split("/")[1] for n in files if n.startswith("policies/") and
                     n.endswith("/learner.pt")})
    return [DEFAULT_POLICY, *others] if "learner.pt" in files else others


def check_policy_name(name: str, ckpt: store.Checkpoint) -> None:
    """UnknownPolicyError unless ``ckpt`` holds the policy ``name``."""
    held = checkpoint_policies(ckpt)
    if name not in held:
        raise UnknownPolicyError(f"unknown policy {name!r} (checkpoint {ckpt.path.name} holds "
                                 f"{', '.join(repr(n) for n in held)})")


def find_checkpoint(state_dir: Path, checkpoint: str | os.PathLike | None = None,
                    warn: Callable[[str], None] | None = None) -> store.Checkpoint:
    """``checkpoint`` (a ``ckpt-NNNNNN`` directory or a file in one), verified; without it,
    the newest checkpoint under ``state_dir`` that verifies (``warn`` hears about each
    newer one skipped). CheckpointError if there is none or the named one does not verify."""
    if checkpoint is not None:
        path = Path(checkpoint).expanduser().absolute()
        if not path.exists():
            raise CheckpointError(f"no such checkpoint: {path}")
        return store.verify(path.parent if path.is_file() else path)
    root = store.checkpoints_dir(state_dir)
    found = store.latest_valid(root, warn)
    if found is None:
        raise CheckpointError(f"no valid checkpoint in {root}")
    return found


def load_policy(ckpt: store.Checkpoint, policy: str = DEFAULT_POLICY) -> LoadedPolicy:
    """Spaces, spec and weights of one policy of a verified checkpoint; CheckpointError if
    unreadable."""
    obs, act, spec = describe_checkpoint(ckpt, policy)
    flat, seq_no = _flat_weights(ckpt, spec, store.policy_file(policy, "learner.pt"))
    return LoadedPolicy(obs, act, spec, flat, seq_no, ckpt)


def describe_checkpoint(ckpt: store.Checkpoint,
                        policy: str = DEFAULT_POLICY) -> tuple[Space, Space, PolicySpec]:
    """The spaces and network a checkpoint's ``policy`` was trained for (its ``policy.json``;
    derived from its ``config.toml`` for checkpoints older than that file). CheckpointError
    if neither describes it."""
    name = store.policy_file(policy, POLICY_FILE)
    if name in ckpt.manifest.get("files", {}):
        raw = store.read_checkpoint_file(ckpt.path, name)
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise CheckpointError(f"{ckpt.path / name}: not JSON ({exc})") from None
        return read_policy_description(data, str(ckpt.path / name))
    if policy != DEFAULT_POLICY:
        raise CheckpointError(f"{ckpt.path}: holds no policy {policy!r}")
    return _description_from_config(ckpt)


def _description_from_config(ckpt: store.Checkpoint) -> tuple[Space, Space, PolicySpec]:
    """For checkpoints older than ``policy.json``: derive it as the daemon did at start."""
    from rlinkd.daemon.config import load_config
    from rlinkd.daemon.wiring import make_policy_spec, resolve_spaces
    store.read_checkpoint_file(ckpt.path, "config.toml")  # verified; CheckpointError if absent
    try:
        cfg = load_config(ckpt.path / "config.toml", resolve_dirs=False)
        obs, act = resolve_spaces(cfg)
    except ConfigError as exc:
        raise CheckpointError(f"{ckpt.path}: has no {POLICY_FILE} and its config.toml does not "
                              f"describe the policy ({exc})") from None
    return obs, act, make_policy_spec(cfg, obs, act)


def _flat_weights(ckpt: store.Checkpoint, spec: PolicySpec,
                  name: str = "learner.pt") -> tuple[np.ndarray, int]:
    """The learner's model tensors from ``name`` (a ``learner.pt``) as one layout-ordered
    float32 vector, and the weights_seq_no they were published as."""
    import torch
    payload = store.read_checkpoint_file(ckpt.path, name)
    try:
        state = torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")
        model, seq_no = state["learner"]["model"], int(state["weights_seq_no"])
    except Exception as exc:  # the checkpoint-file boundary (torch raises pickle's errors too)
        raise CheckpointError(f"{ckpt.path / name}: unreadable learner state "
                              f"({type(exc).__name__}: {exc})") from exc
    from rlinkd.daemon.learner.model import ActorCritic
    net = ActorCritic(spec)
    try:
        net.load_state_dict(model)
    except (RuntimeError, TypeError, AttributeError) as exc:
        raise CheckpointError(f"{ckpt.path / name}: the model does not match the policy "
                              f"spec ({str(exc)[:200]})") from None
    return net.flat_weights(), seq_no


# ---------------------------------------------------------------- writing
def sidecar_path(onnx_path: Path) -> Path:
    """``NAME.onnx`` -> ``NAME.json``; any other name gets ``.json`` appended."""
    if onnx_path.suffix == ".onnx":
        return onnx_path.with_suffix(".json")
    return onnx_path.with_name(onnx_path.name + ".json")


def output_layout(spec: PolicySpec) -> str | list[dict[str, Any]]:
    """How ``action_dist_inputs`` is laid out: "logits" / "mean_then_log_std" for a single
    Discrete / Box action space (as before composite spaces), else — and for SAC's squashed
    Gaussian — one entry per distribution component (its kind, columns of the dist inputs
    and of the action vector)."""
    if isinstance(spec.act_space, (Discrete, Box)) and spec.box_dist == "gaussian":
        return "logits" if isinstance(spec.act_space, Discrete) else "mean_then_log_std"
    return [{"kind": c.kind,
             "dist_columns": [c.dist, c.dist + c.width * (2 if c.kind.endswith("gaussian") else 1)],
             "action_columns": [c.action, c.action + (1 if c.kind == "categorical" else c.width)]}
            for c in spec.action_components]


def sidecar(policy: LoadedPolicy, name: str, onnx_name: str, onnx_bytes: bytes,
            opset: int = ONNX_OPSET) -> dict[str, Any]:
    """The JSON written beside the ONNX file (layout in the module docstring)."""
    inputs = {netops.input_name(leaf.key, leaf.space.record_dtype): leaf.key
              for leaf in policy.obs_space.leaves()}
    onnx = {"file": onnx_name, "sha256": hashlib.sha256(onnx_bytes).hexdigest(),
            "inputs": inputs, "output": ONNX_OUTPUT_NAME, "output_layout": output_layout(policy.spec),
            "opset": opset, "ir_version": IR_VERSION_OF_OPSET[opset]}
    if len(inputs) == 1:
        onnx["input"] = next(iter(inputs))  # the one-input (RLlink-compatible) spelling
    description = policy_description(policy.obs_space, policy.act_space, policy.spec)
    if policy.spec.recurrent != "none":  # (additive: feed-forward sidecars are unchanged)
        description["state"] = state_contract(policy.spec.recurrent, policy.spec.recurrent_size,
                                              policy.spec.max_seq_len)
    return dict(description, format_version=SIDECAR_FORMAT_VERSION, policy=name, onnx=onnx,
                weights_seq_no=policy.weights_seq_no,
                checkpoint={"path": str(policy.checkpoint.path), "index": policy.checkpoint.index},
                rlinkd_version=package_version())


def write_files(files: dict[Path, bytes]) -> None:
    """Write every file atomically: all go to temporary names in their directories (fsynced)
    first, then each is renamed into place, in order. ExportError naming the path on any
    OSError; the temporary files are removed then (files already renamed stay)."""
    staged: list[tuple[Path, Path]] = []
    target = Path()
    try:
        for target, data in files.items():
            staged.append((target.with_name(f".{target.name}.tmp-{secrets.token_hex(4)}"), target))
            store.write_durably(staged[-1][0], data, mode=0o666, exclusive=True)
        for tmp, target in staged:
            os.replace(tmp, target)
            store.fsync_path(target.parent)
    except OSError as exc:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise ExportError(f"cannot write {target}: {exc.strerror or exc}") from None


def export_policy(out: str | os.PathLike, state_dir: Path, checkpoint: str | os.PathLike | None = None,
                  policy: str = DEFAULT_POLICY,
                  warn: Callable[[str], None] | None = None,
                  opset: int = ONNX_OPSET) -> ExportResult:
    """``rlinkd export``: the policy of ``checkpoint`` (default: the newest valid one under
    ``state_dir``) to ``out`` and its sidecar, stamped ONNX ``opset``. Raises the errors
    listed in the module doc."""
    ckpt = find_checkpoint(state_dir, checkpoint, warn)
    check_policy_name(policy, ckpt)
    loaded = load_policy(ckpt, policy)
    onnx_path = Path(out).expanduser()
    onnx_bytes = OnnxWeightWriter(loaded.spec, opset=opset).encode(loaded.flat)
    meta = sidecar(loaded, policy, onnx_path.name, onnx_bytes, opset)
    json_path = sidecar_path(onnx_path)
    write_files({onnx_path: onnx_bytes,
                 json_path: (json.dumps(meta, indent=1) + "\n").encode()})  # Dict key order is meaningful
    return ExportResult(onnx_path, json_path, loaded.weights_seq_no, loaded.checkpoint.path)
