"""Tier 1: the learner's device, fixed (checked against the host) or chosen by measurement
with injected timings (both outcomes, per policy, the cache)."""
from __future__ import annotations

import json
import math

import pytest

from rlinkd.daemon.config import load_config
from rlinkd.daemon.errors import ConfigError
from rlinkd.daemon.learner import device_choice as dc
from rlinkd.daemon.learner.placement import minibatch_of, place
from rlinkd.daemon.policies import policy_defs
from rlinkd.daemon.roles import BootError


def table(**step_s: float):
    """A timing function from a table; the calls it answered in ``calls``."""
    calls: list[str] = []

    def time_fn(device: str) -> float:
        calls.append(device)
        return step_s[device.replace(":", "")]
    time_fn.calls = calls  # type: ignore[attr-defined]
    return time_fn


def test_a_fixed_device_is_checked_against_the_host():
    assert dc.require_device("cpu", 0) == "cpu"
    assert dc.require_device("cuda", 1) == "cuda:0" and dc.require_device("cuda:1", 2) == "cuda:1"
    with pytest.raises(dc.DeviceUnavailable, match=r"^learner.device = 'cuda': this host has no CUDA"):
        dc.require_device("cuda", 0)
    with pytest.raises(dc.DeviceUnavailable, match=r"has 2 CUDA device\(s\), cuda:0 to cuda:1"):
        dc.require_device("cuda:2", 2)


def test_a_name_that_is_no_device_is_a_config_error():
    for name in ("gpu", "cuda:", "cuda:x", "CPU"):
        with pytest.raises(ConfigError, match=r"learner\.device"):
            load_config(None, [("learner", "device", name)], resolve_dirs=False)
    assert load_config(None, [("learner", "device", "cuda:3")], resolve_dirs=False)


def test_auto_without_cuda_is_the_cpu_untimed():
    time_fn = table(cpu=1.0)
    assert dc.choose(dc.candidates(0), time_fn) == dc.DeviceChoice("cpu", "only_cpu")
    assert time_fn.calls == []


@pytest.mark.parametrize("cpu_s, gpu_s, expected", [(0.001, 0.004, "cpu"), (0.01, 0.002, "cuda:1"),
                                                    (0.003, 0.003, "cpu")])
def test_auto_trains_on_the_faster_device(cpu_s, gpu_s, expected):
    time_fn = table(cpu=cpu_s, cuda0=0.5, cuda1=gpu_s)
    choice = dc.choose(dc.candidates(2), time_fn)
    assert (choice.device, choice.how) == (expected, "measured")
    assert choice.step_s == {"cpu": cpu_s, "cuda:0": 0.5, "cuda:1": gpu_s}


def test_a_measured_choice_is_cached_by_key(tmp_path):
    cache = dc.ChoiceCache(tmp_path / dc.CACHE_FILE)
    first = dc.choose(dc.candidates(1), table(cpu=0.01, cuda0=0.001), cache, "k1")
    again = table(cpu=0.001, cuda0=0.01)  # the host changed its mind: the cache still answers
    cached = dc.choose(dc.candidates(1), again, cache, "k1")
    assert (cached.device, cached.how, cached.step_s) == ("cuda:0", "cached", first.step_s)
    assert again.calls == []
    other = dc.choose(dc.candidates(1), again, cache, "k2")
    assert (other.device, other.how, again.calls) == ("cpu", "measured", ["cpu", "cuda:0"])
    assert set(json.loads(cache.path.read_text())) == {"k1", "k2"}


def test_a_cached_device_the_host_lacks_or_a_bad_file_is_measured_again(tmp_path):
    cache = dc.ChoiceCache(tmp_path / dc.CACHE_FILE)
    cache.put("k", dc.DeviceChoice("cuda:3", "measured", {"cpu": 1.0, "cuda:3": 0.1}))
    assert dc.choose(dc.candidates(1), table(cpu=1.0, cuda0=2.0), cache, "k").how == "measured"
    cache.path.write_text("{not json")
    assert dc.choose(dc.candidates(1), table(cpu=1.0, cuda0=2.0), cache, "k").device == "cpu"
    assert cache.get("k") == dc.DeviceChoice("cpu", "cached", {"cpu": 1.0, "cuda:0": 2.0})


def test_a_device_that_could_not_be_timed_loses_and_is_not_cached(tmp_path):
    cache = dc.ChoiceCache(tmp_path / dc.CACHE_FILE)
    choice = dc.choose(dc.candidates(1), table(cpu=0.5, cuda0=math.inf), cache, "k")
    assert choice.device == "cpu" and cache.get("k") is None


def test_a_gpu_failing_its_timing_places_the_policy_on_the_cpu(tmp_path, monkeypatch):
    from rlinkd.daemon.learner import placement

    def failing(spec, minibatch, device, graphs=True):
        if device != "cpu":
            raise RuntimeError("CUDA error: out of memory\ndetails")
        return 0.01
    monkeypatch.setattr(placement, "time_sgd_step", failing)
    monkeypatch.setattr(placement, "host_signature", lambda threads: "h")
    cfg, defs = two_policies(tmp_path)
    assert place(defs["default"], cfg, cuda_count=1).device == "cpu"


def test_the_cache_key_separates_network_minibatch_and_host():
    keys = {dc.cache_key({"net": 1}, 128, "h"), dc.cache_key({"net": 2}, 128, "h"),
            dc.cache_key({"net": 1}, 256, "h"), dc.cache_key({"net": 1}, 128, "g")}
    assert len(keys) == 4 and dc.cache_key({"net": 1}, 128, "h") in keys


