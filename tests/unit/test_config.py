"""daemon.config: TOML loading, coercion, limits, cross-field rules, reload, TOML/docs output."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from rlinkd.client_lib.protocol.spaces import Box, Dict, Discrete, MultiBinary, MultiDiscrete, space_from_json
from rlinkd.daemon import config as C
from rlinkd.daemon.config import (Config, apply_changes, docs_markdown, load_config,
                                  metrics_address, parse_override, reloadable_changes, to_toml)
from rlinkd.daemon.errors import ConfigError


def write(tmp_path: Path, text: str, name: str = "rlinkd.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def load_text(tmp_path: Path, text: str, **kw) -> Config:
    return load_config(write(tmp_path, text), resolve_dirs=False, **kw)


def all_fields():
    for section, cls in C.SECTIONS.items():
        for f in dataclasses.fields(cls):
            yield section, f


# ---------------------------------------------------------------- loading
def test_load_config_from_file(tmp_path):
    path = write(tmp_path, """
[server]
port = 6000
token = "abc"
[sampling]
env_steps_per_sample = 64
force_on_policy = false
train_batch_size = 256
[ppo]
lr = 3e-4
hidden_sizes = [32, 16]
activation = "relu"
minibatch_size = 64
[env]
observation_space = {type = "Box", shape = [3], low = -1.0, high = 1.0}
action_space = {type = "Discrete", n = 4}
""")
    cfg = load_config(path, resolve_dirs=False)
    assert cfg.server.port == 6000 and cfg.server.token == "abc"
    assert cfg.sampling.env_steps_per_sample == 64 and cfg.sampling.force_on_policy is False
    assert cfg.ppo.lr == 3e-4 and cfg.ppo.hidden_sizes == (32, 16) and cfg.ppo.activation == "relu"
    assert cfg.env.observation_space == Box([3], low=-1.0, high=1.0)
    assert cfg.env.action_space == Discrete(4)
    assert cfg.source_file == str(path.resolve())
    # untouched keys keep their defaults
    assert cfg.server.max_message_bytes == C.ServerConfig().max_message_bytes
    assert cfg.daemon == C.DaemonConfig()


def test_defaults_without_a_file():
    cfg = load_config(resolve_dirs=False)
    assert cfg == Config()
    assert cfg.source_file == ""


def test_overrides_win_over_the_file(tmp_path):
    cfg = load_text(tmp_path, "[server]\nport = 6000\n",
                    overrides=[("server", "port", 7000), ("ppo", "lr", 0.5)])
    assert cfg.server.port == 7000 and cfg.ppo.lr == 0.5


def test_missing_file_and_syntax_errors_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match=r"bad\.toml"):
        load_config(write(tmp_path, "[server\nport = 1", "bad.toml"))


def test_unknown_section_names_it(tmp_path):
    with pytest.raises(ConfigError, match=r"\[bogus\]: unknown section"):
        load_text(tmp_path, "[bogus]\nx = 1\n")
    with pytest.raises(ConfigError, match=r"\[stray\]: unknown section"):
        load_text(tmp_path, "stray = 1\n")


def test_unknown_key_names_it(tmp_path):
    with pytest.raises(ConfigError, match=r"^server\.prot: unknown key \(known: host, port"):
        load_text(tmp_path, "[server]\nprot = 1\n")
    with pytest.raises(ConfigError, match=r"ppo\.learning_rate: unknown key"):
        load_config(overrides=[("ppo", "learning_rate", 0.1)], resolve_dirs=False)


def test_a_removed_key_says_what_to_do(tmp_path):
    with pytest.raises(ConfigError, match=r"^inference\.direct: removed: every serving connection"):
        load_text(tmp_path, "[inference]\ndirect = false\n")


def test_section_that_is_not_a_table(tmp_path):
    with pytest.raises(ConfigError, match=r"\[server\]: expected a table"):
        load_text(tmp_path, 'server = "x"\n')


def test_override_into_a_section_that_is_not_a_table(tmp_path):
    with pytest.raises(ConfigError, match="server"):
        load_text(tmp_path, 'server = "x"\n', overrides=[("server", "port", 1)])


@pytest.mark.parametrize("text, pattern", [
    ('[server]\nport = "abc"', r"server\.port: expected int, got 'abc'"),
    ("[server]\nport = 5.5", r"server\.port: expected int, got 5\.5"),
    ("[server]\nport = true", r"server\.port: expected int, got True"),
    ("[server]\nport = [1]", r"server\.port: expected int"),
    ('[ppo]\nlr = "fast"', r"ppo\.lr: expected float, got 'fast'"),
    ("[ppo]\nlr = false", r"ppo\.lr: expected float"),
    ("[ppo]\nlr = nan", r"ppo\.lr"),
    ("[ppo]\nlog_std_init = nan", r"ppo\.log_std_init"),
    ("[sampling]\nforce_on_policy = 3", r"sampling\.force_on_policy: expected bool, got 3"),
    ('[sampling]\nforce_on_policy = "maybe"', r"sampling\.force_on_policy: expected bool"),
    ("[server]\ntoken = true", r"server\.token: expected str, got True"),
    ("[server]\ntoken = [1]", r"server\.token: expected str"),
    ("[ppo]\nhidden_sizes = 5", r"ppo\.hidden_sizes: expected a list, got 5"),
    ('[ppo]\nhidden_sizes = ["a"]', r"ppo\.hidden_sizes: expected int"),
    ("[env]\nobservation_space = 5", r"env\.observation_space: expected a table"),
    ('[env]\nobservation_space = {type = "Box"}', r"env\.observation_space: Box needs a shape"),
    ('[env]\nobservation_space = {type = "Box", shape = 4}', r"env\.observation_space: "),
    ('[env]\naction_space = {type = "Box", shape = [1], low = ["a"]}', r"env\.action_space: "),
    ('[env]\naction_space = {type = "Discrete", n = 0}', r"env\.action_space: Discrete n"),
])
def test_type_errors_name_the_key(tmp_path, text, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_text(tmp_path, text)


def test_string_values_are_coerced_like_the_cli_gives_them():
    cfg = load_config(overrides=[("server", "port", "6001"), ("sampling", "force_on_policy", "no"),
                                 ("ppo", "hidden_sizes", "8, 4"), ("ppo", "lr", "0.25"),
                                 ("ppo", "clip_vloss", "FALSE"), ("server", "max_connections", 3.0)],
                      resolve_dirs=False)
    assert cfg.server.port == 6001 and cfg.sampling.force_on_policy is False
    assert cfg.ppo.hidden_sizes == (8, 4) and cfg.ppo.lr == 0.25 and cfg.ppo.clip_vloss is False
    assert cfg.server.max_connections == 3 and isinstance(cfg.server.max_connections, int)


def test_empty_table_means_no_explicit_space(tmp_path):
    cfg = load_text(tmp_path, "[env]\nobservation_space = {}\n")
    assert cfg.env.observation_space is None


# ---------------------------------------------------------------- limits
@pytest.mark.parametrize("section, key, value, pattern", [
    ("server", "port", 65536, r"server\.port: must be <= 65535, got 65536"),
    ("server", "port", -1, r"server\.port: must be >= 0, got -1"),
    ("server", "max_message_bytes", 1023, r"server\.max_message_bytes: must be >= 1024"),
    ("sampling", "batch_slots", 9, r"sampling\.batch_slots: must be <= 8"),
    ("sampling", "batch_slots", 0, r"sampling\.batch_slots: must be >= 1"),
    ("ppo", "gamma", 1.5, r"ppo\.gamma: must be <= 1"),
    ("ppo", "lr", -1e-3, r"ppo\.lr: must be >= 0"),
    ("ppo", "activation", "gelu", r"ppo\.activation: must be one of tanh, relu, got 'gelu'"),
    ("daemon", "log_level", "verbose", r"daemon\.log_level: must be one of debug, info"),
    ("server", "read_timeout_s", 0.05, r"server\.read_timeout_s: must be >= 0\.1"),
])
def test_limits(section, key, value, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(overrides=[(section, key, value)], resolve_dirs=False)


def test_limits_are_inclusive():
    cfg = load_config(overrides=[("server", "port", 65535), ("sampling", "batch_slots", 8),
                                 ("ppo", "gamma", 1.0), ("ppo", "lr", 0.0),
                                 ("server", "max_message_bytes", 1024)], resolve_dirs=False)
    assert (cfg.server.port, cfg.sampling.batch_slots, cfg.ppo.gamma) == (65535, 8, 1.0)


# ---------------------------------------------------------------- cross-field rules
def test_minibatch_larger_than_batch():
    with pytest.raises(ConfigError, match=r"ppo\.minibatch_size \(512\) must not exceed "
                                          r"sampling\.train_batch_size \(256\)"):
        load_config(overrides=[("ppo", "minibatch_size", 512),
                               ("sampling", "train_batch_size", 256)], resolve_dirs=False)
    cfg = load_config(overrides=[("ppo", "minibatch_size", 256),
                                 ("sampling", "train_batch_size", 256)], resolve_dirs=False)
    assert cfg.ppo.minibatch_size == 256


@pytest.mark.parametrize("sizes", [[], [64, 0]])
def test_hidden_sizes_must_be_positive(sizes):
    with pytest.raises(ConfigError, match=r"ppo\.hidden_sizes"):
        load_config(overrides=[("ppo", "hidden_sizes", sizes)], resolve_dirs=False)


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.5", "::", "example.com", ""])
def test_non_loopback_host_needs_tls_or_insecure_remote(host):
    with pytest.raises(ConfigError, match=r"server\.host = .* is not a loopback address"):
        load_config(overrides=[("server", "host", host)], resolve_dirs=False)
    cfg = load_config(overrides=[("server", "host", host), ("server", "insecure_remote", True)],
                      resolve_dirs=False)
    assert cfg.server.host == host
    cfg = load_config(overrides=[("server", "host", host), ("server", "tls_cert_file", "c.pem"),
                                 ("server", "tls_key_file", "k.pem")], resolve_dirs=False)
    assert cfg.server.tls_cert_file == "c.pem"


@pytest.mark.parametrize("host", ["127.0.0.1", "127.3.2.1", "::1", "localhost"])
def test_loopback_hosts_need_nothing(host):
    assert load_config(overrides=[("server", "host", host)], resolve_dirs=False).server.host == host


@pytest.mark.parametrize("overrides, pattern", [
    ([("tls_cert_file", "c.pem")], "tls_cert_file and server.tls_key_file go together"),
    ([("tls_key_file", "k.pem")], "tls_cert_file and server.tls_key_file go together"),
    ([("tls_client_ca_file", "ca.pem")], "tls_client_ca_file needs server.tls_cert_file"),
])
def test_tls_file_pairs(overrides, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(overrides=[("server", k, v) for k, v in overrides], resolve_dirs=False)


def test_socket_path_length_is_checked():
    with pytest.raises(ConfigError, match=r"daemon\.runtime_dir: socket path .* too long"):
        load_config(overrides=[("daemon", "runtime_dir", "/tmp/" + "x" * 120)], resolve_dirs=False)


def test_env_id_or_both_spaces():
    with pytest.raises(ConfigError, match=r"env\.id"):
        load_config(overrides=[("env", "id", "")], resolve_dirs=False)
    with pytest.raises(ConfigError, match=r"env\.id"):
        load_config(overrides=[("env", "id", ""),
                               ("env", "action_space", {"type": "Discrete", "n": 2})],
                    resolve_dirs=False)
    cfg = load_config(overrides=[("env", "id", ""),
                                 ("env", "action_space", {"type": "Discrete", "n": 2}),
                                 ("env", "observation_space", {"type": "Discrete", "n": 5})],
                      resolve_dirs=False)
    assert cfg.env.observation_space == Discrete(5)


def test_resolved_dirs_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("STATE_DIRECTORY", f"{tmp_path}/state:{tmp_path}/other")
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    cfg = load_config()
    assert cfg.state_dir == (tmp_path / "state").resolve()
    assert cfg.runtime_dir == cfg.state_dir / "run"
    assert cfg.socket_path == cfg.state_dir / "run" / "rlinkd.sock"
    monkeypatch.setenv("RUNTIME_DIRECTORY", f"{tmp_path}/rt")
    assert load_config().runtime_dir == (tmp_path / "rt").resolve()
    explicit = load_config(overrides=[("daemon", "state_dir", str(tmp_path / "s2"))])
    assert explicit.state_dir == tmp_path / "s2"


def test_xdg_state_home_default(tmp_path, monkeypatch):
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    monkeypatch.delenv("RUNTIME_DIRECTORY", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert load_config().state_dir == (tmp_path / "xdg" / "rlinkd").resolve()


# ---------------------------------------------------------------- CLI overrides
@pytest.mark.parametrize("text, expected", [
    ("server.port=5556", ("server", "port", 5556)),
    ("ppo.lr=3e-4", ("ppo", "lr", 3e-4)),
    ("sampling.force_on_policy=false", ("sampling", "force_on_policy", False)),
    ("ppo.hidden_sizes=[32, 32]", ("ppo", "hidden_sizes", [32, 32])),
    ('server.token="a=b"', ("server", "token", "a=b")),
    ("server.host=0.0.0.0", ("server", "host", "0.0.0.0")),     # not TOML: bare string
    ("daemon.log_level=debug", ("daemon", "log_level", "debug")),
    (" ppo.lr =0.5", ("ppo", "lr", 0.5)),
    ("env.action_space={type = \"Discrete\", n = 3}",
     ("env", "action_space", {"type": "Discrete", "n": 3})),
    ("server.token=", ("server", "token", "")),
])
def test_parse_override(text, expected):
    assert parse_override(text) == expected


@pytest.mark.parametrize("text", ["server.port", "port=5", "=5", "serverport=1"])
def test_parse_override_refuses_malformed(text):
    with pytest.raises(ConfigError, match=r"expected section\.key=value"):
        parse_override(text)


def test_parse_override_feeds_load_config():
    cfg = load_config(overrides=[parse_override("server.port=6100"),
                                 parse_override("ppo.hidden_sizes=[8]")], resolve_dirs=False)
    assert cfg.server.port == 6100 and cfg.ppo.hidden_sizes == (8,)


# ---------------------------------------------------------------- reload
def test_reloadable_changes_split_and_apply():
    old = load_config(resolve_dirs=False)
    new = load_config(overrides=[("ppo", "lr", 0.5), ("ppo", "ent_coef", 0.01),
                                 ("server", "port", 6001), ("daemon", "log_level", "debug"),
                                 ("ppo", "gamma", 0.9)], resolve_dirs=False)
    applied, ignored = reloadable_changes(old, new)
    assert applied == {"ppo.lr": 0.5, "ppo.ent_coef": 0.01, "daemon.log_level": "debug"}
    assert sorted(ignored) == ["ppo.gamma", "server.port"]
    updated = apply_changes(old, applied)
    assert updated.ppo.lr == 0.5 and updated.ppo.ent_coef == 0.01
    assert updated.daemon.log_level == "debug"
    assert updated.server.port == old.server.port and updated.ppo.gamma == old.ppo.gamma
    assert reloadable_changes(old, old) == ({}, [])
    assert apply_changes(old, {}) == old


def test_every_reloadable_key_is_reported_as_applied():
    reloadable = [(s, f) for s, f in all_fields() if f.metadata["reloadable"]]
    assert {f"{s}.{f.name}" for s, f in reloadable} == {
        "ppo.lr", "ppo.ent_coef", "dqn.lr", "sac.lr", "checkpoint.checkpoint_interval_s",
        "checkpoint.keep_checkpoints", "daemon.log_level"}


def test_a_reloaded_section_skips_the_policies_with_their_own_table(tmp_path):
    """[ppo] lr reloaded: policies taking [ppo] get it, one with [policies.red.ppo] keeps its
    own (a restart would give it that table's value too), on the learner and in the topology."""
    from rlinkd.daemon.policies import reloaded_sections
    cfg = load_text(tmp_path, "[policies.red]\ntrainable = true\n[policies.red.ppo]\nlr = 0.01\n"
                              "[policies.blue]\ntrainable = true\n")
    changes = {"ppo.lr": 0.5, "ppo.ent_coef": 0.02, "dqn.lr": 0.1, "daemon.log_level": "debug"}
    assert reloaded_sections(cfg, "blue", changes) == {"ppo": {"lr": 0.5, "ent_coef": 0.02},
                                                       "dqn": {"lr": 0.1}}
    assert reloaded_sections(cfg, "default", changes) == reloaded_sections(cfg, "blue", changes)
    assert reloaded_sections(cfg, "red", changes) == {"dqn": {"lr": 0.1}}


RED_BLUE = ("[ppo]\nlr = 0.001\n[policies.red]\ntrainable = true\n[policies.red.ppo]\n"
            "lr = 0.01\n{red}[policies.blue]\ntrainable = true\n{blue}")


def test_a_policys_own_reloadable_keys_apply_to_it_as_a_restart_would_give_them(tmp_path):
    """policies.red.ppo.lr changed: applied under that name, to red only; the applied
    config equals the file loaded afresh; a global key red's table does not set reaches
    red under red's name too (a restart merges the table over [ppo])."""
    from rlinkd.daemon.policies import reloaded_sections
    old = load_text(tmp_path, RED_BLUE.format(red="", blue=""))
    new = load_text(tmp_path, RED_BLUE.format(red="", blue="").replace("lr = 0.01", "lr = 0.02"))
    applied, ignored = reloadable_changes(old, new)
    assert (applied, ignored) == ({"policies.red.ppo.lr": 0.02}, [])
    assert apply_changes(old, applied) == new
    assert reloaded_sections(old, "red", applied) == {"ppo": {"lr": 0.02}}
    assert reloaded_sections(old, "blue", applied) == reloaded_sections(old, "default", applied) == {}
    inherited = load_text(tmp_path, "[ppo]\nlr = 0.001\nent_coef = 0.1\n" + RED_BLUE.format(
        red="", blue="").split("\n", 2)[2])
    applied, ignored = reloadable_changes(old, inherited)
    assert applied == {"ppo.ent_coef": 0.1, "policies.red.ppo.ent_coef": 0.1} and ignored == []
    assert apply_changes(old, applied) == inherited
    assert reloaded_sections(old, "red", applied) == {"ppo": {"ent_coef": 0.1}}
    assert reloaded_sections(old, "blue", applied) == {"ppo": {"ent_coef": 0.1}}


@pytest.mark.parametrize("red, blue, needs_restart", [
    ("hidden_sizes = [8]\n", "", ["policies.red.ppo.hidden_sizes"]),
    ("gamma = 0.9\nent_coef = 0.5\n", "", ["policies.red.ppo.gamma"]),
    ("", "[policies.blue.ppo]\nlr = 0.5\n", ["policies.blue.ppo"]),
    ("", "[policies.green]\ntrainable = true\n", ["policies.green"]),
    ("", 'algorithm = "appo"\n', ["policies.blue.algorithm"]),
    ("", '[policy_mapping]\n"b_*" = "blue"\n', ["policy_mapping"]),
])
def test_a_policys_other_changes_are_named_as_needing_a_restart(tmp_path, red, blue, needs_restart):
    """Reported like a non-reloadable global key (the reloadable ones beside them still apply)."""
    old = load_text(tmp_path, RED_BLUE.format(red="", blue=""))
    applied, ignored = reloadable_changes(old, load_text(tmp_path, RED_BLUE.format(red=red, blue=blue)))
    assert ignored == needs_restart
    assert applied == ({"policies.red.ppo.ent_coef": 0.5} if "ent_coef" in red else {})
    removed = load_text(tmp_path, RED_BLUE.format(red="", blue="").split("[policies.blue]")[0])
    assert reloadable_changes(old, removed) == ({}, ["policies.blue"])


def test_a_table_gained_holds_back_its_sections_global_keys(tmp_path):
    """blue gains [policies.blue.ppo] while [ppo] lr changes: blue ran on [ppo], so applying
    ppo.lr would give it a value the new file does not (a restart gives it its table's): the
    global ppo keys need a restart too; other sections' keys still apply."""
    from rlinkd.daemon.policies import reloaded_sections
    old = load_text(tmp_path, RED_BLUE.format(red="", blue="") + "[dqn]\nlr = 0.001\n")
    new = load_text(tmp_path, RED_BLUE.format(red="", blue="[policies.blue.ppo]\nlr = 0.02\n")
                    .replace("[ppo]\nlr = 0.001", "[ppo]\nlr = 0.005") + "[dqn]\nlr = 0.002\n")
    applied, ignored = reloadable_changes(old, new)
    assert applied == {"dqn.lr": 0.002}
    assert sorted(ignored) == ["policies.blue.ppo", "ppo.lr"]
    assert reloaded_sections(old, "blue", applied) == {"dqn": {"lr": 0.002}}


def test_applying_a_policy_key_the_running_config_lacks_is_a_config_error(tmp_path):
    cfg = load_text(tmp_path, RED_BLUE.format(red="", blue=""))
    for key in ("policies.x.ppo.lr", "policies.blue.ppo.lr"):  # no policy x; blue has no table
        with pytest.raises(ConfigError, match="no such policy table"):
            apply_changes(cfg, {key: 0.5})


def test_policy_reload_keys_are_checked_against_the_declarations(tmp_path):
    """A Reload carries policies.NAME.<section>.<key> when that key is reloadable there;
    status shows the values of each policy's own tables."""
    from rlinkd.daemon import messages as m
    assert m.Reload({"policies.red.ppo.lr": 0.5, "policies.red.sac.lr": 0.1}).changes
    for key, value, pattern in [("policies.red.ppo.gamma", 0.5, "not a reloadable"),
                                ("policies.red.appo.max_lead_steps", 0, "not a reloadable"),
                                ("policies.red.ppo", 0.5, "not a reloadable"),
                                ("policies.a b.ppo.lr", 0.5, "not a reloadable"),
                                ("policies.red.ppo.lr", -1.0, "must be >= 0"),
                                ("policies.red.ppo.lr", "fast", "expected float")]:
        with pytest.raises(ConfigError, match=rf"{key}: {pattern}"):
            m.Reload({key: value})
    values = C.reloadable_values(load_text(tmp_path, RED_BLUE.format(red="", blue="")))
    assert values["policies.red.ppo.lr"] == 0.01 and values["ppo.lr"] == 0.001
    assert not any(key.startswith("policies.blue.") for key in values)


# ---------------------------------------------------------------- TOML output
def _round_trip(tmp_path: Path, cfg: Config) -> Config:
    path = write(tmp_path, to_toml(cfg), "roundtrip.toml")
    return dataclasses.replace(load_config(path, resolve_dirs=False), source_file=cfg.source_file)


def test_to_toml_round_trip_defaults(tmp_path):
    cfg = load_config(resolve_dirs=False)
    assert _round_trip(tmp_path, cfg) == cfg


def test_to_toml_round_trip_resolved_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "state"))
    cfg = load_config()
    assert _round_trip(tmp_path, cfg) == cfg


