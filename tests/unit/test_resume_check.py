"""The supervisor refuses to resume from a checkpoint that does not fit the config's network."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from rlinkd.daemon.config import ConfigError, load_config
from rlinkd.daemon.supervisor import check_resume_matches
from rlinkd.daemon.wiring import make_policy_spec, resolve_spaces


def test_a_checkpoint_without_policy_json_is_refused_with_a_pointer_to_fresh():
    cfg = load_config(resolve_dirs=False)
    spec = make_policy_spec(cfg, *resolve_spaces(cfg))
    old = SimpleNamespace(path=Path("/state/checkpoints/ckpt-000007"),
                          manifest={"files": {"learner.pt": {}, "config.toml": {}}})
    with pytest.raises(ConfigError, match=r"ckpt-000007.*older than composite spaces.*--fresh"):
        check_resume_matches(old, spec)


def test_a_learner_state_of_another_algorithm_is_a_boot_error_not_a_crash(tmp_path):
    """Spaces and network fit (the supervisor lets it through) but the learner state is another
    algorithm's: the core's ValueError becomes one BootError line (exit 3 at once, no restart
    loop); a state the core takes comes back with the saved hyperparameters."""
    import io

    import torch

    from rlinkd.daemon.checkpoint import store
    from rlinkd.daemon.learner.resume import resume_state
    from rlinkd.daemon.roles import BootError

    class Core:
        def load_state_dict(self, d: dict) -> dict[str, float]:
            if d.get("algorithm") != "dqn":
                raise ValueError(f"not a DQN learner state (algorithm {d.get('algorithm')!r})")
            return {"lr": d["lr"]}

    def checkpoint(learner: dict) -> str:
        buf = io.BytesIO()
        torch.save({"learner": learner, "weights_seq_no": 3}, buf)
        files = {store.policy_file("red", "learner.pt"): buf.getvalue()}
        return str(store.write_checkpoint(tmp_path, files, {"weights_seq_no": 3}).path)

    ppo = checkpoint({"format_version": 1})
    with pytest.raises(BootError, match=r"cannot resume policy 'red' .*not a DQN.*--fresh"):
        resume_state(Core(), ppo, "red")
    state, saved = resume_state(Core(), checkpoint({"algorithm": "dqn", "lr": 0.5}), "red")
    assert saved == {"lr": 0.5} and state["weights_seq_no"] == 3
