"""daemon.prom: a status report (built by the real StatusBuilder) as Prometheus families,
exposed in the text format and read back with prometheus_client's own parser."""
from __future__ import annotations

import re
import time
from types import SimpleNamespace

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from rlinkd.client_lib.protocol.spaces import Box, Discrete
from rlinkd.daemon.collector.ingest import Spaces
from rlinkd.daemon import messages as m
from rlinkd.daemon import prom
from rlinkd.daemon.collector.core import CollectorCore, single_policy, protocol_error_kinds
from rlinkd.daemon.collector.latency import MESSAGE_BOUNDS_S, Histogram, HistogramSet
from rlinkd.daemon.collector.status import StatusBuilder
from rlinkd.daemon.config import load_config
from rlinkd.shm.records import StepLayout
from rlinkd.shm.slots import FREE, READY, TRAINING
from tests.helpers import REPO

CHILDREN = {"learner": m.ChildInfo(pid=11, restarts=2, alive=True, last_exit=-9),
            "collector": m.ChildInfo(pid=12, restarts=0, alive=True, last_exit=None),
            "connector": m.ChildInfo(pid=None, restarts=1, alive=False, last_exit=1),
            "checkpointer": m.ChildInfo(pid=14, restarts=0, alive=True, last_exit=None)}


def daemon_info() -> m.DaemonInfo:
    cfg = load_config(resolve_dirs=False)
    return m.DaemonInfo(
        daemon_pid=10, state="running", children=CHILDREN,
        last_checkpoint=m.CheckpointInfo("/s/checkpoints/ckpt-000003", 7, time.time() - 30),
        checkpoints_written=3, checkpoints_failed=1, last_checkpoint_failure=None,
        signal_checkpoint_request=0, undelivered_messages=0, reload_generation=1,
        last_reload=m.ReloadResult(1, True, 1_700_000_000.0, {"ppo.lr": 0.001}, (), ""),
        state_dir="/s", config={"ppo.lr": 0.001, "daemon.log_level": "info",
                                "checkpoint.keep_checkpoints": cfg.checkpoint.keep_checkpoints},
        metrics_url="http://127.0.0.1:9464/metrics")


def status_report() -> dict:
    """A report as the collector builds it, after traffic, two updates and some errors."""
    cfg = load_config(resolve_dirs=False)
    core = CollectorCore(cfg, single_policy(Spaces(Box([2], low=-1.0, high=1.0), Discrete(2), 2),
                                            StepLayout.flat(2, 1, 2)))
    ring = SimpleNamespace(capacity=1024, free_records=lambda: 1000)
    topo = SimpleNamespace(cfg=cfg, started_at=time.time() - 5)
    builder = StatusBuilder(topo, core, {"default": SimpleNamespace(seq_no=2)},
                            routes={"default": SimpleNamespace(ring=ring)})
    core.env_steps, core.stats.episodes = 5000, 40
    for kind in ("bad_header", "invalid_episode", "invalid_episode"):
        core.count_protocol_error(kind)
    for seconds in (0.0003, 0.001, 0.2):  # bucket edges are inclusive: 0.001 is in le=0.001
        builder.message_latency.observe("EPISODES_AND_GET_STATE", seconds)
    builder.message_latency.observe("PING", 50.0)  # above every bound: +Inf only
    state = m.LearnerState(lr=0.001, ent_coef=0.0, updates=2, trained_steps=1024,
                           rejected_batches=0, device="cuda:0", device_choice="measured",
                           device_step_s={"cpu": 0.004, "cuda:0": 0.001},
                           cluster=m.ClusterState(2, 1, (0, 1), 3, 0.02, (512, 0), "ab12"))
    stats = {"loss": 0.5, "policy_loss": -0.01, "value_loss": 1.2, "entropy": 0.69,
             "approx_kl": 0.004, "clip_frac": 0.1, "grad_norm": 0.4,
             "explained_variance": float("nan"), "epochs": 10, "n_rows": 512,
             "update_time_s": 0.3}
    for seq in (1, 2):
        builder.on_learner(m.WeightsPublished(seq, 100 * seq, state, m.train_stats(stats, 1, 0.5)))
    builder.on_connector(m.ConnectorStats(0, 0, 2, 17, 1024, (FREE, READY, TRAINING)))
    builder.on_daemon_info(daemon_info())
    return builder.build(port=5555)


SAMPLES = {"supervisor": prom.ProcessSample(1.5, 80_000_000),
           "learner": prom.ProcessSample(42.0, 400_000_000)}


class Fixed:
    """A registry collector answering with one scrape's families."""

    def __init__(self, scrape: prom.Scrape) -> None:
        self.scrape = scrape

    def collect(self):
        return prom.families(self.scrape)