def test_to_toml_round_trip_everything_changed(tmp_path):
    cfg = load_config(overrides=[
        ("server", "host", "0.0.0.0"), ("server", "insecure_remote", True),
        ("server", "port", 0), ("server", "token", 'quote" back\\slash\ttab\nnewline\x01\x7f é'),
        ("server", "read_timeout_s", 1e-1), ("server", "idle_timeout_s", 1e20),
        ("env", "id", "Pendulum-v1"),
        ("env", "observation_space", {"type": "Box", "shape": [3], "low": [-1.0, None, -1e-7],
                                      "high": [1.0, None, 8.0]}),
        ("env", "action_space", {"type": "Box", "shape": [1], "low": -2.0, "high": 2.0}),
        ("sampling", "force_on_policy", False), ("sampling", "max_policy_lag", 0),
        ("ppo", "lr", 2.5e-5), ("ppo", "hidden_sizes", [7, 5, 3]), ("ppo", "activation", "relu"),
        ("ppo", "log_std_init", -0.5), ("ppo", "minibatch_size", 32),
        ("connector", "pipeline", ["observations", "columns", "mypkg.pieces:Clip"]),
        ("daemon", "log_level", "debug"), ("daemon", "state_dir", str(tmp_path / "st")),
    ], resolve_dirs=False)
    assert cfg.env.observation_space.low[1] == -math.inf
    assert _round_trip(tmp_path, cfg) == cfg


