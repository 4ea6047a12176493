"""The PPO learner core: batches of numpy arrays in, trained weights and stats out.

`Learner` knows nothing of processes, queues or signals; the learner process owns one
instance and calls `update(batch)` once per training batch from a single thread.
"""

from __future__ import annotations

import dataclasses
import math
import random
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rlinkd.client_lib.protocol.policy_spec import PolicySpec
from rlinkd.client_lib.protocol.columns import check_action_vector
from rlinkd.daemon.batch_schema import COLUMN_NAMES, OBS, PER_ROW_COLUMNS
from rlinkd.daemon.config import PPOConfig
from rlinkd.daemon.learner import bptt
from rlinkd.daemon.learner.adam import Adam
from rlinkd.daemon.learner.graphed import make_stepper
from rlinkd.daemon.learner.minibatch import update_plan
from rlinkd.daemon.learner.model import ActorCritic, ObsNormalizer
from rlinkd.daemon.learner.ppo import STAT_NAMES, ppo_loss_terms

if TYPE_CHECKING:  # the job is built (and torch.distributed imported) only in a job of N > 1
    from rlinkd.daemon.cluster.job import Job

STATE_FORMAT_VERSION = 2  # 2: per-leaf normalisers, networks described by spaces
_KL = STAT_NAMES.index("approx_kl")
_STEP_SLOTS = len(STAT_NAMES) + 2  # a step's diagnostics, its grad norm when applied, applied


def resolve_device(device: str) -> torch.device:
    """'auto' means cuda when available, else cpu; anything else is passed to torch."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def seeded_model(spec: PolicySpec, device: str, seed: int, torch_threads: int
                 ) -> tuple[torch.device, ActorCritic]:
    """Thread count and the process-global torch/python RNGs set (a learner core owns its
    process), then the spec's network on the device: what every algorithm's core starts with."""
    if torch_threads > 0:
        torch.set_num_threads(torch_threads)
    torch.manual_seed(seed)
    random.seed(seed)
    resolved = resolve_device(device)
    return resolved, ActorCritic(spec, init_seed=seed).to(resolved)


class DeviceStats(Mapping[str, float]):
    """A step's statistics by name, held as one device tensor and read back (one sync) only
    when first looked at: a replay learner keeps a publication's steps and reads them then."""

    def __init__(self, names: tuple[str, ...], values: torch.Tensor) -> None:
        self.names, self.tensor = names, values
        self._floats: dict[str, float] | None = None

    def _read(self) -> dict[str, float]:
        if self._floats is None:
            self._floats = dict(zip(self.names, self.tensor.tolist()))
        return self._floats

    def __getitem__(self, name: str) -> float:
        return self._read()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def mean_stats(steps: list[Mapping[str, float]]) -> dict[str, float]:
    """Each statistic's mean over `steps` (one mapping per step, all with the same names):
    steps of ``DeviceStats`` not yet read are averaged on the device and read in one go."""
    unread = [s for s in steps if isinstance(s, DeviceStats) and s._floats is None]
    if steps and len(unread) == len(steps):
        values = torch.stack([s.tensor for s in unread]).double().mean(dim=0)
        return dict(zip(unread[0].names, values.tolist()))
    return {k: float(np.mean([s[k] for s in steps])) for k in steps[0]}


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """`array` as a tensor on `device`, in its dtype (a uint8 image stays uint8): on a GPU
    copied from pinned host memory without waiting; on the CPU sharing the array's memory."""
    host = torch.from_numpy(np.ascontiguousarray(array))
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def explained_variance(predicted: np.ndarray, targets: np.ndarray) -> float:
    """1 - Var[targets - predicted] / Var[targets]; NaN when the targets are constant."""
    predicted, targets = np.asarray(predicted, np.float64), np.asarray(targets, np.float64)
    var_targets = float(np.var(targets))
    if var_targets == 0.0:
        return math.nan
    return 1.0 - float(np.var(targets - predicted)) / var_targets


