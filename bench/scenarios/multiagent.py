"""Many agents per connection: the cooperative Rendezvous task (tests/tasks/rendezvous.py)
through ``connect_multi`` — env steps/s with about 8, 32 and 128 agents on one connection,
and the learning curve of one team.

    python -m bench.scenarios.multiagent [--transport shm|tcp] [--runs 3] [--quick]

Throughput: one ``rlinkd serve`` (Rendezvous spaces, ``THROUGHPUT_SETTINGS``, so it trains
while the client samples; on-policy clients wait for each update) and one client process driving
K Rendezvous copies as ONE PettingZoo-style parallel env (agent ids ``<k>.<agent>``), so one
``act`` per step covers every present agent. K is chosen so the mean number of present agents
(7/3 per copy on average: two start, one joins, one leaves) is about 8, 32 and 128; the measured mean is
reported. Agent steps/s = agent steps (one agent acting once) / wall time over a fixed budget.

Learning curve: one copy (one team) per run, ``LEARN_SETTINGS``, until ``--learn-steps``
agent steps; mean return per agent episode in windows of ``WINDOW_STEPS`` agent steps, greedy
return at the end (``returns`` with the final weights, nothing sent); random ~0.5, the best
observation-ignoring policy ~4.5, the cooperative optimum ~17. Writes
bench/results/multiagent.json and bench/results/plots/multiagent_rendezvous.png.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from bench.harness.common import REPO, median_range, write_result
from bench.harness.daemon import Daemon

TEAM_SIZES = (8, 32, 128)
AGENTS_PER_COPY = 7 / 3
WINDOW_STEPS = 10_000
LEARN_SETTINGS = ["sampling.env_steps_per_sample=1024", "sampling.train_batch_size=2048",
                  "ppo.minibatch_size=512", "ppo.lr=0.001", "ppo.ent_coef=0.01"]
"""As tests/process/test_multi_agent.py (the smaller samples first tried, 128 steps at lr
0.003, learned but oscillated between 4 and 13)."""
THROUGHPUT_SETTINGS = ["sampling.env_steps_per_sample=4096", "sampling.train_batch_size=4096",
                       "ppo.minibatch_size=2048", "ppo.num_epochs=4"]
"""Samples and batches sized for many agents (as bench.scenarios.vector's 64 copies)."""


def spaces_overrides() -> list[str]:
    from tests.tasks.rendezvous import ACTION_SPACE_TOML, OBSERVATION_SPACE_TOML
    return [f"env.observation_space={OBSERVATION_SPACE_TOML}", f"env.action_space={ACTION_SPACE_TOML}"]


class Group:
    """K Rendezvous copies as one parallel env (ids ``<k>.<agent>``); counts agent steps."""

    def __init__(self, copies: int, seed: int) -> None:
        from tests.tasks.rendezvous import Rendezvous
        self.envs = [Rendezvous() for _ in range(copies)]
        self.possible_agents = [f"{k}.{a}" for k, e in enumerate(self.envs) for a in e.possible_agents]
        self.seed, self.agent_steps, self.steps, self.returns = seed, 0, 0, []
        self._open: dict[str, float] = {}

    @property
    def agents(self) -> list[str]:
        return [f"{k}.{a}" for k, e in enumerate(self.envs) for a in e.agents]

    def observation_space(self, agent: str):
        return self.envs[0].observation_space(agent)

    def action_space(self, agent: str):
        return self.envs[0].action_space(agent)

    def reset(self, seed: int | None = None, options: dict | None = None):
        obs = {}
        for k, env in enumerate(self.envs):
            o, _ = env.reset(seed=None if seed is None else seed + k)
            obs |= {f"{k}.{a}": x for a, x in o.items()}
        return obs, {a: {} for a in obs}

    def step(self, actions: dict):
        out: tuple[dict, dict, dict, dict, dict] = ({}, {}, {}, {}, {})
        for k, env in enumerate(self.envs):
            if not env.agents:  # this copy's episode is over: start the next one
                o, _ = env.reset()
                out[0].update({f"{k}.{a}": x for a, x in o.items()})
                continue
            mine = {a: actions[f"{k}.{a}"] for a in env.agents}
            self.agent_steps += len(mine)
            for part, values in zip(out, env.step(mine)):
                part.update({f"{k}.{a}": v for a, v in values.items()})
        self._account(out[1], out[2], out[3])
        self.steps += 1
        return out

    def _account(self, rewards: dict, terminated: dict, truncated: dict) -> None:
        for agent, r in rewards.items():
            self._open[agent] = self._open.get(agent, 0.0) + float(r)
            if terminated.get(agent) or truncated.get(agent):
                self.returns.append((self.agent_steps, self._open.pop(agent)))

    def close(self) -> None:
        """Nothing to release."""


def throughput(transport: str, agents: int, budget_s: float, seed: int) -> dict:
    from rlinkd.client_lib import connect_multi, run_env
    copies = max(1, round(agents / AGENTS_PER_COPY))
    with Daemon([*spaces_overrides(), *THROUGHPUT_SETTINGS]) as d:
        d.wait_ready()
        address = f"shm:{d.state_dir}" if transport == "shm" else f"tcp://127.0.0.1:{d.port}"
        group = Group(copies, seed)
        client = connect_multi(address, seed=seed)
        t0, deadline = time.monotonic(), time.monotonic() + budget_s
        try:
            run_env(group, client, should_stop=lambda _s: time.monotonic() >= deadline, seed=seed)
        finally:
            client.close()
        wall = time.monotonic() - t0
    return {"agents_target": agents, "copies": copies,
            "mean_present_agents": round(group.agent_steps / max(group.steps, 1), 1),
            "agent_steps": group.agent_steps, "agent_steps_per_s": round(group.agent_steps / wall)}


def greedy_policy(client):
    """The client's current default-policy weights, most likely action, nothing recorded."""
    local = client.book.get("default")

    def policy(obs: dict) -> dict:
        ids = list(obs)
        dist = local.net.dist_inputs({"": np.stack([obs[a] for a in ids]).astype(np.float32)})
        return dict(zip(ids, np.argmax(dist, axis=1).tolist()))
    return policy


def learning_run(transport: str, steps: int, seed: int) -> dict:
    from rlinkd.client_lib import connect_multi, run_env
    from tests.tasks.rendezvous import returns
    with Daemon([*spaces_overrides(), *LEARN_SETTINGS, f"learner.seed={seed}"]) as d:
        d.wait_ready()
        address = f"shm:{d.state_dir}" if transport == "shm" else f"tcp://127.0.0.1:{d.port}"
        group, client, t0 = Group(1, seed), connect_multi(address, seed=seed), time.monotonic()
        try:
            run_env(group, client, should_stop=lambda _s: group.agent_steps >= steps, seed=seed)
            greedy = returns(greedy_policy(client), episodes=100, seed=123)
        finally:
            client.close()
        wall = time.monotonic() - t0
    windows = []
    for end in range(WINDOW_STEPS, steps + 1, WINDOW_STEPS):
        chunk = [r for s, r in group.returns if end - WINDOW_STEPS < s <= end]
        if chunk:
            windows.append([end, round(float(np.mean(chunk)), 2)])
    return {"seed": seed, "wall_s": round(wall, 1), "agent_steps": group.agent_steps,
            "windows": windows, "greedy_return": round(greedy, 2)}


def plot(learning: list[dict], path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for run in learning:
        xs, ys = zip(*run["windows"]) if run["windows"] else ((), ())
        ax.plot(xs, ys, label=f"seed {run['seed']}")
    ax.axhline(4.5, ls="--", c="grey", lw=0.8, label="best observation-ignoring")
    ax.axhline(17, ls=":", c="black", lw=0.8, label="cooperative optimum")
    ax.set_xlabel("agent steps")
    ax.set_ylabel(f"mean return per agent episode\n(windows of {WINDOW_STEPS:,} steps)")
    ax.set_title("Rendezvous (3 agents, one team, connect_multi)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--transport", choices=("shm", "tcp"), default="shm")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=30.0, help="throughput run length")
    ap.add_argument("--learn-steps", type=int, default=150_000)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", help="result file (default: bench/results/multiagent.json)")
    args = ap.parse_args()
    runs = 1 if args.quick else args.runs
    budget = 5.0 if args.quick else args.budget_s
    tput = {n: [throughput(args.transport, n, budget, s) for s in range(runs)] for n in TEAM_SIZES}
    for n, rs in tput.items():
        print(json.dumps({"agents": n, "runs": rs}), flush=True)
    learning = [learning_run(args.transport, 20_000 if args.quick else args.learn_steps, s)
                for s in range(runs)]
    print(json.dumps({"learning": learning}), flush=True)
    result = {"transport": args.transport, "throughput": {
        str(n): {"runs": rs, "agent_steps_per_s": median_range([r["agent_steps_per_s"] for r in rs]),
                 "mean_present_agents": median_range([r["mean_present_agents"] for r in rs])}
        for n, rs in tput.items()},
        "learning": learning,
        "greedy_return": median_range([r["greedy_return"] for r in learning])}
    write_result("multiagent-quick" if args.quick else "multiagent", result, args.out)
    if not args.quick:
        plot(learning, REPO / "bench/results/plots/multiagent_rendezvous.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
