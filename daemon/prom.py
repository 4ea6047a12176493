"""Prometheus metric families from one scrape's data: the status report and process samples.

Pure: ``families(scrape)`` turns a ``Scrape`` (the dict ``rlinkd status --json`` prints,
plus each role's CPU time and RSS, sampled by the supervisor) into ``prometheus_client``
metric families. The process shell,
``daemon.prom_server``, gathers a ``Scrape`` per HTTP request and serves the families.

Names follow the Prometheus conventions: prefix ``rlinkd_``, base units in the name
(``_seconds``, ``_bytes``), counters end in ``_total`` (``prometheus_client`` appends it
to the family name). A value the report lacks (no update yet, collector unreachable) is
left out rather than exported as 0. Plain numbers are declared once, in ``COUNTERS`` and
``GAUGES`` (exported name → path in the report); the labelled families follow below them.
``docs/operations.md`` ("Prometheus metrics") lists every family (a unit test checks the list).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily, InfoMetricFamily, Metric)

TRANSPORTS = ("tcp", "unix", "shm")


@dataclass(frozen=True)
class ProcessSample:
    """One process's CPU time (user + system) and resident set size, taken at scrape time."""

    cpu_s: float
    rss_bytes: int


@dataclass(frozen=True)
class Scrape:
    """Everything one scrape exports. ``report`` is the collector's status report when it
    answered (``collector_up``), else the supervisor's own part of it (``daemon_report``)."""

    report: Mapping[str, Any]
    collector_up: bool
    version: str = "unknown"
    processes: Mapping[str, ProcessSample] = field(default_factory=dict)


Path = tuple[str, ...]

COUNTERS: dict[str, tuple[Path, str]] = {
    "rlinkd_env_steps_total": (("env_steps",), "Env steps ingested from all clients."),
    "rlinkd_episodes_total": (("episodes",), "Episodes finished by all clients."),
    "rlinkd_dropped_episodes_total": (("connector", "dropped_episodes"),
                                      "Episodes the connector dropped (too old for off-policy)."),
    "rlinkd_dropped_steps_total": (("connector", "dropped_steps"),
                                   "Env steps the connector dropped with those episodes."),
    "rlinkd_train_batches_total": (("connector", "batches"), "Train batches the connector built."),
    "rlinkd_learner_updates_total": (("learner", "updates"), "PPO updates the learner made."),
    "rlinkd_learner_trained_steps_total": (("learner", "trained_steps"),
                                           "Env steps the learner trained on."),
    "rlinkd_learner_rejected_batches_total": (("learner", "rejected_batches"),
                                              "Batches rejected (the update was not finite)."),
    "rlinkd_paced_samples_total": (("paced_samples",), "Samples whose client waited for its "
                                   "learner (pacing: `max_lead_steps`)."),
    "rlinkd_checkpoints_written_total": (("checkpoints_written",), "Checkpoints written."),
    "rlinkd_checkpoints_failed_total": (("checkpoints_failed",),
                                        "Checkpoint requests that failed (see the log's reason)."),
    "rlinkd_undelivered_messages_total": (("undelivered_messages",),
                                          "Supervisor messages dropped at a full inbox."),
    "rlinkd_reloads_total": (("reload_generation",), "SIGHUP reloads attempted."),
}