def exposed(scrape: prom.Scrape) -> dict:
    """The scrape served in the text format and parsed back: {family name: family}."""
    registry = CollectorRegistry()
    registry.register(Fixed(scrape))
    text = generate_latest(registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(families: dict, sample_name: str, **labels: str) -> float:
    family_name = re.sub(r"_(total|bucket|count|sum)$", "", sample_name)
    for family in (families.get(family_name), families.get(sample_name)):
        for sample in (family.samples if family else []):
            if sample.name == sample_name and sample.labels == labels:
                return sample.value
    raise KeyError(f"{sample_name}{labels} not exposed")


@pytest.fixture(scope="module")
def full():
    return exposed(prom.Scrape(status_report(), collector_up=True, version="9.9",
                               processes=SAMPLES))


def test_counters_are_counters_named_total_with_the_reports_values(full):
    assert full["rlinkd_env_steps"].type == "counter"
    assert value(full, "rlinkd_env_steps_total") == 5000
    assert value(full, "rlinkd_episodes_total") == 40
    assert value(full, "rlinkd_learner_updates_total") == 2
    assert value(full, "rlinkd_train_batches_total") == 2
    assert value(full, "rlinkd_checkpoints_written_total") == 3
    assert value(full, "rlinkd_checkpoints_failed_total") == 1
    assert value(full, "rlinkd_role_restarts_total", role="learner") == 2
    assert value(full, "rlinkd_role_cpu_seconds_total", role="learner") == 42.0


def test_gauges_carry_units_in_their_names(full):
    assert full["rlinkd_uptime_seconds"].type == "gauge"
    assert 4 <= value(full, "rlinkd_uptime_seconds") < 60
    assert value(full, "rlinkd_learner_last_update_seconds") == pytest.approx(0.3)
    assert value(full, "rlinkd_role_resident_memory_bytes", role="supervisor") == 80_000_000
    assert value(full, "rlinkd_last_checkpoint_age_seconds") == pytest.approx(30, abs=5)
    assert value(full, "rlinkd_weights_seq_no") == 2
    assert value(full, "rlinkd_connector_buffered_steps") == 17
    assert value(full, "rlinkd_learner_lr") == 0.001


def test_ring_and_slot_fill(full):
    assert value(full, "rlinkd_episode_ring_records") == 24
    assert value(full, "rlinkd_episode_ring_capacity_records") == 1024
    slots = {state: value(full, "rlinkd_batch_slots", state=state)
             for state in ("free", "filling", "ready", "training")}
    assert slots == {"free": 1, "filling": 0, "ready": 1, "training": 1}


def test_protocol_errors_by_kind_with_a_zero_series_for_every_known_kind(full):
    kinds = {s.labels["kind"]: s.value for s in full["rlinkd_protocol_errors"].samples}
    assert set(kinds) == set(protocol_error_kinds())
    assert kinds["invalid_episode"] == 2 and kinds["bad_header"] == 1
    assert sum(kinds.values()) == 3


def test_message_latency_is_a_cumulative_histogram_by_type(full):
    family = full["rlinkd_message_duration_seconds"]
    assert family.type == "histogram"
    buckets = {s.labels["le"]: s.value for s in family.samples
               if s.name.endswith("_bucket") and s.labels["type"] == "EPISODES_AND_GET_STATE"}
    assert buckets["0.0005"] == 1 and buckets["0.001"] == 2 and buckets["0.1"] == 2
    assert buckets["0.25"] == 3 and buckets["+Inf"] == 3
    assert len(buckets) == len(MESSAGE_BOUNDS_S) + 1
    assert value(full, "rlinkd_message_duration_seconds_count", type="EPISODES_AND_GET_STATE") == 3
    assert value(full, "rlinkd_message_duration_seconds_sum",
                 type="EPISODES_AND_GET_STATE") == pytest.approx(0.2013)
    assert value(full, "rlinkd_message_duration_seconds_bucket", type="PING", le="30.0") == 0
    assert value(full, "rlinkd_message_duration_seconds_bucket", type="PING", le="+Inf") == 1


def test_learner_update_time_is_a_histogram(full):
    assert full["rlinkd_learner_update_seconds"].type == "histogram"
    assert value(full, "rlinkd_learner_update_seconds_count") == 2
    assert value(full, "rlinkd_learner_update_seconds_bucket", le="0.25") == 0
    assert value(full, "rlinkd_learner_update_seconds_bucket", le="0.5") == 2


def test_missing_values_are_left_out_not_zero(full):
    assert "rlinkd_learner_explained_variance" not in full  # NaN in the update → None
    assert "rlinkd_role_last_exit_code" in full
    exits = {s.labels["role"]: s.value for s in full["rlinkd_role_last_exit_code"].samples}
    assert exits == {"learner": -9, "connector": 1}
    pids = {s.labels["role"] for s in full["rlinkd_role_pid"].samples}
    assert pids == {"learner", "collector", "checkpointer"}


def test_info_states_and_config(full):
    info = full["rlinkd_info"].samples[0].labels
    assert info["version"] == "9.9" and info["port"] == "5555" and info["log_level"] == "info"
    assert value(full, "rlinkd_state", state="running") == 1
    assert value(full, "rlinkd_state", state="stopping") == 0
    assert value(full, "rlinkd_config_value", key="ppo.lr") == 0.001
    assert value(full, "rlinkd_collector_up") == 1
    assert value(full, "rlinkd_last_reload_success") == 1


def test_collector_down_exports_the_supervisors_part_only():
    report = m.daemon_report(daemon_info())
    families = exposed(prom.Scrape(report, collector_up=False, processes=SAMPLES))
    assert value(families, "rlinkd_collector_up") == 0
    assert value(families, "rlinkd_role_restarts_total", role="connector") == 1
    assert value(families, "rlinkd_role_up", role="connector") == 0
    assert "rlinkd_env_steps" not in families and "rlinkd_message_duration_seconds" not in families


def test_every_name_follows_the_conventions_and_is_in_the_readme(full):
    page = (REPO / "docs" / "operations.md").read_text()
    start = page.index("## Prometheus metrics")
    end = page.find("\n## ", start + 1)
    section = page[start:end if end >= 0 else len(page)]
    for name, family in full.items():
        exposed_name = name + ("_total" if family.type == "counter" else "")
        assert re.fullmatch(r"rlinkd_[a-z0-9_]+", exposed_name), exposed_name
        assert not re.search(r"_(s|ms|secs|mb|kb)(_|$)", exposed_name), exposed_name
        assert f"`{exposed_name}`" in section, f"{exposed_name} is not listed in docs/operations.md"


def test_histogram_buckets_include_their_upper_bound():
    h = Histogram((0.1, 1.0))
    for x in (0.1, 0.1000001, 1.0, 7.0):
        h.observe(x)
    assert h.report() == {"counts": [1, 2, 1], "sum_s": pytest.approx(8.2000001)}
    assert prom.cumulative_buckets([0.1, 1.0], [1, 2, 1]) == [("0.1", 1), ("1.0", 3), ("+Inf", 4)]
    with pytest.raises(ValueError):
        Histogram((1.0, 0.5))
    hs = HistogramSet((1.0,))
    hs.observe("B", 2.0)
    hs.observe("A", 0.5)
    assert hs.report() == {"bounds_s": [1.0], "by_kind": {"A": {"counts": [1, 0], "sum_s": 0.5},
                                                          "B": {"counts": [0, 1], "sum_s": 2.0}}}


def test_every_policy_is_a_label_of_the_policy_families():
    report = {"policies": {"default": {"weights_seq_no": 7, "env_steps": 100, "episodes": 3,
                                       "episode_return_mean": 9.5, "learner": {"updates": 7}},
                           "opponent": {"weights_seq_no": 0, "env_steps": 50, "episodes": 1,
                                        "episode_return_mean": None, "learner": {}}}}
    families = {f.name: f for f in prom._policies(report)}
    seq = {s.labels["policy"]: s.value for s in families["rlinkd_policy_weights_seq_no"].samples}
    assert seq == {"default": 7, "opponent": 0}
    returns = families["rlinkd_policy_episode_return_mean"].samples
    assert [(s.labels["policy"], s.value) for s in returns] == [("default", 9.5)]  # None: absent
    assert prom._policies({}) == []


def test_the_learner_device_and_its_timings_are_labelled_by_policy(full):
    chosen = full["rlinkd_learner_device"].samples
    assert [(s.labels, s.value) for s in chosen] == [
        ({"policy": "default", "device": "cuda:0", "choice": "measured"}, 1)]
    steps = {s.labels["device"]: s.value for s in full["rlinkd_learner_sgd_step_seconds"].samples}
    assert steps == {"cpu": 0.004, "cuda:0": 0.001}
    untimed = {"policies": {"default": {"learner": {"device": "cpu", "device_choice": "only_cpu",
                                                    "device_step_s": {}}}}}
    assert [f.name for f in prom._learner_devices(untimed)] == ["rlinkd_learner_device"]


def test_the_cluster_is_exported_for_a_rank_of_a_job(full):
    assert value(full, "rlinkd_cluster_world_size") == 2 and value(full, "rlinkd_cluster_rank") == 1
    assert value(full, "rlinkd_cluster_members") == 2 and value(full, "rlinkd_cluster_generation") == 3
    assert value(full, "rlinkd_cluster_collective_seconds") == 0.02
    rows = {s.labels["rank"]: s.value for s in full["rlinkd_cluster_update_rows"].samples}
    assert rows == {"0": 512, "1": 0}
    assert prom._cluster({"learner": {"cluster": None}}) == []  # a daemon alone: absent
