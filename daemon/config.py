"""Configuration: one declaration drives the TOML file, the CLI and the docs.

Every setting is a field of a frozen dataclass, declared with ``setting(default,
doc, ...)``: the doc string becomes docs/configuration.md's table (``rlinkd config
--docs``), ``reloadable=True`` marks what SIGHUP may change, and the TOML file
uses the same section and key names (``[ppo] lr = 3e-4``). ``load_config`` is
the only way a ``Config`` is built from outside; it validates everything once and
raises ``ConfigError`` naming the offending key.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlinkd.client_lib.protocol.agents import (DEFAULT_POLICY, MAX_POLICIES, POLICY_NAME,
                                               MappingError, PolicyMapping,
                                               check_policy_name)
from rlinkd.client_lib.protocol.discovery import default_state_dir
from rlinkd.client_lib.protocol.spaces import Space, SpaceError, space_from_json
from rlinkd.client_lib.transport import parse_address
from rlinkd.daemon.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

MiB = 1024 * 1024


def setting(default: Any, doc: str, *, reloadable: bool = False, minimum: float | None = None,
            maximum: float | None = None, choices: tuple[str, ...] | None = None) -> Any:
    """Declare one config field: its default, its documentation and its limits."""
    meta = {"doc": doc, "reloadable": reloadable, "min": minimum, "max": maximum,
            "choices": choices}
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ServerConfig:
    """[server]: the RLlink listeners (TCP and the Unix socket)."""

    host: str = setting("127.0.0.1", "Address the RLlink TCP listener binds. A non-loopback "
                        "address requires TLS or `insecure_remote = true`.")
    port: int = setting(5555, "TCP port of the RLlink listener (0 = pick a free port; the "
                        "chosen port is in `rlinkd status`).", minimum=0, maximum=65535)
    max_message_bytes: int = setting(64 * MiB, "Largest RLlink frame body accepted; a header "
                                     "announcing more is refused before the body is read.",
                                     minimum=1024)
    max_connections: int = setting(256, "Connections served at once (TCP and Unix socket). "
                                   "When all are full, a newcomer evicts the oldest connection "
                                   "still in its handshake; if there is none it gets ERROR and "
                                   "is closed.", minimum=1)
    max_pending_connections: int = setting(128, "Connections that have not completed their "
                                           "handshake (first message accepted: PING, with the "
                                           "token when one is set) held at once, at most "
                                           "`max_connections`; a newcomer beyond it evicts the "
                                           "oldest such connection.", minimum=1)
    handshake_timeout_s: float = setting(10.0, "A new connection's first complete message (and "
                                         "with TLS, the TLS handshake) must arrive within this "
                                         "time or the connection is closed.", minimum=0.1)
    read_timeout_s: float = setting(30.0, "Once a frame has started, its remaining bytes must "
                                    "arrive within this time or the connection is closed.",
                                    minimum=0.1)
    idle_timeout_s: float = setting(600.0, "A connection that sends nothing for this long is "
                                    "closed (0 = never).", minimum=0.0)
    max_episode_steps: int = setting(100_000, "Longest episode fragment accepted in one "
                                     "message, in env steps.", minimum=1)
    max_obs_floats: int = setting(1_000_000, "Largest flattened observation accepted, in "
                                  "numbers.", minimum=1)
    max_agents_per_connection: int = setting(1024, "Agents one connection may have with an "
                                             "episode in progress (multi-agent clients); an "
                                             "episode of one more is refused with ERROR.",
                                             minimum=1, maximum=1 << 20)
    token: str = setting("", "Shared secret; when set, a client must send it as `token` in "
                         "PING before anything else is accepted.")
    insecure_remote: bool = setting(False, "Allow a non-loopback bind without TLS.")
    tls_cert_file: str = setting("", "PEM server certificate; enables TLS on the TCP listener.")
    tls_key_file: str = setting("", "PEM private key for `tls_cert_file`.")
    tls_client_ca_file: str = setting("", "PEM CA bundle; when set, clients must present a "
                                      "certificate signed by it.")


@dataclass(frozen=True)
class EnvConfig:
    """[env]: where the observation and action spaces come from."""

    id: str = setting("CartPole-v1", "gymnasium id whose spaces the daemon trains for "
                      "(ignored when both spaces are given explicitly).")
    observation_space: Space | None = setting(None, "Explicit observation space, e.g. "
                                              "`{type = \"Box\", low = -1.0, high = 1.0, "
                                              "shape = [4]}` (any form of the space table in "
                                              "docs/spaces.md).")
    action_space: Space | None = setting(None, "Explicit action space, e.g. "
                                         "`{type = \"Discrete\", n = 2}`.")
    action_mask_key: str = setting("", "Key of a Dict observation holding the legal-action "
                                   "mask (MultiBinary, one entry per discrete choice); empty: "
                                   "no masking.")


@dataclass(frozen=True)
class SamplingConfig:
    """[sampling]: what clients are told and how episodes become train batches."""

    env_steps_per_sample: int = setting(256, "Env steps a client collects per "
                                        "EPISODES_AND_GET_STATE (sent in SET_CONFIG).",
                                        minimum=1)
    force_on_policy: bool = setting(True, "Reply to EPISODES_AND_GET_STATE only with weights "
                                    "trained on a batch containing that client's episodes.")
    train_batch_size: int = setting(512, "Env steps per train batch (fewer when every "
                                    "on-policy client is waiting).", minimum=1)
    max_policy_lag: int = setting(4, "Off-policy only: episodes collected with weights more "
                                  "than this many versions old are dropped and counted.", minimum=0)
    max_wait_for_batch_s: float = setting(5.0, "An on-policy client waiting longer than this "
                                          "forces a (smaller) batch.", minimum=0.01)
    episode_ring_records: int = setting(1 << 17, "Capacity (steps) of the collector→connector "
                                        "shared-memory ring; when full, clients are slowed "
                                        "down.", minimum=1024)
    batch_slots: int = setting(2, "Train-batch slots in shared memory between connector and "
                               "learner.", minimum=1, maximum=8)


def batch_slot_rows(sampling: SamplingConfig) -> int:
    """Rows of one train-batch slot between connector and learner: two full batches, a
    client's sample and some slack. The connector cuts open runs at half of it and batches at
    all of it, on a recurrent policy's state grid (so ``max_seq_len`` must fit in half)."""
    return 2 * sampling.train_batch_size + sampling.env_steps_per_sample + 1024