GAUGES: dict[str, tuple[Path, str]] = {
    "rlinkd_uptime_seconds": (("uptime_s",), "Seconds since the daemon started."),
    "rlinkd_env_steps_per_second": (("env_steps_per_s",), "Env steps ingested per second "
                                    "(last 10 s)."),
    "rlinkd_weights_seq_no": (("weights_seq_no",), "Version of the weights being served."),
    "rlinkd_clients": (("clients",), "Connected sampling clients."),
    "rlinkd_connections": (("connections",), "Open connections (TCP and Unix socket; the "
                           "scrape's own STATUS connection included)."),
    "rlinkd_waiting_clients": (("waiting_clients",), "On-policy clients waiting for weights."),
    "rlinkd_agents": (("agents",), "Agents of TCP connections with an episode in progress."),
    "rlinkd_episode_return_mean": (("episode_return_mean",), "Mean return of the last 100 "
                                   "episodes."),
    "rlinkd_episode_return_mean_20": (("episode_return_mean_20",), "Mean return of the last "
                                      "20 episodes."),
    "rlinkd_episode_length_mean": (("episode_len_mean",), "Mean length (env steps) of the last "
                                   "100 episodes."),
    "rlinkd_connector_buffered_steps": (("connector", "buffered_steps"),
                                        "Env steps the connector holds for the next batch."),
    "rlinkd_episode_ring_records": (("episode_ring", "records"), "Step records waiting in the "
                                    "collector→connector ring."),
    "rlinkd_episode_ring_capacity_records": (("episode_ring", "capacity"), "Capacity of that "
                                             "ring."),
    "rlinkd_learner_loss": (("learner", "loss"), "Total loss of the last update."),
    "rlinkd_learner_policy_loss": (("learner", "policy_loss"), "Policy loss of the last update."),
    "rlinkd_learner_value_loss": (("learner", "value_loss"), "Value loss of the last update."),
    "rlinkd_learner_entropy": (("learner", "entropy"), "Policy entropy in the last update."),
    "rlinkd_learner_approx_kl": (("learner", "approx_kl"), "Approximate KL of the last update."),
    "rlinkd_learner_clip_fraction": (("learner", "clip_frac"),
                                     "Fraction of clipped ratios in the last update."),
    "rlinkd_learner_grad_norm": (("learner", "grad_norm"), "Gradient norm in the last update."),
    "rlinkd_learner_explained_variance": (("learner", "explained_variance"),
                                          "Explained variance of the value function."),
    "rlinkd_learner_epochs": (("learner", "epochs"), "SGD epochs run in the last update."),
    "rlinkd_learner_batch_rows": (("learner", "n_rows"), "Rows of the last train batch."),
    "rlinkd_learner_last_update_seconds": (("learner", "update_time_s"),
                                           "Duration of the last update."),
    "rlinkd_learner_policy_lag_max": (("learner", "policy_lag_max"), "Largest policy lag "
                                      "(weights versions) in the last batch."),
    "rlinkd_learner_policy_lag_mean": (("learner", "policy_lag_mean"),
                                       "Mean policy lag in the last batch."),
    "rlinkd_learner_lr": (("learner", "lr"), "Learning rate in force."),
    "rlinkd_learner_ent_coef": (("learner", "ent_coef"), "Entropy coefficient in force."),
    "rlinkd_last_checkpoint_timestamp_seconds": (("last_checkpoint", "created_at"),
                                                 "Unix time the newest checkpoint was written."),
    "rlinkd_last_checkpoint_age_seconds": (("last_checkpoint", "age_s"),
                                           "Age of the newest checkpoint."),
    "rlinkd_last_checkpoint_weights_seq_no": (("last_checkpoint", "weights_seq_no"),
                                              "Weights version in the newest checkpoint."),
    "rlinkd_last_reload_success": (("last_reload", "ok"), "1 when the last reload was applied."),
    "rlinkd_last_reload_timestamp_seconds": (("last_reload", "at"), "Unix time of the last "
                                             "reload."),
}


def families(scrape: Scrape) -> list[Metric]:
    """Every metric family of one scrape, in a stable order (called per HTTP request)."""
    report = scrape.report
    out: list[Metric] = [_info(scrape),
                         GaugeMetricFamily("rlinkd_collector_up", "1 when the collector "
                                           "answered this scrape's STATUS.",
                                           value=int(scrape.collector_up))]
    out += _plain(report)
    for build in (_state, _protocol_errors, _clients, _slots, _children, _config, _latency,
                  _policies, _learner_devices, _cluster):
        out += build(report)
    out += _processes(scrape.processes)
    return out


def lookup(report: Mapping[str, Any], path: Path) -> float | None:
    """The number at ``path`` in the report (a bool as 0/1), None when absent or not a number."""
    value: Any = report
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    if isinstance(value, bool):
        return float(value)
    return float(value) if isinstance(value, (int, float)) else None


def _plain(report: Mapping[str, Any]) -> list[Metric]:
    out: list[Metric] = []
    for name, (path, doc) in COUNTERS.items():
        if (value := lookup(report, path)) is not None:
            out.append(CounterMetricFamily(name.removesuffix("_total"), doc, value=value))
    for name, (path, doc) in GAUGES.items():
        if (value := lookup(report, path)) is not None:
            out.append(GaugeMetricFamily(name, doc, value=value))
    return out


def _info(scrape: Scrape) -> Metric:
    r = scrape.report
    labels = {"version": scrape.version, "host": str(r.get("host", "")),
              "port": str(r.get("port", "")), "unix_socket": str(r.get("unix_socket", "")),
              "state_dir": str(r.get("state_dir", "")), "daemon_pid": str(r.get("daemon_pid", "")),
              "log_level": str(r.get("config", {}).get("daemon.log_level", ""))}
    return InfoMetricFamily("rlinkd", "The daemon's addresses and version.", value=labels)


