"""Epsilon-greedy exploration of DQN policies on the client: the draw's frequencies, masked
actions never drawn, its log-probs, and the 'exploration' extension key of SET_STATE and
WEIGHTS_READY (additive: absent or malformed means ordinary sampling)."""
from __future__ import annotations

import numpy as np
import pytest

from rlinkd.client_lib.policy import ActionChooser
from rlinkd.client_lib.protocol import codec
from rlinkd.client_lib.protocol.masking import MASKED_LOGIT
from rlinkd.client_lib.protocol.spaces import Box, Discrete


def test_frequencies_follow_epsilon_and_masked_actions_are_never_drawn():
    chooser = ActionChooser(Discrete(4), seed=0)
    q = np.tile(np.array([[1.0, 5.0, MASKED_LOGIT, 0.0]], np.float32), (20_000, 1))
    actions, logp = chooser.choose_batch(q, True, epsilon=0.3)
    counts = np.bincount(actions[:, 0].astype(int), minlength=4) / len(q)
    assert counts[2] == 0.0                                   # masked: never
    assert counts[1] == pytest.approx(0.7 + 0.1, abs=0.02)    # greedy + its share of random
    assert counts[0] == pytest.approx(0.1, abs=0.01) and counts[3] == pytest.approx(0.1, abs=0.01)
    greedy = actions[:, 0] == 1
    assert np.allclose(logp[greedy], np.log(0.8)) and np.allclose(logp[~greedy], np.log(0.1))
    action, lp = chooser.choose(q[:1], True, epsilon=0.0)
    assert action[0] == 1 and lp == pytest.approx(0.0)
    assert chooser.choose(q[:1], False, epsilon=1.0)[0][0] == 1  # not exploring: argmax


def test_epsilon_needs_a_single_discrete_action():
    with pytest.raises(ValueError, match="Discrete"):
        ActionChooser(Box((2,), low=-1.0, high=1.0)).choose_batch(np.zeros((2, 4), np.float32), True, 0.1)


def test_the_exploration_key_round_trips_and_is_additive():
    msg = codec.SetState(3, "b25ueA==", exploration={"default": {"epsilon": 0.25}})
    back = codec.decode_body(codec.encode(msg)[codec.HEADER_BYTES:])
    assert back == msg and codec.epsilon_of(back.exploration, "default") == 0.25
    plain = codec.decode_body(codec.encode(codec.SetState(3, "b25ueA=="))[codec.HEADER_BYTES:])
    assert plain.exploration is None and codec.epsilon_of(plain.exploration, "default") is None
    for bad in ({"default": {"epsilon": 2.0}}, {"default": 0.1}, {"default": {"epsilon": True}}):
        assert codec.epsilon_of(bad, "default") is None
    ready = codec.WeightsReady(4, exploration={"red": {"epsilon": 0.5}})
    assert codec.decode_body(codec.encode(ready)[codec.HEADER_BYTES:]) == ready