def test_to_toml_round_trip_discrete_spaces(tmp_path):
    cfg = load_config(overrides=[("env", "observation_space", {"type": "Discrete", "n": 16}),
                                 ("env", "action_space", {"type": "Discrete", "n": 4})],
                      resolve_dirs=False)
    assert _round_trip(tmp_path, cfg) == cfg


# ---------------------------------------------------------------- docs
def test_to_toml_round_trip_composite_spaces_mask_and_cnn(tmp_path):
    obs = {"type": "Dict", "spaces": {
        "camera": {"type": "Box", "shape": [16, 16, 3], "dtype": "uint8", "low": 0, "high": 255},
        "state": {"type": "Tuple", "spaces": [{"type": "Discrete", "n": 3, "start": -1},
                                              {"type": "Box", "shape": [2], "low": [None, 0.0]}]},
        "action_mask": {"type": "MultiBinary", "n": 5}}}
    act = {"type": "Dict", "spaces": {"turn": {"type": "Discrete", "n": 3},
                                      "gear": {"type": "MultiDiscrete", "nvec": [2], "start": [1]}}}
    cfg = load_config(overrides=[("env", "observation_space", obs), ("env", "action_space", act),
                                 ("env", "action_mask_key", "action_mask"),
                                 ("ppo", "cnn_channels", [8, 16]), ("ppo", "cnn_kernels", [4, 3]),
                                 ("ppo", "cnn_strides", [2, 1]), ("ppo", "cnn_dense", 32)],
                      resolve_dirs=False)
    assert cfg.env.observation_space == space_from_json(obs)
    assert cfg.env.observation_space["camera"] == Box([16, 16, 3], "uint8", 0, 255)
    assert _round_trip(tmp_path, cfg) == cfg


