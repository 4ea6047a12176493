"""The Prometheus endpoint of a real daemon: scraped over HTTP, parsed with prometheus_client's
text parser, through training, bad input, a SIGHUP and a collector crash."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import REPO, BackgroundClient, raw_connect, wait_for

pytestmark = pytest.mark.process

METRICS_ON = ("--set", "metrics.listen=127.0.0.1:0")


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """One GET of ``url`` parsed: {(sample name, sorted labels): value}."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def sample(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_scrape_while_training_shows_status_processes_errors_and_latency(daemon_factory):
    d = daemon_factory(*METRICS_ON)
    url = d.info["metrics_url"]
    assert url.startswith("http://127.0.0.1:") and not url.endswith(":0/metrics")
    client = BackgroundClient(f"tcp://127.0.0.1:{d.port}").start()
    wait_for(lambda: d.status()["learner"].get("updates", 0) >= 2, 120, what="two updates")
    bad = raw_connect(d.port)
    bad.sendall(b"12ab5678{}")  # not an 8-digit header
    wait_for(lambda: d.status()["protocol_errors"] == 1, 30, what="the bad header counted")
    bad.close()
    samples = scrape(url)
    status = d.status()
    client.stop()

    assert sample(samples, "rlinkd_collector_up") == 1
    assert 0 < sample(samples, "rlinkd_env_steps_total") <= status["env_steps"]
    assert sample(samples, "rlinkd_learner_updates_total") >= 2
    assert sample(samples, "rlinkd_protocol_errors_total", kind="bad_header") == 1
    assert sample(samples, "rlinkd_protocol_errors_total", kind="invalid_episode") == 0
    assert status["protocol_errors_by_kind"]["bad_header"] == 1
    assert sample(samples, "rlinkd_message_duration_seconds_count", type="EPISODES_AND_GET_STATE") > 0
    assert sample(samples, "rlinkd_message_duration_seconds_count", type="PING") >= 1
    assert sample(samples, "rlinkd_learner_update_seconds_count") >= 2
    assert sample(samples, "rlinkd_learner_update_seconds_sum") > 0
    assert sample(samples, "rlinkd_episode_ring_capacity_records") > 0
    assert sum(sample(samples, "rlinkd_batch_slots", state=s)
               for s in ("free", "filling", "ready", "training")) == 2  # sampling.batch_slots
    for role, child in status["children"].items():
        assert sample(samples, "rlinkd_role_pid", role=role) == child["pid"]
        assert sample(samples, "rlinkd_role_restarts_total", role=role) == 0
    for role in ("supervisor", *status["children"]):
        assert sample(samples, "rlinkd_role_resident_memory_bytes", role=role) > 10_000_000
        assert sample(samples, "rlinkd_role_cpu_seconds_total", role=role) > 0
    assert status["metrics_url"] == url


def test_sighup_keeps_the_endpoint_and_a_collector_crash_does_not_stop_it(daemon_factory, tmp_path):
    config = tmp_path / "rlinkd.toml"
    config.write_text('[metrics]\nlisten = "127.0.0.1:0"\n')
    d = daemon_factory("--config", str(config))
    url = d.info["metrics_url"]
    config.write_text('[metrics]\nlisten = "127.0.0.1:9999"\n[ppo]\nlr = 0.0005\n')
    d.signal(signal.SIGHUP)
    status = wait_for(lambda: (s := d.status())["reload_generation"] == 1 and s, 30, what="reload")
    assert status["last_reload"]["needs_restart"] == ["metrics.listen"]
    samples = wait_for(lambda: (s := scrape(url)) and
                       sample(s, "rlinkd_config_value", key="ppo.lr") == 0.0005 and s, 30,
                       what="the reloaded lr on the same endpoint")
    assert sample(samples, "rlinkd_reloads_total") == 1
    assert sample(samples, "rlinkd_last_reload_success") == 1

    os.kill(status["children"]["collector"]["pid"], signal.SIGKILL)

    def restarted() -> bool:
        s = scrape(url)  # every scrape answers, during the restart too
        return (sample(s, "rlinkd_role_restarts_total", role="collector") == 1
                and sample(s, "rlinkd_collector_up") == 1)
    wait_for(restarted, 60, interval_s=0.05, what="the collector restarted, seen by a scrape")
    d.remember_children()


def test_a_taken_metrics_port_exits_78_with_one_line(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        proc = subprocess.Popen([sys.executable, "-m", "rlinkd.daemon.cli", "serve", "--port", "0",
                                 "--state-dir", str(tmp_path / "state"),
                                 "--set", f"metrics.listen=127.0.0.1:{port}"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=REPO, stdin=subprocess.DEVNULL)
        out, err = proc.communicate(timeout=120)
    finally:
        taken.close()
    assert proc.returncode == 78, out + err
    assert f"metrics.listen = '127.0.0.1:{port}': cannot bind" in err, err
    assert "Traceback" not in out + err
    assert not [p for p in os.listdir("/dev/shm") if p.startswith(f"rlinkd.{proc.pid}.")]
