"""Serving with every native part of the inference role off (``inference.native_parts = []``):
the serving tests of test_serving.py that cross the native parts -- the lane scan, the lone
step, the native forward pass, direct connections' plain steps -- run again on a daemon that
serves everything in Python, and the status says which parts serve. (Each part off on its own,
against the same requests with every part on: tests/unit/test_native_parts.py.)"""
from __future__ import annotations

import pytest

from rlinkd.daemon.config import load_config
from rlinkd.daemon.inprocess import InProcessDaemon
from rlinkd.daemon.roster import ROLES
from tests.helpers import wait_for
from tests.wiring.test_serving import (  # noqa: F401 (collected here again, on this module's daemon)
    served_once, status, test_a_closed_direct_connection_releases_its_lanes_and_its_steps_train,
    test_client_lib_server_inference_trains, test_raw_messages_get_actions_and_record_steps)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serving_python")
    cfg = load_config(None, [("daemon", "state_dir", str(tmp / "state")), ("server", "port", 0),
                             ("sampling", "env_steps_per_sample", 200), ("inference", "native_parts", []),
                             ("sampling", "train_batch_size", 400), ("ppo", "minibatch_size", 100)])
    d = InProcessDaemon(cfg).start()
    yield d
    assert d.stop() == {role: 0 for role in ROLES}


def test_the_status_lists_no_native_part_and_no_native_backend(daemon):
    served_once(daemon)
    inf = wait_for(lambda: (st := status(daemon))["inference"].get("backends") and st["inference"], 15,
                   what="the inference role's report")
    assert inf["native_parts"] == [] and "native" not in inf["backends"]["default"]
    assert inf.get("direct_native_messages", 0) == 0
