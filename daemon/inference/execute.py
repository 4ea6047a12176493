"""The execute stage of a serving turn: admitted requests answered, their steps recorded.

``InferenceServer._serve_policy`` (server.py) refreshes a policy's weights, routes its
admitted lanes (``turn.route_natively``) and calls one of three entries here:

- ``natively``: lone clients' requests in ``turn.lone_order``, runs of them per call of the
  native lone step (native/step.c through ``LoneStepper``), until done or a sample cut;
- ``one``: a lone request in Python (``LaneBook.apply_one``, one forward pass of one row);
- ``many``: a batch (``LaneBook.apply``, one forward pass over every row).

Each writes the answers into the lanes and hands the step records to the publish stage
(``publish.Publisher.send``); none rings a client (the caller wakes the answered lanes).
"""
from __future__ import annotations

import numpy as np

from rlinkd.client_lib.protocol.serving import EvalEpisode
from rlinkd.daemon.inference import turn
from rlinkd.daemon.inference.backend import PolicyRunner
from rlinkd.daemon.inference.episodes import LaneBook, Requests, concat
from rlinkd.daemon.inference.lonestep import END, EVAL_END, START, LoneStepper
from rlinkd.daemon.inference.policy_lanes import PolicyLanes
from rlinkd.daemon.inference.publish import Publisher
from rlinkd.daemon.inference.policy_serving import PolicyServing, ServingStats


class Executor:
    """The execute stage of one ``InferenceServer`` (its stats, its publish stage)."""

    def __init__(self, stats: ServingStats, publish: Publisher) -> None:
        self.stats, self.publish = stats, publish

    def natively(self, name: str, policy: PolicyServing, pl: PolicyLanes,
                        idx: np.ndarray) -> tuple[np.ndarray, int]:
        """The order and execute stages for lone clients' requests: in ``turn.lone_order``
        (ENDs first), runs of them per native call (``_lone_run``) until done or until a
        sample cut holds the policy, which leaves the rest (``turn.after_cut``) for the next
        turns, as that many turns of one request would. Returns (the grouped lanes, left to
        the batch path; requests served here)."""
        order, left = turn.lone_order(pl.region.lanes, idx)
        was_held, pos = policy.held, 0
        while pos < len(order) and not (policy.held and not was_held):
            pos = self._lone_run(name, policy, pl, order, pos)
        if policy.held and not was_held:  # (a sample cut: nothing more with these weights)
            pl.defer(turn.after_cut(order, pos, left))
            left = left[:0]
        if pos:
            pl.wake(order[:pos])
        return left, pos

    def _lone_run(self, name: str, policy: PolicyServing, pl: PolicyLanes, order: np.ndarray, pos: int) -> int:
        """One native call from ``order[pos]`` (``LoneStepper.serve``: it stops at the sample
        boundary and where an episode starts or ends, ``_native_event``), its records handed
        on, then ``one`` for a request it declined. Returns the next position."""
        lone, runner, lanes = policy.lone, policy.runner, pl.region.lanes
        assert lone is not None
        link = policy.link
        cutting = link is not None and link.connected and not link.held
        max_steps = turn.steps_to_boundary(policy.sample_steps, 0 if link is None else link.steps, cutting)
        nxt, records, steps, declined, event = lone.serve(lanes, order, pos, pl.book, runner, max_steps)
        answered = nxt - pos
        if event is not None:
            answered -= self._native_event(name, policy, pl, int(order[nxt - 1]), event)
        self.stats.lone(answered)
        if records or steps:
            self.publish.send(name, lone.records[:records], steps)
        if declined:  # (the Python path, for this one request)
            req = Requests.read(lanes, order[nxt:nxt + 1])
            self.one(name, policy, pl, req, bool(runner.bad_rows(req.obs)[0]))
            nxt += 1
        return nxt

    def _native_event(self, name: str, policy: PolicyServing, pl: PolicyLanes, lane: int, event: tuple) -> int:
        """What ``LoneStepper.serve`` left to Python about ``lane``'s episode (see there).
        Returns 1 for an END (a request answered without an action), else 0."""
        kind = event[0]
        if kind == START:
            LoneStepper.take_slot(pl.book, lane)
            return 0
        self.stats.requests += 1
        if kind == EVAL_END:
            _, episode_return, length, seq = event
            policy.eval_ends.append(EvalEpisode(episode_return, length, seq, policy_id=name))
        else:
            assert kind == END, event
            if event[1] >= 0:  # (the training episode's slot goes back)
                pl.book.slots.give(int(event[1]))
        return 1

    def many(self, name: str, policy: PolicyServing, pl: PolicyLanes, req: Requests,
                    bad: np.ndarray) -> None:
        runner, lanes, seq = policy.runner, pl.region.lanes, policy.runner.weights_seq_no
        out = pl.book.apply(req, bad)
        wants = out.wants_action
        n = int(np.count_nonzero(wants))
        if n:
            sel = req.lanes[wants]
            actions, logp, dist, state_out = act(runner, pl.book, req.obs[wants], out.explore[wants], sel)
            lanes["action"][sel], lanes["logp"][sel] = actions, logp
            pl.book.remember(req, wants, actions, logp, dist, seq, state_out)
            self.stats.batch(n)
            self.stats.actions += n
        lanes["status"][req.lanes], lanes["weights_seq_no"][req.lanes] = out.status, seq
        lanes["resp_seq"][req.lanes] = req.seqs
        self.stats.requests += len(req)
        self.stats.errors += int(np.count_nonzero(out.status))
        policy.eval_ends += [EvalEpisode(e.episode_return, e.episode_length, e.weights_seq_no,
                                         policy_id=name) for e in out.eval_ends]
        if len(out.records) or out.train_steps:
            self.publish.send(name, out.records, out.train_steps)

    def one(self, name: str, policy: PolicyServing, pl: PolicyLanes, req: Requests,
                   bad: bool) -> None:
        """``many`` for a lone request, in scalar code (a lone client's every step)."""
        runner, lane, book = policy.runner, int(req.lanes[0]), pl.book
        out: list[np.ndarray] = []
        status, wants, explore, ended, steps = book.apply_one(
            lane, int(req.ops[0]), int(req.flags[0]), float(req.rewards[0]), req.obs[0], bad, out)
        row = pl.region.lanes[lane]
        if wants:
            actions, logp, dist, state_out = act(runner, book, req.obs, np.array([explore]), req.lanes)
            row["action"], row["logp"] = actions[0], logp[0]
            book.remember_one(lane, req.obs[0], actions[0], float(logp[0]), dist[0], runner.weights_seq_no,
                              None if state_out is None else state_out[0])
            self.stats.batch(1)
            self.stats.actions += 1
        row["status"], row["weights_seq_no"] = status, runner.weights_seq_no
        row["resp_seq"] = req.seqs[0]
        self.stats.requests += 1
        self.stats.errors += status != 0
        if ended is not None:
            policy.eval_ends.append(EvalEpisode(ended.episode_return, ended.episode_length,
                                                ended.weights_seq_no, policy_id=name))
        if out or steps:
            self.publish.send(name, concat(out, book.layout), steps)


def act(runner: PolicyRunner, book: LaneBook, obs_rows: np.ndarray, explore: np.ndarray,
        lanes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    """(actions, logp, dist, state out or None) for the lanes' observations: a recurrent
    policy's forward is fed the lanes' states (``LaneBook.state``)."""
    if not book.max_seq_len:
        return (*runner.act(obs_rows, explore), None)
    return runner.act_with_state(obs_rows, explore, book.state[lanes])