def _state(report: Mapping[str, Any]) -> list[Metric]:
    if "state" not in report:
        return []
    family = GaugeMetricFamily("rlinkd_state", "1 for the daemon's current state.",
                               labels=["state"])
    for state in ("running", "stopping"):
        family.add_metric([state], int(report["state"] == state))
    return [family]


def _protocol_errors(report: Mapping[str, Any]) -> list[Metric]:
    by_kind = report.get("protocol_errors_by_kind")
    if not by_kind:
        return []
    family = CounterMetricFamily("rlinkd_protocol_errors", "Connections closed for bad input, "
                                 "by kind of error.", labels=["kind"])
    for kind, count in by_kind.items():
        family.add_metric([kind], count)
    return [family]


def _clients(report: Mapping[str, Any]) -> list[Metric]:
    if "sessions" not in report:
        return []
    counts = dict.fromkeys(TRANSPORTS, 0)
    for session in report["sessions"]:
        transport = "shm" if session.get("shm") else session.get("transport", "")
        counts[transport] = counts.get(transport, 0) + 1
    family = GaugeMetricFamily("rlinkd_clients_by_transport", "Connected sampling clients by "
                               "transport.", labels=["transport"])
    for transport, n in counts.items():
        family.add_metric([transport], n)
    return [family]


def _children(report: Mapping[str, Any]) -> list[Metric]:
    children = report.get("children")
    if not children:
        return []
    restarts = CounterMetricFamily("rlinkd_role_restarts", "Restarts of each role's process.",
                                   labels=["role"])
    up = GaugeMetricFamily("rlinkd_role_up", "1 while the role's process is alive.",
                           labels=["role"])
    pid = GaugeMetricFamily("rlinkd_role_pid", "Process id of the role.", labels=["role"])
    last_exit = GaugeMetricFamily("rlinkd_role_last_exit_code", "Exit code of the role's "
                                  "previous process (negative: killed by that signal).",
                                  labels=["role"])
    for role, child in children.items():
        restarts.add_metric([role], child["restarts"])
        up.add_metric([role], int(child["alive"]))
        for family, key in ((pid, "pid"), (last_exit, "last_exit")):
            if child.get(key) is not None:
                family.add_metric([role], child[key])
    return [family for family in (restarts, up, pid, last_exit) if family.samples]


def _config(report: Mapping[str, Any]) -> list[Metric]:
    config = report.get("config")
    if not config:
        return []
    family = GaugeMetricFamily("rlinkd_config_value", "Reloadable settings in force (numbers "
                               "only; `daemon.log_level` is a label of rlinkd_info).",
                               labels=["key"])
    for key, value in sorted(config.items()):
        if isinstance(value, (bool, int, float)):
            family.add_metric([key], float(value))
    return [family]


def _latency(report: Mapping[str, Any]) -> list[Metric]:
    latency = report.get("latency")
    if not latency:
        return []
    messages = latency["message_seconds"]
    family = HistogramMetricFamily("rlinkd_message_duration_seconds", "RLlink messages from "
                                   "the whole frame read to the reply written, by type (an "
                                   "on-policy EPISODES_AND_GET_STATE includes its wait for "
                                   "training).", labels=["type"])
    for kind, h in messages["by_kind"].items():
        family.add_metric([kind], cumulative_buckets(messages["bounds_s"], h["counts"]),
                          h["sum_s"])
    update = latency["learner_update_seconds"]
    learner = HistogramMetricFamily("rlinkd_learner_update_seconds", "Duration of each PPO "
                                    "update (since the collector started).")
    learner.add_metric([], cumulative_buckets(update["bounds_s"], update["counts"]),
                       update["sum_s"])
    return [family, learner]


def cumulative_buckets(bounds_s: list[float], counts: list[int]) -> list[tuple[str, float]]:
    """Per-bucket counts (the last one above every bound) as Prometheus' cumulative
    ``(le, count)`` pairs ending with ``+Inf``."""
    out, total = [], 0
    for le, count in zip([*map(repr, map(float, bounds_s)), "+Inf"], counts, strict=True):
        total += count
        out.append((le, float(total)))
    return out