def _make_adam(model: torch.nn.Module, lr: float) -> Adam:
    """Adam with eps 1e-5 (see ``daemon.learner.adam`` for why it is not torch.optim's)."""
    return Adam(model.parameters(), lr=lr, eps=1e-5)


def _no_progress() -> None:
    """The default `Learner.update` progress hook: nobody is listening."""


def _mean_stats(sums: list[float], steps: int) -> dict[str, float]:
    """The update's stats from the summed step diagnostics: means over the steps, the grad
    norm's over the steps applied (0.0 when none was)."""
    stats = {name: value / steps for name, value in zip(STAT_NAMES, sums)}
    norm_sum, applied = sums[len(STAT_NAMES):]
    stats["grad_norm"] = norm_sum / applied if applied else 0.0
    stats.update(policy_loss=stats.pop("pg_loss"), value_loss=stats.pop("vf_loss"))
    return stats


def _cpu_clone(obj: Any) -> Any:
    """Deep copy of nested dicts/lists/tuples with every tensor cloned to the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _cpu_clone(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cpu_clone(v) for v in obj)
    return obj


class Learner:
    """PPO on an `ActorCritic` built from `spec`, with the [ppo] settings `hp`.

    `self.hp` is the one source of the hyperparameters: read at every minibatch (gamma,
    gae_lambda and normalize_advantages are the connector's and unused here); `set_hparams`
    changes lr and ent_coef live. `device`, `seed` and `torch_threads` (<= 0 keeps torch's
    default) are the [learner] settings. Construction seeds the process-global torch and
    python RNGs with `seed` (the learner owns its process).

    `job` (None: a learner alone) is given by ``job_core.JobRankLearner``, the learner as one
    rank of a data-parallel job: each step's gradient is then averaged across the ranks
    before it is applied (``_apply_step``), normalisers merge the ranks' moments, and steps
    run eagerly (no graph holds the collective).
    """

    def __init__(self, spec: PolicySpec, hp: PPOConfig, device: str = "auto", seed: int = 0,
                 torch_threads: int = 0, graphs: bool = True, job: Job | None = None) -> None:
        self.spec, self.hp, self.job = spec, hp, job
        graphs = graphs and job is None
        self.device, self.model = seeded_model(spec, device, seed, torch_threads)
        self.optimizer = _make_adam(self.model, hp.lr)
        self.ent_coef_t = torch.tensor(float(hp.ent_coef), device=self.device)  # reloadable
        opt = self.optimizer
        # a recurrent policy's update data changes shape with its chunk count every batch (a
        # capture per update would cost more than it saves): its steps run eagerly
        self.stepper = make_stepper(self.device, lambda data, idx: self._sgd_step(data, idx),
                                    [opt.flat, opt.grad, opt.m, opt.v, opt.step_t],
                                    graphs and not spec.state_size, "ppo")
        self.normalizers = ({n.key: ObsNormalizer(math.prod(n.shape)) for n in spec.normalizers()}
                            if hp.normalize_observations else {})
        self.updates = 0
        self.trained_steps = 0
        self._rng = np.random.default_rng((seed, 1))  # minibatch shuffling

    # ----------------------------------------------------------------- training
    def update(self, batch: dict[str, np.ndarray],
               on_step: Callable[[], None] = _no_progress) -> dict[str, Any]:
        """Run PPO epochs of minibatch SGD on one batch, then fold its observations into the
        normaliser; return mean stats over the steps. Called by the learner process once per
        train batch; `on_step()` after every minibatch step (the process heart-beats from it,
        so an update is never silent for longer than one minibatch step).

        `batch` holds numpy arrays (see ``batch_schema.COLUMNS``): obs (leaf key -> [N, ...]), actions
        [N] or [N, A], logp, advantages (already normalised), value_targets, values, each [N].
        Minibatches follow ``minibatch``'s static-shape rule. A recurrent policy's batch also
        holds its chunks (``batch_schema.SEQUENCE_COLUMNS``): its minibatches are sets of
        whole chunks, trained by truncated BPTT with padding masked (``bptt``). Stops after the epoch whose mean
        approx_kl exceeds hp.target_kl (0 = never); at least one epoch always runs. The device
        is read once per epoch for target_kl and once at the end, never inside an epoch.
        Raises ValueError on missing keys, wrong shapes or non-finite data (the model and
        normaliser are then untouched). In a job, see ``job_core.JobRankLearner.update``.
        """
        start = time.perf_counter()
        data = self._to_tensors(batch)
        backup = self.model.flat_weights()
        n_rows = data["actions"].shape[0]
        plan = update_plan(self._rng, *self._plan_units(data), self.hp.num_epochs)
        run = self.stepper.bind(data, plan.shape[-1])
        sums, steps, epochs = self._epochs(run, self._tensor(plan), on_step)
        if not np.all(np.isfinite(self.model.flat_weights())):
            self._restore(backup)
            raise ValueError("the update produced non-finite weights; batch rejected")
        self._fold_into_normalizers(self._obs_columns(batch[OBS]))
        self.updates += 1
        self.trained_steps += n_rows
        stats = _mean_stats(sums.tolist(), steps)  # the update's one read of its diagnostics
        stats["explained_variance"] = explained_variance(batch["values"], batch["value_targets"])
        stats.update(epochs=float(epochs), n_rows=float(n_rows))
        stats["update_time_s"] = time.perf_counter() - start
        return stats

    def _epochs(self, run: Callable[[torch.Tensor], torch.Tensor], plan: torch.Tensor,
                on_step: Callable[[], None], job_steps: int = 0) -> tuple[torch.Tensor, int, int]:
        """Up to hp.num_epochs passes over `plan` [E, K, b], `run(idx)` a step (eager or a
        graph replay); (device sums [_STEP_SLOTS] of the steps' diagnostics, steps run,
        epochs run). In a job each epoch is `job_steps` >= K steps, the last ones idle."""
        sums = torch.zeros(_STEP_SLOTS, device=self.device)
        steps = epochs = 0
        for epoch_plan in plan:
            epochs += 1
            kl_before = sums[_KL].clone()
            per_epoch = job_steps or len(epoch_plan)
            for k in range(per_epoch):
                sums += run(epoch_plan[k]) if k < len(epoch_plan) else self._idle_step()
                on_step()
            steps += per_epoch
            if self._kl_exceeded(float(sums[_KL] - kl_before) / per_epoch
                                 if self.hp.target_kl else 0.0):
                break
        return sums, steps, epochs

    def _plan_units(self, data: dict[str, Any]) -> tuple[int, int]:
        """(units, units per minibatch): rows and minibatch_size, or for a recurrent policy
        chunks and as many whole chunks as minibatch_size rows hold."""
        units = data[bptt.SEQ]["rows"].shape[0] if bptt.SEQ in data else data["actions"].shape[0]
        return units, self._units_per_minibatch()

    def _units_per_minibatch(self) -> int:
        if self.spec.state_size:
            return bptt.chunks_per_minibatch(self.hp.minibatch_size, self.spec.max_seq_len)
        return self.hp.minibatch_size

    def _restore(self, flat: np.ndarray) -> None:
        """Back to the weights before a failed update, with fresh optimizer moments."""
        self.model.load_flat(flat)
        for moment in (self.optimizer.m, self.optimizer.v):
            moment.zero_()

    def _kl_exceeded(self, epoch_kl: float) -> bool:
        target_kl = self.hp.target_kl
        return bool(target_kl) and epoch_kl > target_kl  # 0: never stop early

    def _sgd_step(self, data: dict[str, Any], idx: torch.Tensor) -> torch.Tensor:
        """One clipped Adam step on the rows (or a recurrent policy's chunks) `idx` [b]; its
        diagnostics [_STEP_SLOTS] (STAT_NAMES, grad norm when applied, 1 when applied). A
        non-finite loss or gradient skips the step on the device (no read back): extreme data
        must not poison the model."""
        loss, stats, rows = self._minibatch_loss(data, idx)
        self.optimizer.zero_grad()
        loss.backward()
        return self._apply_step(stats, torch.isfinite(loss.detach()), rows)

    def _idle_step(self) -> torch.Tensor:
        """A job's step this rank has no minibatch for: no rows, no gradient of its own."""
        self.optimizer.zero_grad()
        stats = torch.zeros(len(STAT_NAMES), device=self.device)
        return self._apply_step(stats, torch.ones((), device=self.device), 0)

    def _apply_step(self, stats: torch.Tensor, finite: torch.Tensor,
                    rows: int | torch.Tensor) -> torch.Tensor:
        """Clip and apply the gradient (in a job, first averaged across the ranks by one
        all-reduce weighted by the `rows` the loss is a mean over, which also averages
        `stats` [S]); the step's diagnostics."""
        gate = finite.float()
        if self.job is not None:
            gate = self.job.average(self.optimizer.grad, stats, rows, finite)
        norm, clip_gate = self.optimizer.clip_grad_norm_(self.hp.max_grad_norm)
        gate = clip_gate * gate
        self.optimizer.step(gate)
        applied_norm = torch.where(gate > 0, norm, 0.0)
        return torch.cat([stats, applied_norm.reshape(1), gate.reshape(1)])

    def _minibatch_loss(self, data: dict[str, Any], idx: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, int | torch.Tensor]:
        """The PPO loss on the rows (or chunks) `idx` [b], its diagnostics [len(STAT_NAMES)]
        and the rows it is a mean over (a recurrent policy's: the real steps of its chunks,
        padding not counted; a 0-dim device tensor, not read back)."""
        mb, (new_logp, entropy, new_values), mask = self._minibatch(data, idx)  # [B] each
        hp = self.hp
        loss, stats = ppo_loss_terms(new_logp, mb["logp"], mb["advantages"], new_values,
                                     mb["value_targets"], entropy, clip_coef=hp.clip_coef,
                                     vf_coef=hp.vf_coef, ent_coef=self.ent_coef_t,
                                     old_values=mb["values"],
                                     vf_clip=hp.clip_coef if hp.clip_vloss else None, mask=mask)
        return loss, stats, (len(idx) if mask is None else mask.sum())

    def _minibatch(self, data: dict[str, Any], idx: torch.Tensor
                   ) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, ...], torch.Tensor | None]:
        """(per-row columns [B], (log-prob, entropy, value) [B] under the current weights,
        padding mask [B] or None): B = b rows, or L*b steps of b chunks (BPTT)."""
        if bptt.SEQ in data:
            mb, obs, chunk = bptt.gather(data, idx, OBS)
            return mb, bptt.evaluate_sequences(self.model, obs, chunk, mb["actions"]), chunk["mask"]
        mb = {k: v[idx] for k, v in data.items() if k != OBS}
        obs = {k: v[idx] for k, v in data[OBS].items()}
        return mb, self.model.evaluate(obs, mb["actions"]), None

    def _to_tensors(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Validate and move the whole batch to the device once (observation leaves in
        their record dtypes: a uint8 image crosses to the GPU as uint8)."""
        missing = [k for k in COLUMN_NAMES if k not in batch]
        if missing:
            raise ValueError(f"batch is missing {missing}")
        obs = self._observations(batch[OBS])
        n = len(next(iter(obs.values())))
        arrays = {"actions": self._actions(batch, n)}
        for key in PER_ROW_COLUMNS:
            arrays[key] = np.asarray(batch[key], np.float32)
            if arrays[key].shape != (n,):
                raise ValueError(f"{key} has shape {arrays[key].shape}, expected ({n},)")
            if not np.isfinite(arrays[key]).all():
                raise ValueError(f"batch[{key!r}] contains NaN or inf")
        tensors: dict[str, Any] = {k: self._tensor(v) for k, v in arrays.items()}
        tensors[OBS] = {k: self._tensor(v) for k, v in obs.items()}
        if self.spec.state_size:
            tensors[bptt.SEQ] = {k: self._tensor(v) for k, v in
                                 bptt.sequence_arrays(batch, self.spec, n).items()}
        return tensors

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return to_device(array, self.device)

    def _obs_columns(self, obs: Any) -> dict[str, np.ndarray]:
        """batch["obs"] as leaf columns: a dict, or a bare array for a root-leaf space."""
        if isinstance(obs, dict):
            return obs
        if isinstance(obs, np.ndarray) and self.spec.obs_space.leaves()[0].key == "":
            return {"": obs}
        raise ValueError("batch['obs'] must map leaf keys to arrays")

    def _observations(self, obs: Any) -> dict[str, np.ndarray]:
        """Every observation leaf [N>0, *record_shape] in its record dtype, rows agreeing,
        values inside the space (the connector and collector validated them: a failure
        here is a bug upstream, refused rather than trained on)."""
        obs = self._obs_columns(obs)
        out, rows = {}, set()
        for leaf in self.spec.obs_space.leaves():
            values = np.asarray(obs.get(leaf.key, np.empty(0)))
            error = (values.ndim == 0 or values.shape[1:] != leaf.space.record_shape
                     or values.dtype != leaf.space.record_dtype)
            if error or leaf.space.check(values, leaf.display("obs")):
                raise ValueError(f"{leaf.display('batch obs')}: {values.dtype} "
                                 f"{list(values.shape)} does not fit the observation space")
            out[leaf.key] = values
            rows.add(len(values))
        if len(rows) != 1 or 0 in rows:
            raise ValueError(f"observation leaves have row counts {sorted(rows)}, expected one N > 0")
        return out

    def _actions(self, batch: dict[str, Any], n: int) -> np.ndarray:
        """float32 [N, action_size] action vectors, each leaf's part valid."""
        space = self.spec.act_space
        actions = np.asarray(batch["actions"], np.float32)
        if actions.size != n * space.action_size:
            raise ValueError(f"actions have shape {actions.shape}, expected ({n}, {space.action_size})")
        actions = actions.reshape(n, space.action_size)
        error = check_action_vector(actions, space, "batch actions")
        if error:
            raise ValueError(error)
        return actions

    # ----------------------------------------------------------------- weights and knobs
    def flat_weights(self) -> np.ndarray:
        """Current weights, float32, in `spec.param_layout()` order (a copy)."""
        return self.model.flat_weights()

    def live_hparams(self) -> dict[str, float]:
        """The hyperparameters a reload may change, as trained with from the next minibatch."""
        return {"lr": float(self.hp.lr), "ent_coef": float(self.hp.ent_coef)}

    def set_hparams(self, lr: float | None = None, ent_coef: float | None = None) -> None:
        """Change the learning rate and/or entropy coefficient from the next minibatch on.
        ValueError (nothing changed) on a negative or non-finite value."""
        changes = {name: float(value) for name, value in (("lr", lr), ("ent_coef", ent_coef))
                   if value is not None}
        for name, value in changes.items():
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value!r}")
        self.hp = dataclasses.replace(self.hp, lr=changes.get("lr", self.hp.lr),
                                      ent_coef=changes.get("ent_coef", self.hp.ent_coef))
        self._apply_lr()
        self.ent_coef_t.fill_(float(self.hp.ent_coef))  # copied in: the step is not rebuilt

    def _apply_lr(self) -> None:
        self.optimizer.param_groups[0]["lr"] = float(self.hp.lr)  # (copied into its lr_t)

    def _fold_into_normalizers(self, obs: dict[str, np.ndarray]) -> None:
        """Fold each normalised leaf's values [N, ...] into its running statistics and copy
        them into the model (no-op when normalize_observations is off). Called by `update`,
        AFTER its SGD steps: the batch's logp and values were computed with the published
        weights, whose normaliser buffers are part of them; training under those same
        buffers makes the PPO ratio exactly 1 at the first minibatch and clips the value loss
        around the baseline the values really came from. Moving the normaliser first would
        make every batch look off-policy by the normaliser's shift. The new statistics then
        ship with the weights published after this update, so the next batch is consistent."""
        for key, normalizer in sorted(self.normalizers.items()):  # (a job's ranks: one order)
            x = np.asarray(obs[key], np.float64).reshape(len(obs[key]), normalizer.size)
            if self.job is None:
                normalizer.update(x)
            else:
                normalizer.fold(*self.job.merge_moments(torch.from_numpy(x)))
            self.model.set_normalizer(key, normalizer.mean, normalizer.std)

    # ----------------------------------------------------------------- checkpointing
    def adopt_weights(self, flat: np.ndarray) -> None:
        """Weights published after the state this learner resumed (a restarted learner takes
        the board's newer ones): the model loads them, and each running normaliser that has
        seen data re-bases on the published statistics, so the next batch folds into them and
        not into the older checkpoint's (``ObsNormalizer.rebase``)."""
        self.model.load_flat(flat)
        for key, normalizer in self.normalizers.items():
            if normalizer.count:
                normalizer.rebase(*self.model.normalizer_stats(key))

    def state_dict(self) -> dict:
        """Everything an exact resume needs, as types torch.load(weights_only=True) accepts;
        tensors are CPU copies, independent of later training."""
        return {
            "format_version": STATE_FORMAT_VERSION,
            "model": _cpu_clone(self.model.state_dict()),
            "optimizer": _cpu_clone(self.optimizer.state_dict()),
            "normalizers": {k: n.state_dict() for k, n in self.normalizers.items()},
            "ent_coef": self.hp.ent_coef,  # informational: `load_state_dict` keeps its own
            "updates": self.updates,
            "trained_steps": self.trained_steps,
            "rng": self._rng_state(),
        }

    def load_state_dict(self, d: dict) -> dict[str, float]:
        """Restore the STATE of a `state_dict()`: weights, optimizer moments and step count,
        normaliser statistics, update counters and the RNGs. The HYPERPARAMETERS stay this
        learner's (the config's): the saved lr and ent_coef are returned, not applied, so the
        caller can log what the config overrode. Normaliser statistics load only when
        normalisation is on here and in `d`; the model buffers always carry the saved
        mean/std. Raises ValueError on an unknown format (then nothing is changed)."""
        if d.get("format_version") != STATE_FORMAT_VERSION:
            raise ValueError(f"unsupported learner state format {d.get('format_version')!r}")
        self.model.load_state_dict(d["model"])
        self.optimizer.load_state_dict(d["optimizer"])
        self._apply_lr()
        for key, state in d["normalizers"].items():
            if key in self.normalizers:
                self.normalizers[key].load_state_dict(state)
        self.updates, self.trained_steps = int(d["updates"]), int(d["trained_steps"])
        self._set_rng_state(d["rng"])
        return {"lr": float(d["optimizer"]["param_groups"][0]["lr"]),
                "ent_coef": float(d["ent_coef"])}

    def _rng_state(self) -> dict:
        version, internal, gauss_next = random.getstate()
        state = {"torch": torch.get_rng_state(), "numpy": self._rng.bit_generator.state,
                 "python": [version, list(internal), gauss_next]}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def _set_rng_state(self, state: dict) -> None:
        torch.set_rng_state(state["torch"])
        self._rng.bit_generator.state = state["numpy"]
        version, internal, gauss_next = state["python"]
        random.setstate((version, tuple(internal), gauss_next))
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
