"""The benchmark scenarios, one module each (``python -m bench.scenarios.<name>``).

``SUITE`` declares what ``make bench`` (``bench.run_all``) runs, in order, and which
result file of ``bench/results`` each one writes (the report reads those files).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scenario:
    """``module`` run as ``python -m``; ``full``/``quick``: its arguments in a full or a
    ``--quick`` run (``{runs}`` and ``{results}`` are filled in by run_all)."""

    module: str
    result_file: str
    full: tuple[str, ...] = ()
    quick: tuple[str, ...] = ("--quick",)


FUZZ_TESTS = ("-q", "-p", "no:cacheprovider", "tests/process/test_fuzz_live.py")

SUITE = {
    "demo": Scenario("bench.scenarios.solve", "solve.json", ("--runs", "5"),
                     ("--runs", "1", "--out", "{results}/solve-quick.json")),
    "transport": Scenario("bench.scenarios.transport", "transport.json"),
    "latency": Scenario("bench.scenarios.latency", "latency.json"),
    "rlinkd_solve": Scenario("bench.scenarios.rlinkd_solve", "solve_compare.json", ("--runs", "{runs}")),
    "rllib": Scenario("bench.scenarios.rllib_baseline", "rllib.json", ("--runs", "{runs}")),
    "profile": Scenario("bench.scenarios.profile_demo", "profile.json"),
    "soak": Scenario("bench.scenarios.soak", "soak.json", (),
                     ("--duration-s", "60", "--out", "{results}/soak-quick.json")),
    "chaos": Scenario("bench.scenarios.chaos", "chaos.json", (),
                      ("--kills", "4", "--out", "{results}/chaos-quick.json")),
    "fuzz": Scenario("pytest", "fuzz.json", FUZZ_TESTS, FUZZ_TESTS),
    "flood": Scenario("bench.scenarios.flood", "flood.json", (),
                      ("--quick", "--out", "{results}/flood-quick.json")),
    "image_ingest": Scenario("bench.scenarios.image_ingest", "image_ingest.json", (),
                             ("--quick", "--out", "{results}/image_ingest-quick.json")),
    "minatar": Scenario("bench.scenarios.minatar", "minatar.json", (),
                        ("--quick", "--out", "{results}/minatar-quick.json")),
    "vector": Scenario("bench.scenarios.vector", "vector.json", ("--runs", "{runs}"),
                       ("--quick", "--out", "{results}/vector-quick.json")),
    "multiagent": Scenario("bench.scenarios.multiagent", "multiagent.json", ("--runs", "{runs}"),
                           ("--quick", "--out", "{results}/multiagent-quick.json")),
    "serving": Scenario("bench.scenarios.serving", "serving.json", ("--runs", "{runs}"),
                        ("--quick", "--out", "{results}/serving-quick.json")),
    "offpolicy": Scenario("bench.scenarios.offpolicy", "offpolicy.json", ("--runs", "{runs}"),
                          ("--quick", "--out", "{results}/offpolicy-quick.json")),
    "sac_pendulum": Scenario("bench.scenarios.sac_pendulum", "sac_pendulum.json", ("--runs", "{runs}"),
                             ("--quick", "--out", "{results}/sac_pendulum-quick.json")),
    "dqn_cartpole": Scenario("bench.scenarios.dqn_cartpole", "dqn_cartpole.json", ("--runs", "{runs}"),
                             ("--quick", "--out", "{results}/dqn_cartpole-quick.json")),
    "native_ab": Scenario("bench.scenarios.native_ab", "native_ab.json", ("--runs", "5"),
                          ("--quick", "--out", "{results}/native_ab-quick.json")),
    "recurrent_step_ab": Scenario("bench.scenarios.recurrent_step_ab", "recurrent_step_ab.json", ("--runs", "7"),
                                  ("--quick", "--out", "{results}/recurrent_step_ab-quick.json")),
    "c_local": Scenario("bench.scenarios.c_local", "c_local.json", ("--runs", "5"),
                        ("--quick", "--out", "{results}/c_local-quick.json")),
    "c_client": Scenario("bench.scenarios.c_client", "c_client.json", ("--runs", "{runs}"),
                         ("--quick", "--out", "{results}/c_client-quick.json")),
    "lunar": Scenario("bench.scenarios.lunar", "lunar.json", ("--runs", "{runs}"),
                      ("--quick", "--out", "{results}/lunar-quick.json")),
    "learner_device": Scenario("bench.scenarios.learner_device", "learner_device.json",
                               ("--runs", "{runs}"),
                               ("--quick", "--out", "{results}/learner_device-quick.json")),
    "memory_cartpole": Scenario("bench.scenarios.memory_cartpole", "memory_cartpole.json",
                                ("--runs", "{runs}"),
                                ("--quick", "--out", "{results}/memory_cartpole-quick.json")),
    "memory_cost": Scenario("bench.scenarios.memory_cost", "memory_cost.json", ("--runs", "{runs}"),
                            ("--quick", "--out", "{results}/memory_cost-quick.json")),
    "cluster_jobs": Scenario("bench.scenarios.cluster_jobs", "cluster_jobs.json",
                             ("--solve-runs", "{runs}"),
                             ("--seconds", "10", "--solve-runs", "0",
                              "--out", "{results}/cluster_jobs-quick.json")),
    "cluster_replay": Scenario("bench.scenarios.cluster_replay", "cluster_replay.json", (),
                               ("--steps", "40", "--out", "{results}/cluster_replay-quick.json")),
}
