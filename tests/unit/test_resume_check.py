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