@dataclass(frozen=True)
class PPOConfig:
    """[ppo]: the learner's algorithm and network."""

    lr: float = setting(2e-3, "Adam learning rate.", reloadable=True, minimum=0.0)
    gamma: float = setting(0.99, "Discount factor.", minimum=0.0, maximum=1.0)
    gae_lambda: float = setting(0.95, "GAE λ.", minimum=0.0, maximum=1.0)
    clip_coef: float = setting(0.2, "PPO surrogate clip ε.", minimum=0.0)
    vf_coef: float = setting(0.5, "Value-loss coefficient.", minimum=0.0)
    ent_coef: float = setting(0.0, "Entropy-bonus coefficient.", reloadable=True,
                              minimum=0.0)
    num_epochs: int = setting(10, "SGD epochs per train batch.", minimum=1)
    minibatch_size: int = setting(128, "Rows per SGD minibatch.", minimum=1)
    max_grad_norm: float = setting(0.5, "Global gradient-norm clip.", minimum=0.0)
    clip_vloss: bool = setting(True, "Clip the value loss like the surrogate.")
    target_kl: float = setting(0.0, "Stop the epochs early when the approximate KL exceeds "
                               "this (0 = never).", minimum=0.0)
    normalize_advantages: bool = setting(True, "Normalise advantages per train batch.")
    normalize_observations: bool = setting(False, "Keep running observation statistics and "
                                           "normalise inputs (inside the ONNX model too).")
    hidden_sizes: tuple[int, ...] = setting((64, 64), "Hidden layer widths of the actor and "
                                            "the critic MLPs.")
    activation: str = setting("tanh", "Hidden activation.", choices=("tanh", "relu"))
    log_std_init: float = setting(0.0, "Initial log-std of Gaussian (Box) policies.")
    cnn_channels: tuple[int, ...] = setting((), "Output channels of each conv layer of image "
                                            "encoders; empty: a default chosen by image size.")
    cnn_kernels: tuple[int, ...] = setting((), "Kernel size of each conv layer (one per "
                                           "cnn_channels entry).")
    cnn_strides: tuple[int, ...] = setting((), "Stride of each conv layer (one per "
                                           "cnn_channels entry).")
    cnn_dense: int = setting(0, "Width of the dense layer after the convolutions; 0: the "
                             "default for the image size.", minimum=0)
    recurrent: str = setting("none", "A policy with memory: `lstm` or `gru` runs a recurrent "
                             "cell after the observation encoders, whose state the side that "
                             "acts keeps per agent (docs/recurrent.md); `none`: feed-forward. "
                             "PPO and APPO only.", choices=("none", "lstm", "gru"))
    recurrent_size: int = setting(64, "Hidden size H of the recurrent cell (state width: 2H "
                                  "for an LSTM, H for a GRU).", minimum=1, maximum=4096)
    max_seq_len: int = setting(20, "Steps per training sequence of a recurrent policy "
                               "(truncated back-propagation through time); a training fragment "
                               "carries the actor's state every this many steps. At most half a "
                               "train-batch slot (sampling.train_batch_size + "
                               "sampling.env_steps_per_sample / 2 + 512).", minimum=1,
                               maximum=1000)


@dataclass(frozen=True)
class DQNConfig:
    """[dqn]: deep Q-learning for Discrete actions (`learner.algorithm = "dqn"`): double Q,
    a target network, n-step returns from a shared-memory replay buffer, epsilon-greedy
    clients. The convolution settings of image encoders are [ppo]'s `cnn_*`."""

    lr: float = setting(1e-3, "Adam learning rate (at the start, with `lr_decay_steps`).",
                        reloadable=True, minimum=0.0)
    lr_end: float = setting(0.0, "Learning rate after the decay (with `lr_decay_steps` > 0).",
                            minimum=0.0)
    lr_decay_steps: int = setting(0, "Env steps over which the learning rate falls linearly from "
                                  "`lr` to `lr_end` (0: `lr` throughout): late updates small, "
                                  "so a policy that got good stays good.", minimum=0)
    gamma: float = setting(0.99, "Discount factor.", minimum=0.0, maximum=1.0)
    n_step: int = setting(1, "Steps of reward summed before bootstrapping (n-step returns).",
                          minimum=1, maximum=100)
    buffer_size_steps: int = setting(100_000, "Replay buffer capacity in transitions (the "
                                     "oldest are overwritten).", minimum=1)
    learning_starts_steps: int = setting(1000, "Transitions in the buffer before the first "
                                         "update.", minimum=1)
    batch_size: int = setting(64, "Transitions per gradient step.", minimum=1)
    updates_per_step: float = setting(0.5, "Gradient steps per env step received (the "
                                      "updates-to-data ratio); the learner trains while "
                                      "clients sample and never makes them wait.",
                                      minimum=0.001, maximum=64.0)
    target_update_interval_updates: int = setting(250, "Gradient steps between copies of the "
                                                  "online network into the target network.",
                                                  minimum=1)
    publish_interval_updates: int = setting(50, "Gradient steps between weight publications "
                                            "to clients.", minimum=1)
    epsilon_start: float = setting(1.0, "Exploration rate (probability of a uniformly random "
                                   "legal action) at the start.", minimum=0.0, maximum=1.0)
    epsilon_end: float = setting(0.05, "Exploration rate after the decay.", minimum=0.0,
                                 maximum=1.0)
    epsilon_decay_steps: int = setting(10_000, "Env steps over which epsilon falls linearly "
                                       "from start to end (0: end at once).", minimum=0)
    max_grad_norm: float = setting(10.0, "Global gradient-norm clip.", minimum=0.0)
    max_lead_steps: int = setting(0, "Pacing: a sampling client waits (at most "
                                  "`sampling.max_wait_for_batch_s`) while the learner is more "
                                  "than this many env steps behind `updates_per_step`; 0: "
                                  "clients never wait, and the ratio achieved is what the "
                                  "learner's speed allows.", minimum=0)
    double_q: bool = setting(True, "Choose the bootstrap action with the online network "
                             "(double DQN); false: max of the target network.")
    hidden_sizes: tuple[int, ...] = setting((256, 256), "Hidden layer widths of the Q-network.")
    activation: str = setting("relu", "Hidden activation.", choices=("tanh", "relu"))
    weight_init: str = setting("orthogonal", "Initial weights of the Q-network: `orthogonal` "
                               "(the policy network's: orthogonal, gain sqrt 2 in hidden "
                               "layers and 0.01 in the Q head, zero biases); `uniform` "
                               "(torch's own nn.Linear/Conv2d draw, weights and biases "
                               "~ U(+-1/sqrt(fan_in)), as SB3's DQN: Q-values start "
                               "spread instead of near 0).", choices=("orthogonal", "uniform"))


ALGORITHMS = ("ppo", "appo", "dqn", "sac")