def _processes(samples: Mapping[str, ProcessSample]) -> list[Metric]:
    if not samples:
        return []
    cpu = CounterMetricFamily("rlinkd_role_cpu_seconds", "CPU time (user + system) of each "
                              "role's current process.", labels=["role"])
    rss = GaugeMetricFamily("rlinkd_role_resident_memory_bytes", "Resident set size of each "
                            "role's process.", labels=["role"])
    for role, sample in samples.items():
        cpu.add_metric([role], sample.cpu_s)
        rss.add_metric([role], sample.rss_bytes)
    return [cpu, rss]



POLICY_GAUGES: dict[str, tuple[Path, str]] = {
    "rlinkd_policy_weights_seq_no": (("weights_seq_no",), "Weights version of each policy."),
    "rlinkd_policy_env_steps": (("env_steps",), "Env steps ingested for each policy."),
    "rlinkd_policy_episodes": (("episodes",), "Episodes completed by each policy's agents."),
    "rlinkd_policy_episode_return_mean": (("episode_return_mean",), "Mean return of each "
                                          "policy's last 100 episodes."),
    "rlinkd_policy_learner_updates": (("learner", "updates"), "Updates of each policy's learner."),
}
"""Labelled by ``policy`` (every policy, the default one included)."""


def _learner_devices(report: Mapping[str, Any]) -> list[Metric]:
    """Each policy's training device (``learner.device``; the choice: fixed, only_cpu,
    measured, cached) and, when ``auto`` timed them, the seconds per SGD step per device."""
    chosen = GaugeMetricFamily("rlinkd_learner_device", "1 for the device each policy trains "
                               "on, labelled with why (learner.device).",
                               labels=["policy", "device", "choice"])
    step = GaugeMetricFamily("rlinkd_learner_sgd_step_seconds", "Seconds per SGD step of each "
                             "policy's network as `learner.device = auto` timed it, per device.",
                             labels=["policy", "device"])
    for policy, section in (report.get("policies") or {}).items():
        learner = section.get("learner") or {}
        if learner.get("device"):
            chosen.add_metric([policy, learner["device"], learner.get("device_choice", "")], 1)
        for device, seconds in (learner.get("device_step_s") or {}).items():
            step.add_metric([policy, device], seconds)
    return [family for family in (chosen, step) if family.samples]


CLUSTER_GAUGES: dict[str, tuple[str, str]] = {
    "rlinkd_cluster_world_size": ("world_size", "Ranks of the training job ([cluster] "
                                  "world_size; absent for a daemon alone)."),
    "rlinkd_cluster_rank": ("rank", "This daemon's rank in the job."),
    "rlinkd_cluster_members": ("members", "Ranks in the job's process group now."),
    "rlinkd_cluster_generation": ("generation", "Process groups this learner has formed."),
    "rlinkd_cluster_collective_seconds": ("collective_time_s", "Seconds the last update "
                                          "spent in collectives (all-reduce, broadcast)."),
}


def _cluster(report: Mapping[str, Any]) -> list[Metric]:
    """The default policy's job (``learner.cluster`` of ``rlinkd status``), when in one; rows
    per rank of the last update labelled by ``rank``."""
    cluster = (report.get("learner") or {}).get("cluster")
    if not cluster:
        return []
    out: list[Metric] = []
    for name, (key, doc) in CLUSTER_GAUGES.items():
        value = cluster[key]
        out.append(GaugeMetricFamily(name, doc, value=len(value) if key == "members" else value))
    rows = GaugeMetricFamily("rlinkd_cluster_update_rows", "Rows each rank contributed to "
                             "the job's last update.", labels=["rank"])
    for rank, n in enumerate(cluster["rows_per_rank"]):
        rows.add_metric([str(rank)], n)
    return [*out, rows]


def _policies(report: Mapping[str, Any]) -> list[Metric]:
    policies = report.get("policies") or {}
    out: list[Metric] = []
    for name, (path, doc) in POLICY_GAUGES.items():
        family = GaugeMetricFamily(name, doc, labels=["policy"])
        for policy, section in policies.items():
            value = lookup(section, path)
            if value is not None:
                family.add_metric([policy], value)
        out.append(family)
    return out if policies else []


def _slots(report: Mapping[str, Any]) -> list[Metric]:
    slots = report.get("connector", {}).get("slots")
    if not slots:
        return []
    family = GaugeMetricFamily("rlinkd_batch_slots", "Train-batch slots by state (connector → "
                               "learner).", labels=["state"])
    for state, n in slots.items():
        family.add_metric([state], n)
    return [family]