def two_policies(tmp_path, device: str = "auto"):
    path = tmp_path / "rlinkd.toml"
    path.write_text('[ppo]\nminibatch_size = 64\n[policies.red]\nalgorithm = "dqn"\n'
                    '[policies.red.dqn]\nbatch_size = 32\n')
    cfg = load_config(path, [("daemon", "state_dir", str(tmp_path / "s")),
                             ("learner", "device", device)])
    (tmp_path / "s").mkdir()
    return cfg, policy_defs(cfg)


def test_each_policy_is_placed_by_its_own_timing(tmp_path):
    cfg, defs = two_policies(tmp_path)
    assert (minibatch_of(defs["default"]), minibatch_of(defs["red"])) == (64, 32)
    default = place(defs["default"], cfg, table(cpu=0.001, cuda0=0.002), cuda_count=1)
    red = place(defs["red"], cfg, table(cpu=0.004, cuda0=0.002), cuda_count=1)
    assert (default.device, red.device) == ("cpu", "cuda:0")
    entries = json.loads((cfg.state_dir / dc.CACHE_FILE).read_text())
    assert len(entries) == 2  # one per (network, minibatch)
    assert place(defs["red"], cfg, table(cpu=0.0, cuda0=1.0), cuda_count=1).how == "cached"
    assert dc.device_fields(red) == {"device": "cuda:0", "device_choice": "measured",
                                     "device_step_s": {"cpu": 0.004, "cuda:0": 0.002}}


def test_a_job_times_the_eager_step_its_learners_run(tmp_path, monkeypatch):
    """A job's learners step eagerly (a graph cannot hold the collective): a GPU that is
    faster only when its step is captured trains a daemon alone, not a job's rank; the two
    timings are cached apart."""
    from rlinkd.daemon.learner import placement
    timed = []

    def timing(spec, minibatch, device, graphs=True):
        timed.append((device, graphs))
        return {"cpu": 1.0, "cuda:0": 0.5 if graphs else 2.0}[device]
    monkeypatch.setattr(placement, "time_sgd_step", timing)
    monkeypatch.setattr(placement, "host_signature", lambda threads: "h")
    state = tmp_path / "s"
    state.mkdir()
    alone = load_config(None, [("daemon", "state_dir", str(state))])
    job = load_config(None, [("daemon", "state_dir", str(state)), ("cluster", "world_size", 2),
                             ("cluster", "rank", 1)])
    assert place(policy_defs(alone)["default"], alone, cuda_count=1).device == "cuda:0"
    assert place(policy_defs(job)["default"], job, cuda_count=1).device == "cpu"
    assert timed == [("cpu", True), ("cuda:0", True), ("cpu", False), ("cuda:0", False)]


def test_a_fixed_device_the_host_lacks_is_a_boot_error(tmp_path):
    cfg, defs = two_policies(tmp_path, "cuda")
    with pytest.raises(BootError, match=r"^learner.device = 'cuda'"):
        place(defs["default"], cfg, cuda_count=0)
    assert place(defs["default"], cfg, cuda_count=1) == dc.DeviceChoice("cuda:0", "fixed")


def test_the_real_timing_function_times_a_step_on_the_cpu():
    from rlinkd.daemon.learner.step_timing import host_signature, time_sgd_step
    cfg = load_config(None, resolve_dirs=False)
    spec = policy_defs(cfg)["default"].spec
    step_s = time_sgd_step(spec, 32, "cpu", steps=2)
    assert math.isfinite(step_s) and 0 < step_s < 5
    assert host_signature(1) != host_signature(2)


def test_a_recurrent_policy_is_timed_over_chunks_with_the_real_function(tmp_path, monkeypatch):
    """An LSTM policy's step needs a state: the timing runs it as the learner does (BPTT over
    whole chunks, eagerly). Here a "GPU" that torch cannot use loses, and the CPU wins."""
    from rlinkd.daemon.learner import placement
    monkeypatch.setattr(placement, "host_signature", lambda threads: "h")
    cfg = load_config(None, [("daemon", "state_dir", str(tmp_path)), ("ppo", "recurrent", "lstm"),
                             ("ppo", "max_seq_len", 8), ("ppo", "minibatch_size", 32)])
    choice = place(policy_defs(cfg)["default"], cfg, cuda_count=1)
    assert choice.device == "cpu" and choice.how == "measured" and math.isfinite(choice.step_s["cpu"])


def test_a_cpu_timing_that_fails_is_a_boot_error_not_a_crash(tmp_path, monkeypatch):
    from rlinkd.daemon.learner import placement

    def broken(spec, minibatch, device, graphs=True):
        raise ValueError("a network the timing cannot run")
    monkeypatch.setattr(placement, "time_sgd_step", broken)
    cfg, defs = two_policies(tmp_path)
    with pytest.raises(BootError, match=r"learner.device = 'auto'.*'default'.*cannot run"):
        place(defs["default"], cfg, cuda_count=1)


def test_rlinkd_status_shows_each_policys_device_and_timings():
    from rlinkd.daemon.cli import format_status
    timed = {"device": "cuda:0", "device_choice": "measured",
             "device_step_s": {"cpu": 0.004, "cuda:0": 0.00125}}
    text = format_status({"policies": {"default": {"learner": timed},
                                       "red": {"learner": {"device": "cpu", "device_choice": "only_cpu",
                                                           "device_step_s": {}}},
                                       "frozen": {"learner": {}}}})
    assert ("learner default on cuda:0 (measured: cpu 4.00 ms, cuda:0 1.25 ms per SGD step)"
            in text.splitlines())
    assert "learner red on cpu (only_cpu)" in text.splitlines() and "frozen on" not in text