@dataclass(frozen=True)
class SACConfig:
    """[sac]: soft actor-critic for float Box actions with finite bounds (`learner.algorithm =
    "sac"`): a tanh-squashed Gaussian actor, twin Q-networks with Polyak-averaged targets,
    automatic entropy tuning, n-step returns from a shared-memory replay buffer; clients
    sample from the actor (no other exploration)."""

    lr: float = setting(3e-4, "Adam learning rate of the actor, the critics and the entropy "
                        "coefficient.", reloadable=True, minimum=0.0)
    gamma: float = setting(0.99, "Discount factor.", minimum=0.0, maximum=1.0)
    n_step: int = setting(1, "Steps of reward summed before bootstrapping (n-step returns).",
                          minimum=1, maximum=100)
    buffer_size_steps: int = setting(100_000, "Replay buffer capacity in transitions (the "
                                     "oldest are overwritten).", minimum=1)
    learning_starts_steps: int = setting(1000, "Transitions in the buffer before the first "
                                         "update.", minimum=1)
    batch_size: int = setting(256, "Transitions per gradient step.", minimum=1)
    updates_per_step: float = setting(1.0, "Gradient steps per env step received (the "
                                      "updates-to-data ratio); the learner trains while "
                                      "clients sample and never makes them wait.",
                                      minimum=0.001, maximum=64.0)
    tau: float = setting(0.005, "Polyak coefficient of the target critics: target = (1 - tau) "
                         "* target + tau * online after every gradient step.",
                         minimum=0.0, maximum=1.0)
    publish_interval_updates: int = setting(20, "Gradient steps between weight publications "
                                            "to clients.", minimum=1)
    initial_alpha: float = setting(1.0, "Entropy coefficient at the start (the fixed one when "
                                   "`autotune_alpha = false`).", minimum=0.0)
    autotune_alpha: bool = setting(True, "Tune the entropy coefficient so the policy's entropy "
                                   "tracks `target_entropy_per_dim` * action dimensions.")
    target_entropy_per_dim: float = setting(-1.0, "Target entropy per action dimension (the "
                                            "usual -1: target = -dim(A)).")
    max_grad_norm: float = setting(0.0, "Global gradient-norm clip of each network (0: none).",
                                   minimum=0.0)
    max_lead_steps: int = setting(0, "Pacing, as `dqn.max_lead_steps`: a sampling client waits "
                                  "(at most `sampling.max_wait_for_batch_s`) while the learner "
                                  "is more than this many env steps behind "
                                  "`updates_per_step`; 0: clients never wait.", minimum=0)
    hidden_sizes: tuple[int, ...] = setting((256, 256), "Hidden layer widths of the actor and "
                                            "of each critic.")
    activation: str = setting("relu", "Hidden activation.", choices=("tanh", "relu"))


@dataclass(frozen=True)
class APPOConfig:
    """[appo]: asynchronous PPO (`learner.algorithm = "appo"`): PPO's loss, network and
    settings ([ppo]) on batches whose steps older weights may have chosen, corrected by
    V-trace (IMPALA) instead of GAE; clients never wait for an update, and steps more than
    `sampling.max_policy_lag` versions old are dropped."""

    vtrace_rho_clip: float = setting(1.0, "V-trace's rho-bar: importance weights of the "
                                     "TD errors are clipped here.", minimum=0.0)
    vtrace_c_clip: float = setting(1.0, "V-trace's c-bar: the trace-cutting importance "
                                   "weights are clipped here.", minimum=0.0)
    max_lead_steps: int = setting(0, "Pacing: a sampling client waits (at most "
                                  "`sampling.max_wait_for_batch_s`) while more than this many "
                                  "env steps wait for the learner (read by the connector, not "
                                  "yet in a batch); at least `sampling.train_batch_size` (which "
                                  "keeps one batch ready): clients that share the learner's "
                                  "cores leave it the CPU instead of sampling steps it would "
                                  "drop. 0: clients never wait, and the connector keeps only the "
                                  "freshest batch.", minimum=0)


POLICY_SUBSECTIONS: dict[str, type] = {"ppo": PPOConfig, "dqn": DQNConfig, "sac": SACConfig}
"""Sections a ``[policies.NAME.<section>]`` table may override for one policy."""


@dataclass(frozen=True)
class PolicyConfig:
    """[policies.NAME]: one policy besides the default (or, named `default`, overriding it).
    Unset keys take [env]'s spaces and [ppo]'s values; `[policies.NAME.ppo]` overrides
    [ppo] keys for this policy only."""

    env_id: str = setting("", "gymnasium id whose spaces this policy uses (empty: [env]'s "
                          "spaces, unless spaces are given here).")
    observation_space: Space | None = setting(None, "Explicit observation space of this "
                                              "policy (a space table, as in [env]).")
    action_space: Space | None = setting(None, "Explicit action space of this policy.")
    action_mask_key: str = setting("", "Key of this policy's Dict observation holding the "
                                   "action mask (empty: [env]'s when the observation space is "
                                   "[env]'s, else none).")
    trainable: bool = setting(True, "false: a frozen policy, never trained (its clients act "
                              "with it; its episodes are counted, not learned from).")
    load_from: str = setting("", "Checkpoint directory (its policy of this name, else "
                             "`default`) or `.onnx` file this policy starts from; required "
                             "when `trainable = false`.")
    ppo: PPOConfig | None = setting(None, "This policy's [ppo] (keys set in "
                                    "`[policies.NAME.ppo]` override [ppo]).")
    algorithm: str = setting("", "This policy's learning algorithm (empty: "
                             "`learner.algorithm`).", choices=("", *ALGORITHMS))
    dqn: DQNConfig | None = setting(None, "This policy's [dqn] (keys set in "
                                    "`[policies.NAME.dqn]` override [dqn]).")
    sac: SACConfig | None = setting(None, "This policy's [sac] (keys set in "
                                    "`[policies.NAME.sac]` override [sac]).")

DEVICE_PATTERN = r"auto|cpu|cuda(:[0-9]+)?"
"""The learner.device values: whether such a device exists is the learner's check at boot."""


@dataclass(frozen=True)
class LearnerConfig:
    """[learner]: the learner process."""

    algorithm: str = setting("ppo", "Learning algorithm of every trainable policy (a "
                             "policy may choose its own): `ppo` (on-policy), `appo` "
                             "(asynchronous PPO with V-trace), `dqn` (off-policy, Discrete "
                             "actions, replay buffer), `sac` (off-policy, float Box actions "
                             "with finite bounds, replay buffer).", choices=ALGORITHMS)
    device: str = setting("auto", "`auto` times a few SGD steps of each policy's network on "
                          "the CPU and on each visible CUDA device and trains it on the faster "
                          "(no timing on a host without CUDA; see docs/gpu.md); or `cpu`, "
                          "`cuda`, `cuda:1`. A device the host does not have is a boot error.")
    torch_threads: int = setting(1, "torch intra-op threads in the learner.", minimum=1)
    seed: int = setting(0, "Seed of the learner's RNGs.")


@dataclass(frozen=True)
class ConnectorConfig:
    """[connector]: the learner pipeline turning episodes into train batches."""

    pipeline: tuple[str, ...] = setting(
        ("observations", "columns", "old_logp", "values", "gae", "normalize_advantages"),
        "Pieces in order: built-in names or `module:Class` import paths of your own pieces.")