def test_composite_space_from_a_toml_file(tmp_path):
    cfg = load_text(tmp_path, """
[env]
action_space = {type = "MultiBinary", n = [2, 2]}
action_mask_key = ""

[env.observation_space]
type = "Dict"
spaces = {pos = {type = "Box", shape = [2]}, flags = {type = "MultiDiscrete", nvec = [2, 3]}}
""")
    assert cfg.env.observation_space == Dict({"pos": Box([2]), "flags": MultiDiscrete([2, 3])})
    assert cfg.env.action_space == MultiBinary([2, 2])


@pytest.mark.parametrize("space, pattern", [
    ({"type": "Dict", "spaces": {"bad key": {"type": "Discrete", "n": 2}}}, r"env\.observation_space: Dict key"),
    ({"type": "Tuple", "spaces": []}, r"env\.observation_space: a Tuple space"),
    ({"type": "Box", "shape": [2], "dtype": "complex64"}, r"env\.observation_space: Box dtype"),
])
def test_malformed_composite_spaces_are_config_errors(space, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(overrides=[("env", "observation_space", space)], resolve_dirs=False)


@pytest.mark.parametrize("obs, act, key, pattern", [
    (Dict({"s": Box([2]), "m": MultiBinary(2)}), Discrete(3), "m", r"must be MultiBinary\(3\)"),
    (Dict({"s": Box([2])}), Discrete(3), "m", "must be a Dict with that key"),
    (Box([2]), Box([2], "int32", -1, 1), "", r"env/ppo: action: integer/bool Box actions are not supported"),
])
def test_spaces_that_do_not_fit_the_network_settings_are_config_errors(obs, act, key, pattern):
    from rlinkd.daemon.wiring import make_policy_spec
    cfg = load_config(overrides=[("env", "action_mask_key", key)], resolve_dirs=False)
    with pytest.raises(ConfigError, match=pattern):
        make_policy_spec(cfg, obs, act)


def test_docs_markdown_mentions_every_field():
    docs = docs_markdown()
    lines = docs.splitlines()
    assert lines[0] == "| key | default | reloadable | meaning |"
    rows = {line.split("|")[1].strip(): line for line in lines[2:]}
    count = 0
    for section, f in all_fields():
        count += 1
        row = rows[f"`{section}.{f.name}`"]
        assert f.metadata["doc"].replace("|", "\\|") in row
        assert ("| yes |" in row) == bool(f.metadata["reloadable"])
    for f in dataclasses.fields(C.PolicyConfig):
        count += 1
        assert f.metadata["doc"].replace("|", "\\|") in rows[f"`policies.NAME.{f.name}`"]
    assert "first match wins" in rows["`policy_mapping`"]
    assert len(lines) == count + 3 and docs.endswith("\n")


def test_docs_markdown_shows_defaults():
    rows = {line.split("|")[1].strip(): line for line in docs_markdown().splitlines()[2:]}
    assert "| `5555` |" in rows["`server.port`"]
    assert '| `"127.0.0.1"` |' in rows["`server.host`"]
    assert "| `[64, 64]` |" in rows["`ppo.hidden_sizes`"]
    assert "| `(none)` |" in rows["`env.observation_space`"]
    assert "| `true` |" in rows["`sampling.force_on_policy`"]
    assert '| `""` |' in rows["`server.token`"]


# ---------------------------------------------------------------- env.id
@pytest.mark.parametrize("env_id", ["NoSuchEnv-v0", "not an id"])
def test_unknown_env_id_is_a_config_error_naming_it(env_id):
    from rlinkd.daemon.wiring import resolve_spaces
    cfg = load_config(overrides=[("env", "id", env_id)], resolve_dirs=False)
    with pytest.raises(ConfigError, match=f"env.id.*{env_id}"):
        resolve_spaces(cfg)


def test_env_that_fails_to_build_is_a_config_error(monkeypatch):
    import gymnasium as gym

    from rlinkd.daemon.wiring import resolve_spaces

    def broken(env_id):
        raise RuntimeError("simulator library missing")
    monkeypatch.setattr(gym, "make", broken)
    cfg = load_config(overrides=[("env", "id", "CartPole-v1")], resolve_dirs=False)
    with pytest.raises(ConfigError, match=r"env\.id.*CartPole-v1.*simulator library missing"):
        resolve_spaces(cfg)


def test_explicit_spaces_need_no_gymnasium_env():
    from rlinkd.daemon.wiring import resolve_spaces
    cfg = load_config(overrides=[("env", "id", "NoSuchEnv-v0"),
                                 ("env", "observation_space", {"type": "Discrete", "n": 3}),
                                 ("env", "action_space", {"type": "Discrete", "n": 2})],
                      resolve_dirs=False)
    assert resolve_spaces(cfg) == (Discrete(3), Discrete(2))


# ---------------------------------------------------------------- metrics endpoint
@pytest.mark.parametrize("listen, address", [
    ("", None), ("127.0.0.1:9100", ("127.0.0.1", 9100)), ("127.0.0.1:0", ("127.0.0.1", 0)),
    ("localhost", ("localhost", 9464)), ("[::1]:9464", ("::1", 9464)),
    ("tcp://127.0.0.2:1", ("127.0.0.2", 1)),
])
def test_metrics_listen_forms(listen, address):
    cfg = load_config(overrides=[("metrics", "listen", listen)], resolve_dirs=False)
    assert metrics_address(cfg.metrics) == address


@pytest.mark.parametrize("listen, pattern", [
    ("0.0.0.0:9464", r"metrics\.listen = '0\.0\.0\.0:9464' is not a loopback address"),
    ("127.0.0.1:65536", r"metrics\.listen: Port out of range"),
    ("127.0.0.1:http", r"metrics\.listen: Port could not be cast"),
    ("unix:///tmp/m.sock", r"metrics\.listen = 'unix:///tmp/m\.sock': expected HOST:PORT"),
    ("http://127.0.0.1:9464", r"metrics\.listen: 'http://127\.0\.0\.1:9464': expected"),
])
def test_metrics_listen_refused(listen, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(overrides=[("metrics", "listen", listen)], resolve_dirs=False)


def test_metrics_remote_listen_needs_insecure_remote_and_is_not_reloadable():
    cfg = load_config(overrides=[("metrics", "listen", "0.0.0.0:9464"),
                                 ("metrics", "insecure_remote", True)], resolve_dirs=False)
    assert metrics_address(cfg.metrics) == ("0.0.0.0", 9464)
    applied, ignored = reloadable_changes(load_config(resolve_dirs=False), cfg)
    assert applied == {} and sorted(ignored) == ["metrics.insecure_remote", "metrics.listen"]


# ---------------------------------------------------------------- policies
POLICIES_TOML = """
[ppo]
lr = 0.001
[policies.red.ppo]
ent_coef = 0.01
[policies.blue]
trainable = false
load_from = "/tmp/blue.onnx"
[policy_mapping]
"red_*" = "red"
"blue_*" = "blue"
"""


def test_policies_tables_merge_ppo_and_keep_mapping_order(tmp_path):
    cfg = load_text(tmp_path, POLICIES_TOML, overrides=[("policies", "red.ppo.gamma", 0.9)])
    red = cfg.policies["red"]
    assert red.trainable and red.ppo is not None
    assert (red.ppo.lr, red.ppo.ent_coef, red.ppo.gamma) == (0.001, 0.01, 0.9)
    assert cfg.policies["blue"].ppo is None and not cfg.policies["blue"].trainable
    assert cfg.policy_mapping.rules == (("red_*", "red"), ("blue_*", "blue"))
    assert cfg.policy_mapping.policy_for("red_7") == "red"
    assert cfg.policy_mapping.policy_for("green") == "default"
    assert _round_trip(tmp_path, cfg) == cfg


@pytest.mark.parametrize("text, pattern", [
    ('[policy_mapping]\n"a*" = "nope"', "no such policy"),
    ("[policies.blue]\ntrainable = false", "needs a checkpoint"),
    ('[policies."bad name"]\ntrainable = true', "policy names"),
    ("[policies.red]\ntrainabel = true", "unknown key"),
    ("[policies.red.ppo]\nlrr = 1.0", "unknown key"),
    ("[policies.red.ppo]\nminibatch_size = 100000", "minibatch_size"),
])
def test_bad_policies_config_is_a_config_error(tmp_path, text, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_text(tmp_path, text)


def test_cli_overrides_reach_policy_tables_and_mapping_patterns_keep_their_dots():
    cfg = load_config(overrides=[parse_override("policies.red.ppo.lr=0.01"),
                                 parse_override("policy_mapping.team.red_*=red")],
                      resolve_dirs=False)
    assert cfg.policies["red"].ppo.lr == 0.01
    assert cfg.policy_mapping.rules == (("team.red_*", "red"),)


def test_algorithms_per_policy_and_their_sections(tmp_path):
    """learner.algorithm for all, [policies.NAME] algorithm for one, [policies.NAME.dqn]
    overriding [dqn]; DQN needs one Discrete action; the TOML round trip keeps it all."""
    from rlinkd.daemon.policies import policy_defs
    path = tmp_path / "rlinkd.toml"
    path.write_text('[learner]\nalgorithm = "appo"\n[dqn]\nlr = 0.01\nn_step = 3\n'
                    '[policies.red]\nalgorithm = "dqn"\n[policies.red.dqn]\nn_step = 5\n')
    cfg = load_config(path, [("daemon", "state_dir", str(tmp_path / "s"))])
    defs = policy_defs(cfg)
    assert defs["default"].algorithm == "appo" and defs["default"].off_policy
    assert not defs["default"].uses_replay
    red = defs["red"]
    assert red.algorithm == "dqn" and red.uses_replay and (red.dqn.n_step, red.dqn.lr) == (5, 0.01)
    assert red.spec.hidden_sizes == cfg.dqn.hidden_sizes and red.spec.activation == "relu"
    again = tmp_path / "again.toml"
    again.write_text(C.to_toml(cfg))
    assert load_config(again, [("daemon", "state_dir", str(tmp_path / "s"))]).policies == cfg.policies
    with pytest.raises(ConfigError, match="Discrete"):
        policy_defs(load_config(None, [("daemon", "state_dir", str(tmp_path / "s")),
                                       ("learner", "algorithm", "dqn"), ("env", "id", "Pendulum-v1")]))
    with pytest.raises(ConfigError, match="algorithm"):
        load_config(None, [("learner", "algorithm", "td3")], resolve_dirs=False)


def test_sac_needs_bounded_box_actions_and_takes_its_section(tmp_path):
    """SAC: float Box actions with finite bounds only; the spec is a squashed Gaussian with
    [sac]'s network, [policies.NAME.sac] overrides [sac]; the TOML round trip keeps it."""
    from rlinkd.daemon.policies import policy_defs
    path = tmp_path / "rlinkd.toml"
    path.write_text('[env]\nid = "Pendulum-v1"\n[sac]\nlr = 0.001\nhidden_sizes = [32]\n'
                    '[policies.red]\nalgorithm = "sac"\n[policies.red.sac]\ntau = 0.01\n')
    cfg = load_config(path, [("daemon", "state_dir", str(tmp_path / "s"))])
    red = policy_defs(cfg)["red"]
    assert red.uses_replay and red.off_policy and red.replay_hp is red.sac
    assert (red.sac.tau, red.sac.lr) == (0.01, 0.001)
    assert red.spec.box_dist == "squashed_gaussian" and red.spec.hidden_sizes == (32,)
    assert policy_defs(cfg)["default"].spec.box_dist == "gaussian"  # (PPO's)
    again = tmp_path / "again.toml"
    again.write_text(C.to_toml(cfg))
    assert load_config(again, [("daemon", "state_dir", str(tmp_path / "s"))]).policies == cfg.policies
    state = [("daemon", "state_dir", str(tmp_path / "s")), ("learner", "algorithm", "sac")]
    with pytest.raises(ConfigError, match="float Box"):
        policy_defs(load_config(None, [*state, ("env", "id", "CartPole-v1")]))
    unbounded = tmp_path / "unbounded.toml"
    unbounded.write_text('[env]\nobservation_space = { type = "Box", shape = [2] }\n'
                         'action_space = { type = "Box", shape = [1] }\n')
    with pytest.raises(ConfigError, match=r"env/sac: .*finite"):
        policy_defs(load_config(unbounded, state))


def test_appo_pacing_below_a_train_batch_is_refused():
    """Clients held below a full batch would wait for a batch that cannot form."""
    with pytest.raises(ConfigError, match=r"appo\.max_lead_steps \(100\) must be 0 \(off\) or at least "
                                          r"sampling\.train_batch_size \(512\)"):
        load_config(overrides=[("appo", "max_lead_steps", 100)], resolve_dirs=False)
    assert load_config(overrides=[("appo", "max_lead_steps", 512)], resolve_dirs=False).appo.max_lead_steps == 512


# ---------------------------------------------------------------- [cluster]
def test_cluster_defaults_to_a_daemon_alone():
    cluster = load_config(resolve_dirs=False).cluster
    assert (cluster.world_size, cluster.rank, cluster.backend) == (1, 0, "auto")


@pytest.mark.parametrize("overrides, pattern", [
    ([("cluster", "rank", 2), ("cluster", "world_size", 2)],
     r"cluster\.rank \(2\) must be < cluster\.world_size \(2\)"),
    ([("cluster", "rank", 1)], r"cluster\.rank \(1\) must be < cluster\.world_size \(1\)"),
    ([("cluster", "world_size", 0)], r"cluster\.world_size: must be >= 1"),
    ([("cluster", "world_size", 2), ("cluster", "master", "127.0.0.1")],
     r"cluster\.master = '127\.0\.0\.1': expected HOST:PORT with a port"),
    ([("cluster", "world_size", 2), ("cluster", "master", "unix:///tmp/x")],
     r"cluster\.master = 'unix:///tmp/x': expected HOST:PORT"),
    ([("cluster", "world_size", 2), ("cluster", "master", "10.1.2.3:29500")],
     r"cluster\.master = '10\.1\.2\.3:29500' is not a loopback address.*insecure_remote"),
    ([("cluster", "world_size", 2), ("cluster", "backend", "nccl"), ("learner", "device", "cpu")],
     r"cluster\.backend = 'nccl' needs a CUDA learner"),
    ([("cluster", "backend", "mpi")], r"cluster\.backend: must be one of auto, gloo, nccl"),
    ([("cluster", "world_size", 2), ("cluster", "collective_timeout_s", 30.0)],
     r"cluster\.collective_timeout_s \(30\) must be below daemon\.heartbeat_timeout_s \(30\)"),
    ([("cluster", "collective_timeout_s", 0.5)], r"cluster\.collective_timeout_s: must be >= 1"),
    ([("cluster", "world_size", 2), ("cluster", "collective_timeout_s", 5.0), ("cluster", "peer_wait_s", 5.0)],
     r"cluster\.peer_wait_s \(5\) must be below cluster\.collective_timeout_s \(5\)"),
    ([("cluster", "world_size", 2), ("cluster", "collective_timeout_s", 2.0)],
     r"cluster\.reform_window_s \(2\) must be below cluster\.collective_timeout_s \(2\)"),
])
def test_bad_cluster_config_names_the_key(overrides, pattern):
    with pytest.raises(ConfigError, match=pattern):
        load_config(overrides=overrides, resolve_dirs=False)


@pytest.mark.parametrize("algorithm", ["dqn", "sac", "appo"])
def test_every_algorithm_trains_in_a_job(algorithm):
    cfg = load_config(overrides=[("cluster", "world_size", 2), ("learner", "algorithm", algorithm)],
                      resolve_dirs=False)
    assert cfg.cluster.world_size == 2


def test_a_recurrent_policy_trains_in_a_job():
    cfg = load_config(overrides=[("cluster", "world_size", 2), ("ppo", "recurrent", "lstm")],
                      resolve_dirs=False)
    assert cfg.ppo.recurrent == "lstm"


def test_several_trainable_policies_train_in_a_job(tmp_path):
    cfg = load_text(tmp_path, "[cluster]\nworld_size = 2\n[policies.red]\n")
    assert cfg.policies["red"].trainable


def test_remote_master_with_insecure_remote_is_accepted():
    cfg = load_config(overrides=[("cluster", "world_size", 4), ("cluster", "rank", 3),
                                 ("cluster", "master", "10.1.2.3:29500"),
                                 ("cluster", "insecure_remote", True)], resolve_dirs=False)
    assert C.cluster_address(cfg.cluster) == ("10.1.2.3", 29500)


@pytest.mark.parametrize("text", ["lr = inf", "lr = nan", "ent_coef = -inf"])
def test_a_non_finite_number_is_refused(tmp_path, text):
    """inf passed `minimum = 0` and nan every comparison: an lr of inf reached the learner,
    whose reload then crashed it and whose boot rejected every batch."""
    with pytest.raises(ConfigError, match=r"must be a finite number|expected float, got nan"):
        load_text(tmp_path, f"[ppo]\n{text}\n")