NATIVE_PARTS = ("scan", "step", "direct", "net")
"""The inference role's native parts (daemon/inference/native/): the lane scan (scan.c), the
lone step (step.c), serving connections' plain steps (direct.c), the forward-pass interpreter
(net.c)."""


@dataclass(frozen=True)
class InferenceConfig:
    """[inference]: server-side action serving (the `inference` role)."""

    backend: str = setting("auto", "Forward-pass backend: `auto` times the native interpreter "
                           "(a compiled extension: MLPs and LSTM/GRU cells), numpy and onnxruntime at start "
                           "and keeps the fastest per batch size (torch on CUDA timed beside them "
                           "when a GPU is present). `native` where it cannot run (convolutions, extension not "
                           "built) logs a warning and falls back to `auto`.",
                           choices=("auto", "native", "numpy", "onnxruntime", "torch"))
    max_batch: int = setting(256, "Most action requests answered by one forward pass.",
                             minimum=1, maximum=4096)
    max_wait_us: int = setting(200, "Longest a request waits for others to batch with it "
                               "(0: answer whatever is pending at once), and never longer than "
                               "two batch-1 forward passes of the policy (timed at start: what "
                               "batching saves), so not at all when those take under 50 us "
                               "(a small MLP). Requests are answered at once when every open "
                               "episode has one pending.",
                               minimum=0, maximum=100_000)
    tcp_lanes: int = setting(4096, "Episodes TCP, TLS and Unix-socket serving clients may have "
                             "open at once (daemon-wide; a START beyond it is refused with ERROR).",
                             minimum=1, maximum=65536)
    native_parts: tuple[str, ...] = setting(
        NATIVE_PARTS, "Native parts of the inference role in use (where the extension is built): "
        "`scan` (the lane scan), `step` (lone requests in one native call; needs `net`), `direct` "
        "(serving connections' plain steps), `net` (the native forward pass, a candidate of "
        "`backend`). A part left out is done by the Python path instead (an A/B of one part: "
        "bench/scenarios/native_ab.py); `[]`: pure Python. Status `inference.native_parts` lists "
        "the parts in use.", choices=NATIVE_PARTS)
    env_steps_per_sample: int = setting(0, "Training steps the inference role records per "
                                        "policy before it hands them on and (on-policy) waits "
                                        "for weights trained on them; 0: "
                                        "sampling.train_batch_size.", minimum=0)


@dataclass(frozen=True)
class CheckpointConfig:
    """[checkpoint]: periodic and on-demand checkpoints."""

    checkpoint_interval_s: float = setting(300.0, "Seconds between periodic checkpoints "
                                           "(0 = only on request and at shutdown).",
                                           reloadable=True, minimum=0.0)
    keep_checkpoints: int = setting(5, "Newest checkpoints kept on disk.", reloadable=True,
                                    minimum=1)
    snapshot_bytes: int = setting(64 * MiB, "Shared-memory area for one learner snapshot.",
                                  minimum=MiB)
    save_replay: bool = setting(False, "Save each DQN/SAC policy's replay buffer with every "
                                "checkpoint (up to its `buffer_size_steps` transitions) and "
                                "refill it from the checkpoint a daemon resumes.")


@dataclass(frozen=True)
class DaemonConfig:
    """[daemon]: the supervisor, directories and logging."""

    state_dir: str = setting("", "Checkpoints, TensorBoard files and `daemon.json` (default: "
                             "$STATE_DIRECTORY, else $XDG_STATE_HOME/rlinkd, else "
                             "~/.local/state/rlinkd).")
    runtime_dir: str = setting("", "Unix socket and pid file (default: $RUNTIME_DIRECTORY, "
                               "else <state_dir>/run).")
    shm_dir: str = setting("/dev/shm", "Directory (tmpfs) holding shared-memory segments.")
    log_level: str = setting("info", "Log level.", reloadable=True,
                             choices=("debug", "info", "warning", "error"))
    shutdown_timeout_s: float = setting(30.0, "Graceful-stop budget: drain, final checkpoint, "
                                        "exit.", minimum=1.0)
    heartbeat_timeout_s: float = setting(30.0, "A child silent this long gets SIGABRT, then "
                                         "SIGKILL, then a restart.", minimum=1.0)
    restart_backoff_s: float = setting(0.5, "First restart delay of a crashed child (doubles "
                                       "per crash, reset after a minute of health).",
                                       minimum=0.0)
    restart_backoff_max_s: float = setting(30.0, "Largest restart delay.", minimum=0.0)
    crash_loop_restarts: int = setting(5, "This many restarts of one child within "
                                       "`crash_loop_window_s` stop the daemon.", minimum=1)
    crash_loop_window_s: float = setting(60.0, "Window of the crash-loop rule.", minimum=1.0)
    status_interval_s: float = setting(1.0, "Period of status updates between processes.",
                                       minimum=0.05)


@dataclass(frozen=True)
class MetricsConfig:
    """[metrics]: the Prometheus endpoint, served by the supervisor (off by default)."""

    listen: str = setting("", "`HOST:PORT` of the Prometheus `/metrics` HTTP endpoint, e.g. "
                          "`127.0.0.1:9464` (empty = off; port 0 = pick a free port, shown in "
                          "`rlinkd status` and `daemon.json`).")
    insecure_remote: bool = setting(False, "Allow a non-loopback `listen` (plain HTTP without "
                                    "authentication: whoever reaches it reads the metrics).")


@dataclass(frozen=True)
class ClusterConfig:
    """[cluster]: one training job across several daemons (data-parallel learners on
    torch.distributed). `world_size = 1` is a daemon on its own, as without this section."""

    world_size: int = setting(1, "Daemons (ranks) training one job; 1: this daemon trains "
                              "alone and torch.distributed is never loaded.", minimum=1,
                              maximum=1024)
    rank: int = setting(0, "This daemon's rank in the job, 0 .. world_size - 1; rank 0 serves "
                        "the rendezvous at `master`.", minimum=0)
    master: str = setting("127.0.0.1:29500", "`HOST:PORT` of the job's rendezvous, served by "
                          "rank 0 (torch.distributed TCPStore: trusted networks only, it has "
                          "no authentication).")
    backend: str = setting("auto", "Collective backend: `auto` is `nccl` when the learner "
                           "is on CUDA, else `gloo`.", choices=("auto", "gloo", "nccl"))
    collective_timeout_s: float = setting(20.0, "A collective that does not complete within "
                                          "this time counts its missing members as lost (the "
                                          "group re-forms without them); also the longest wait "
                                          "for the rendezvous at start. Below "
                                          "`daemon.heartbeat_timeout_s`, so a peer that hangs "
                                          "is left out before this learner is taken for hung.",
                                          minimum=1.0)
    peer_wait_s: float = setting(0.5, "Longest a rank without a train batch lets the others "
                                 "wait: after it, it joins the job's update with no rows "
                                 "(so a rank without clients never stalls the job); below "
                                 "`collective_timeout_s`.",
                                 minimum=0.01)
    reform_window_s: float = setting(2.0, "When a member is lost, rank 0 waits this long "
                                     "for the others to re-form the group without it (a rank "
                                     "asking to join ends the wait early). Below "
                                     "`collective_timeout_s`.", minimum=0.1)
    insecure_remote: bool = setting(False, "Allow a non-loopback `master` (the collective "
                                    "port has no authentication or encryption).")


@dataclass(frozen=True)
class Config:
    """The whole configuration. Build it with ``load_config``."""

    server: ServerConfig = field(default_factory=ServerConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    appo: APPOConfig = field(default_factory=APPOConfig)
    dqn: DQNConfig = field(default_factory=DQNConfig)
    sac: SACConfig = field(default_factory=SACConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    connector: ConnectorConfig = field(default_factory=ConnectorConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    daemon: DaemonConfig = field(default_factory=DaemonConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    policies: dict[str, PolicyConfig] = field(default_factory=dict, metadata={
        "doc": "Named policies ([policies.NAME] tables); `default` always exists."})
    policy_mapping: PolicyMapping = field(default_factory=PolicyMapping, metadata={
        "doc": "Agent-id patterns to policy names, first match wins, e.g. "
               "`[policy_mapping] \"red_*\" = \"red\"`; unmatched agents use `default`."})
    source_file: str = field(default="", metadata={"internal": True})

    @property
    def state_dir(self) -> Path:
        return Path(self.daemon.state_dir)

    @property
    def runtime_dir(self) -> Path:
        return Path(self.daemon.runtime_dir)

    @property
    def socket_path(self) -> Path:
        return self.runtime_dir / "rlinkd.sock"


SECTIONS: dict[str, type] = {"server": ServerConfig, "env": EnvConfig, "sampling": SamplingConfig,
            "ppo": PPOConfig, "appo": APPOConfig, "dqn": DQNConfig, "sac": SACConfig,
            "learner": LearnerConfig,
            "connector": ConnectorConfig, "checkpoint": CheckpointConfig,
            "inference": InferenceConfig, "daemon": DaemonConfig, "metrics": MetricsConfig,
            "cluster": ClusterConfig}


# ---------------------------------------------------------------- value coercion
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls, globalns=vars(sys.modules[__name__]))


def _coerce(key: str, hint: Any, value: Any) -> Any:
    """Convert a TOML/CLI value to the declared type or raise ConfigError."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None or value == {}:
            return None
        return _coerce(key, next(a for a in args if a is not type(None)), value)
    if hint is Space:
        return _coerce_space(key, value)
    if origin is tuple:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return tuple(_coerce(key, args[0], v) for v in value)
    return _coerce_scalar(key, hint, value)


def _coerce_scalar(key: str, hint: type, value: Any) -> Any:
    if hint is bool:
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        if isinstance(value, bool):
            return value
    elif hint is int and not isinstance(value, bool):
        try:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            return int(value)
        except (TypeError, ValueError):
            pass
    elif hint is float and not isinstance(value, bool):
        try:
            number = float(value)
        except (TypeError, ValueError):
            pass
        else:
            if number == number:  # NaN would pass every min/max check
                return number
    elif hint is str and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise ConfigError(f"{key}: expected {hint.__name__}, got {value!r}")


def _coerce_space(key: str, value: Any) -> Space:
    if isinstance(value, Space):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: expected a table such as {{type = \"Discrete\", n = 2}}")
    try:
        return space_from_json(value)
    except SpaceError as exc:
        raise ConfigError(f"{key}: {exc}") from None


def _check_limits(key: str, f: dataclasses.Field, value: Any) -> None:
    meta = f.metadata
    if isinstance(value, float) and not math.isfinite(value):  # (nan passes every comparison)
        raise ConfigError(f"{key}: must be a finite number, got {value!r}")
    if meta.get("min") is not None and value < meta["min"]:
        raise ConfigError(f"{key}: must be >= {meta['min']}, got {value!r}")
    if meta.get("max") is not None and value > meta["max"]:
        raise ConfigError(f"{key}: must be <= {meta['max']}, got {value!r}")
    if meta.get("choices") and value not in meta["choices"]:
        raise ConfigError(f"{key}: must be one of {', '.join(meta['choices'])}, got {value!r}")


REMOVED_KEYS = {
    "inference.direct": "removed: every serving connection is the inference role's (docs/serving.md, "
                        "\"Who owns which socket\"); delete the key",
}
"""Keys a config file may still carry from an earlier version: the error says what to do."""


def _build_section(name: str, cls: type, values: dict[str, Any]) -> Any:
    if not isinstance(values, dict):
        raise ConfigError(f"[{name}]: expected a table")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        why = REMOVED_KEYS.get(f"{name}.{unknown[0]}", f"unknown key (known: {', '.join(fields)})")
        raise ConfigError(f"{name}.{unknown[0]}: {why}")
    hints = _hints(cls)
    kwargs = {}
    for key, value in values.items():
        full = f"{name}.{key}"
        coerced = _coerce(full, hints[key], value)
        if coerced is not None and not isinstance(coerced, (tuple, Space)):
            _check_limits(full, fields[key], coerced)
        elif isinstance(coerced, tuple) and fields[key].metadata.get("choices"):
            for item in coerced:  # (a list of names: each one of the choices)
                _check_limits(full, fields[key], item)
        kwargs[key] = coerced
    return cls(**kwargs)


# ---------------------------------------------------------------- loading
def read_toml(path: str | os.PathLike) -> dict[str, Any]:
    """Parse a TOML file into nested dicts; ConfigError on I/O or syntax errors."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None


def parse_override(text: str) -> tuple[str, str, Any]:
    """Parse a CLI override ``section.key=value`` (value as TOML, else a bare string)."""
    if "=" not in text or "." not in text.split("=", 1)[0]:
        raise ConfigError(f"--set {text!r}: expected section.key=value")
    dotted, raw = text.split("=", 1)
    section, key = dotted.strip().split(".", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return section, key, value


def merge(base: dict[str, Any], section: str, key: str, value: Any) -> None:
    """Set ``base[section][key] = value`` creating the section table when missing; under
    ``policies`` a dotted ``key`` goes into nested tables (``red.ppo.lr``); under
    ``policy_mapping`` the key is a pattern, dots and all."""
    table, path = base, [section, *key.split(".")] if section == "policies" else [section, key]
    for i, name in enumerate(path[:-1]):
        table = table.setdefault(name, {})
        if not isinstance(table, dict):
            raise ConfigError(f"[{'.'.join(path[:i + 1])}]: expected a table, cannot set "
                              f"{section}.{key}")
    table[path[-1]] = value


NAMED_SECTIONS = ("policies", "policy_mapping")
"""Top-level tables that are not a fixed ``SECTIONS`` dataclass."""


def _build_policies(raw: Any, section_raw: dict[str, dict[str, Any]]) -> dict[str, PolicyConfig]:
    """``[policies.NAME]`` tables → PolicyConfig by name (ConfigError naming the key)."""
    if not isinstance(raw, dict):
        raise ConfigError("[policies]: expected tables [policies.NAME]")
    if len(raw) > MAX_POLICIES:
        raise ConfigError(f"[policies]: at most {MAX_POLICIES} policies")
    out = {}
    for name, table in raw.items():
        try:
            check_policy_name(name, "[policies]")
        except MappingError as exc:
            raise ConfigError(str(exc)) from None
        if not isinstance(table, dict):
            raise ConfigError(f"[policies.{name}]: expected a table")
        table = dict(table)
        subs = {key: table.pop(key, None) for key in POLICY_SUBSECTIONS}
        policy = _build_section(f"policies.{name}", PolicyConfig, table)
        for key, cls in POLICY_SUBSECTIONS.items():
            sub, base = subs[key], section_raw.get(key, {})
            if sub is not None:
                if not isinstance(sub, dict):
                    raise ConfigError(f"[policies.{name}.{key}]: expected a table")
                merged = _build_section(f"policies.{name}.{key}", cls, {**base, **sub})
                policy = dataclasses.replace(policy, **{key: merged})
        out[name] = policy
    return out


def _build_mapping(raw: Any) -> PolicyMapping:
    try:
        return PolicyMapping.from_json(raw)
    except MappingError as exc:
        raise ConfigError(str(exc)) from None


def load_config(path: str | os.PathLike | None = None,
                overrides: Sequence[tuple[str, str, Any]] = (), *,
                resolve_dirs: bool = True) -> Config:
    """Build and validate a Config from an optional TOML file plus overrides.

    Called once at start, again on SIGHUP (the caller keeps the old one when this
    raises), and by tests. ``overrides`` are (section, key, value) triples from the CLI.
    """
    raw = read_toml(path) if path else {}
    for section, key, value in overrides:
        merge(raw, section, key, value)
    unknown = sorted(set(raw) - set(SECTIONS) - set(NAMED_SECTIONS))
    if unknown:
        raise ConfigError(f"[{unknown[0]}]: unknown section (known: "
                          f"{', '.join([*SECTIONS, *NAMED_SECTIONS])})")
    sections = {name: _build_section(name, cls, raw.get(name, {}))
                for name, cls in SECTIONS.items()}
    cfg = Config(**sections, policies=_build_policies(raw.get("policies", {}), raw),
                 policy_mapping=_build_mapping(raw.get("policy_mapping", {})),
                 source_file=str(Path(path).resolve()) if path else "")
    if resolve_dirs:
        cfg = with_resolved_dirs(cfg)
    validate(cfg)
    return cfg


def with_resolved_dirs(cfg: Config) -> Config:
    """Fill in the default state and runtime directories as absolute paths."""
    state = Path(cfg.daemon.state_dir or default_state_dir()).expanduser().resolve()
    runtime = cfg.daemon.runtime_dir or os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]
    runtime_path = Path(runtime).expanduser().resolve() if runtime else state / "run"
    daemon = dataclasses.replace(cfg.daemon, state_dir=str(state), runtime_dir=str(runtime_path))
    return dataclasses.replace(cfg, daemon=daemon)


def validate(cfg: Config) -> None:
    """Cross-field checks that single-field limits cannot express."""
    s, srv = cfg.sampling, cfg.server
    if cfg.ppo.minibatch_size > s.train_batch_size:
        raise ConfigError(f"ppo.minibatch_size ({cfg.ppo.minibatch_size}) must not exceed "
                          f"sampling.train_batch_size ({s.train_batch_size})")
    if 0 < cfg.appo.max_lead_steps < s.train_batch_size:
        raise ConfigError(f"appo.max_lead_steps ({cfg.appo.max_lead_steps}) must be 0 (off) or at "
                          f"least sampling.train_batch_size ({s.train_batch_size}): clients held "
                          "below a full batch would wait for one that cannot form")
    for key in POLICY_SUBSECTIONS:
        sizes = getattr(cfg, key).hidden_sizes
        if not sizes or min(sizes) < 1:
            raise ConfigError(f"{key}.hidden_sizes: give at least one positive width")
    if bool(srv.tls_cert_file) != bool(srv.tls_key_file):
        raise ConfigError("server.tls_cert_file and server.tls_key_file go together")
    if srv.tls_client_ca_file and not srv.tls_cert_file:
        raise ConfigError("server.tls_client_ca_file needs server.tls_cert_file")
    if not is_loopback(srv.host) and not (srv.tls_cert_file or srv.insecure_remote):
        raise ConfigError(f"server.host = {srv.host!r} is not a loopback address: configure "
                          "server.tls_cert_file/tls_key_file, or set server.insecure_remote = "
                          "true to accept unencrypted remote connections")
    if len(str(cfg.socket_path)) > 100:
        raise ConfigError(f"daemon.runtime_dir: socket path {cfg.socket_path} is too long for "
                          "a Unix socket (max ~100 characters)")
    if (cfg.env.observation_space is None or cfg.env.action_space is None) and not cfg.env.id:
        raise ConfigError("env.id: give a gymnasium id or both explicit spaces")
    if not re.fullmatch(DEVICE_PATTERN, cfg.learner.device):
        raise ConfigError(f"learner.device = {cfg.learner.device!r}: expected auto, cpu, cuda "
                          "or cuda:N")
    metrics_address(cfg.metrics)
    _validate_native_parts(cfg.inference)
    _validate_policies(cfg)
    _validate_cluster(cfg)


def _validate_native_parts(inf: InferenceConfig) -> None:
    """``step`` runs ``net``'s program, and ``backend = "native"`` is ``net``."""
    if "step" in inf.native_parts and "net" not in inf.native_parts:
        raise ConfigError("inference.native_parts: `step` runs the native forward pass; list `net` "
                          "too, or leave `step` out")
    if inf.backend == "native" and "net" not in inf.native_parts:
        raise ConfigError("inference.backend = 'native' needs `net` in inference.native_parts")


def _validate_policies(cfg: Config) -> None:
    names = {DEFAULT_POLICY, *cfg.policies}
    for pattern, policy in cfg.policy_mapping.rules:
        if policy not in names:
            raise ConfigError(f"policy_mapping[{pattern!r}] = {policy!r}: no such policy "
                              f"(known: {', '.join(sorted(names))})")
    for name, p in cfg.policies.items():
        if not p.trainable and not p.load_from:
            raise ConfigError(f"policies.{name}.load_from: a frozen policy (trainable = false) "
                              "needs a checkpoint or an .onnx file to load")
        if p.ppo is not None and p.ppo.minibatch_size > cfg.sampling.train_batch_size:
            raise ConfigError(f"policies.{name}.ppo.minibatch_size must not exceed "
                              "sampling.train_batch_size")


def _validate_cluster(cfg: Config) -> None:
    """[cluster] against itself and the learner: rank inside the world, a reachable form of
    master, timeouts in their order, a backend the device can use while world_size > 1."""
    c = cfg.cluster
    if c.rank >= c.world_size:
        raise ConfigError(f"cluster.rank ({c.rank}) must be < cluster.world_size ({c.world_size})")
    if c.world_size == 1:
        return
    cluster_address(c)
    if c.collective_timeout_s >= cfg.daemon.heartbeat_timeout_s:
        raise ConfigError(f"cluster.collective_timeout_s ({c.collective_timeout_s:g}) must be below "
                          f"daemon.heartbeat_timeout_s ({cfg.daemon.heartbeat_timeout_s:g}): a "
                          "learner waiting on a hung peer would be killed as hung itself")
    if c.peer_wait_s >= c.collective_timeout_s:
        raise ConfigError(f"cluster.peer_wait_s ({c.peer_wait_s:g}) must be below "
                          f"cluster.collective_timeout_s ({c.collective_timeout_s:g}): a rank with a "
                          "batch would time out in the round before a rank without one joins it")
    if c.reform_window_s >= c.collective_timeout_s:
        raise ConfigError(f"cluster.reform_window_s ({c.reform_window_s:g}) must be below "
                          f"cluster.collective_timeout_s ({c.collective_timeout_s:g}): ranks asking "
                          "to re-form would give up before rank 0 decides")
    if c.backend == "nccl" and cfg.learner.device == "cpu":
        raise ConfigError("cluster.backend = 'nccl' needs a CUDA learner (learner.device = 'cpu')")


def writes_checkpoints(cluster: ClusterConfig) -> bool:
    """Whether this daemon writes checkpoints: a daemon alone does; in a job only rank 0
    (the job's one writer), so a job's checkpoints are one series in rank 0's state dir."""
    return cluster.world_size == 1 or cluster.rank == 0


def cluster_address(cluster: ClusterConfig) -> tuple[str, int]:
    """``cluster.master`` as (host, port); ConfigError for a form HOST:PORT does not describe,
    port 0, or a non-loopback host without ``cluster.insecure_remote``."""
    try:
        address = parse_address(cluster.master, default_port=0)
    except ValueError as exc:
        raise ConfigError(f"cluster.master: {exc}") from None
    if address.kind != "tcp" or not 0 < address.port < 65536:
        raise ConfigError(f"cluster.master = {cluster.master!r}: expected HOST:PORT with a port")
    if not is_loopback(address.host) and not cluster.insecure_remote:
        raise ConfigError(f"cluster.master = {cluster.master!r} is not a loopback address: set "
                          "cluster.insecure_remote = true on a trusted network (the collective "
                          "port has no authentication)")
    return address.host, address.port


METRICS_DEFAULT_PORT = 9464  # the port commonly used for exporters of this kind


def metrics_address(metrics: MetricsConfig) -> tuple[str, int] | None:
    """``metrics.listen`` as (host, port), None when the endpoint is off. Raises ConfigError
    for a form ``HOST:PORT`` does not describe, or a non-loopback host without
    ``metrics.insecure_remote`` (called by ``validate`` and by the supervisor at start)."""
    if not metrics.listen:
        return None
    try:
        address = parse_address(metrics.listen, default_port=METRICS_DEFAULT_PORT)
    except ValueError as exc:
        raise ConfigError(f"metrics.listen: {exc}") from None
    if address.kind != "tcp":
        raise ConfigError(f"metrics.listen = {metrics.listen!r}: expected HOST:PORT")
    if not is_loopback(address.host) and not metrics.insecure_remote:
        raise ConfigError(f"metrics.listen = {metrics.listen!r} is not a loopback address: set "
                          "metrics.insecure_remote = true to serve metrics to other hosts")
    return address.host, address.port


def is_loopback(host: str) -> bool:
    """True for localhost names and 127.0.0.0/8 or ::1 addresses."""
    import ipaddress
    if host in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ---------------------------------------------------------------- reload and docs
def reloadable_changes(old: Config, new: Config) -> tuple[dict[str, Any], list[str]]:
    """Split the differences between two configs into (applicable, ignored) keys.

    Returns ``{"ppo.lr": 0.001, "policies.red.ppo.lr": 0.01, ...}`` for reloadable keys
    that changed (a policy's own ``[policies.NAME.<section>]`` table compared as a restart
    would build it: merged over the global section) and the names of changed keys that need
    a restart (logged, not applied): ``ppo.gamma``, ``policies.red.ppo.hidden_sizes``,
    ``policies.red.ppo`` (a table added or removed), ``policies.blue`` (a policy added or
    removed), ``policy_mapping``. A policy that gains its own table for a section has run on
    the global one: that section's global keys then need a restart too (applied, they would
    reach it, a value the new file does not give it).
    """
    applied: dict[str, Any] = {}
    ignored: list[str] = []
    for name in SECTIONS:
        _diff(name, getattr(old, name), getattr(new, name), applied, ignored)
    for name in [*old.policies, *(n for n in new.policies if n not in old.policies)]:
        a, b = old.policies.get(name), new.policies.get(name)
        if a is None or b is None:
            ignored.append(f"policies.{name}")
        else:
            _diff(f"policies.{name}", a, b, applied, ignored)
    if old.policy_mapping != new.policy_mapping:
        ignored.append("policy_mapping")
    for section in _tables_gained(old, new):
        for key in [k for k in applied if k.startswith(f"{section}.")]:
            ignored.append(key)
            del applied[key]
    return applied, ignored


def _tables_gained(old: Config, new: Config) -> set[str]:
    """The sections (``ppo``, ``dqn``, ``sac``) for which a policy present in both configs
    has its own table in ``new`` and none in ``old``."""
    return {section for name, b in new.policies.items() if (a := old.policies.get(name))
            for section in POLICY_SUBSECTIONS
            if getattr(a, section) is None and getattr(b, section) is not None}


def _diff(prefix: str, a: Any, b: Any, applied: dict[str, Any], ignored: list[str]) -> None:
    """Add the changed fields of sections ``a`` -> ``b`` to ``applied`` (reloadable) or
    ``ignored``; a policy's sub-table present in both is compared key by key."""
    for f in dataclasses.fields(a):
        va, vb, key = getattr(a, f.name), getattr(b, f.name), f"{prefix}.{f.name}"
        if va == vb:
            continue
        if f.name in POLICY_SUBSECTIONS and va is not None and vb is not None:
            _diff(key, va, vb, applied, ignored)
        elif f.metadata.get("reloadable"):
            applied[key] = vb
        else:
            ignored.append(key)


def reloadable_values(cfg: Config) -> dict[str, Any]:
    """Current values of every reloadable key, by dotted name (shown in status), a policy's
    own sub-tables' too (``policies.red.ppo.lr``)."""
    sections = {**{name: getattr(cfg, name) for name in SECTIONS}, **{
        f"policies.{name}.{key}": getattr(policy, key) for name, policy in cfg.policies.items()
        for key in POLICY_SUBSECTIONS if getattr(policy, key) is not None}}
    return {f"{name}.{f.name}": getattr(section, f.name) for name, section in sections.items()
            for f in dataclasses.fields(section) if f.metadata.get("reloadable")}


def apply_changes(cfg: Config, changes: dict[str, Any]) -> Config:
    """Return ``cfg`` with the dotted-key ``changes`` applied (used after a reload):
    ``section.key`` or ``policies.NAME.section.key``; ConfigError for a policy ``cfg`` lacks
    or a sub-table that policy does not have (a reload is computed against this config)."""
    for dotted, value in changes.items():
        *path, key = dotted.split(".")
        if path[0] == "policies":
            policy = cfg.policies.get(path[1])
            if policy is None or getattr(policy, path[2], None) is None:
                raise ConfigError(f"{dotted}: no such policy table in the running config")
            policy = dataclasses.replace(policy, **{path[2]: dataclasses.replace(
                getattr(policy, path[2]), **{key: value})})
            cfg = dataclasses.replace(cfg, policies={**cfg.policies, path[1]: policy})
        else:
            cfg = dataclasses.replace(cfg, **{path[0]: dataclasses.replace(
                getattr(cfg, path[0]), **{key: value})})
    return cfg


ConfigValue = bool | int | float | str  # what a reloadable key holds (inbox message type)


def reload_declaration(dotted: str) -> tuple[type, dataclasses.Field] | None:
    """(section class, field) of a reloadable key, ``section.key`` or
    ``policies.NAME.section.key`` with a section a policy may override
    (``POLICY_SUBSECTIONS``); None for any other key or one not marked reloadable."""
    parts = dotted.split(".")
    if len(parts) == 4 and parts[0] == "policies" and POLICY_NAME.fullmatch(parts[1]):
        cls = POLICY_SUBSECTIONS.get(parts[2])
    else:
        cls = SECTIONS.get(parts[0]) if len(parts) == 2 else None
    if cls is None:
        return None
    f = next((f for f in dataclasses.fields(cls) if f.name == parts[-1]), None)
    return (cls, f) if f is not None and f.metadata.get("reloadable") else None


def check_reload_changes(changes: dict[str, Any]) -> None:
    """ConfigError unless every key is a reloadable key (``reload_declaration``) and its
    value has the declared type and limits (called when a ``Reload`` message is built or
    decoded)."""
    for dotted, value in changes.items():
        declared = reload_declaration(dotted)
        if declared is None:
            raise ConfigError(f"{dotted}: not a reloadable setting")
        cls, f = declared
        if _coerce(dotted, _hints(cls)[f.name], value) != value:
            raise ConfigError(f"{dotted}: {value!r} is not of the declared type")
        _check_limits(dotted, f, value)


_TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n",
                 "\f": "\\f", "\r": "\\r"}


def _toml_string(value: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = (_TOML_ESCAPES.get(ch) or (f"\\u{ord(ch):04x}" if ord(ch) < 0x20 or ord(ch) == 0x7F
                                     else ch) for ch in value)
    return '"' + "".join(out) + '"'


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, Space):
        return _toml_table(value.to_json())
    return repr(value)


def _toml_table(table: dict) -> str:
    """A space's JSON form as an inline TOML table (JSON's null bounds become ±inf: TOML
    has infinities, not null)."""
    def item(key: str, v: Any) -> str:
        if isinstance(v, dict):
            return _toml_table(v)
        if isinstance(v, list):
            return "[" + ", ".join(item(key, x) for x in v) + "]"
        if v is None:
            return "-inf" if key == "low" else "inf"
        return _toml_value(v)
    return "{ " + ", ".join(f"{_toml_key(k)} = {item(k, v)}" for k, v in table.items()) + " }"


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else _toml_string(key)


def to_toml(cfg: Config) -> str:
    """Render a config as TOML that ``load_config`` reads back to an equal Config."""
    lines = []
    for name in SECTIONS:
        lines += [f"[{name}]", *_toml_fields(getattr(cfg, name)), ""]
    for name, policy in cfg.policies.items():
        lines += [f"[policies.{name}]", *_toml_fields(policy), ""]
        for key in POLICY_SUBSECTIONS:
            if getattr(policy, key) is not None:
                lines += [f"[policies.{name}.{key}]", *_toml_fields(getattr(policy, key)), ""]
    if cfg.policy_mapping.rules:
        lines.append("[policy_mapping]")
        lines += [f"{_toml_string(pattern)} = {_toml_string(policy)}"
                  for pattern, policy in cfg.policy_mapping.rules]
    return "\n".join(lines)


def _toml_fields(section: Any) -> list[str]:
    """``key = value`` lines of a section's set scalar fields (sub-tables excluded)."""
    return [f"{f.name} = {_toml_value(getattr(section, f.name))}"
            for f in dataclasses.fields(section)
            if getattr(section, f.name) is not None and not isinstance(
                getattr(section, f.name), tuple(POLICY_SUBSECTIONS.values()))]


def docs_markdown() -> str:
    """docs/configuration.md's table, generated from the declarations above."""
    rows = ["| key | default | reloadable | meaning |", "| --- | --- | --- | --- |"]
    for name, cls in [*SECTIONS.items(), ("policies.NAME", PolicyConfig)]:
        for f in dataclasses.fields(cls):
            default = "(none)" if f.default is None else _toml_value(f.default)
            default = default.replace("|", "\\|") or '""'
            reload_mark = "yes" if f.metadata["reloadable"] else ""
            doc = f.metadata["doc"].replace("|", "\\|")
            rows.append(f"| `{name}.{f.name}` | `{default}` | {reload_mark} | {doc} |")
    mapping = next(f for f in dataclasses.fields(Config) if f.name == "policy_mapping")
    doc = mapping.metadata["doc"].replace("|", "\\|")
    rows.append(f"| `policy_mapping` | `{{}}` |  | {doc} |")
    return "\n".join(rows) + "\n"


def key_declaration(dotted: str) -> tuple[Any, dataclasses.Field]:
    """(type hint, field) of the config key ``section.key``: what a CLI shorthand flag for
    that key takes its type and help text from. ConfigError if there is no such key."""
    section, _, key = dotted.partition(".")
    cls = SECTIONS.get(section)
    found = [f for f in dataclasses.fields(cls) if f.name == key] if cls else []
    if cls is None or not found:
        raise ConfigError(f"{dotted}: no such config key")
    return _hints(cls)[key], found[0]
