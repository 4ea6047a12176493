"""V-trace (Espeholt et al. 2018, IMPALA), numpy only: value targets and policy-gradient
advantages for steps acted by an older policy mu and trained for the current policy pi.

The connector calls `compute_vtrace` once per APPO train batch (rows laid out as for
`compute_gae`: one or more segments end to end). It must not import torch.
"""

from __future__ import annotations

import numpy as np

from rlinkd.daemon.connector.gae import _discounted_reverse_sum


def compute_vtrace(rewards: np.ndarray, values: np.ndarray, next_values: np.ndarray,
                   terminated: np.ndarray, segment_end: np.ndarray, log_rhos: np.ndarray,
                   gamma: float, lam: float, rho_bar: float = 1.0, c_bar: float = 1.0
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(pg advantages [N], value targets v_s [N]) as float32. ``log_rhos`` = log pi(a|s) -
    log mu(a|s) per row; ``next_values[t]`` is V(s_{t+1}), V(final obs) on a segment's last
    row (bootstrap), zeroed there by ``terminated``. Raises ValueError on mismatched shapes.

        rho_t  = min(rho_bar, pi/mu)          c_t = lam * min(c_bar, pi/mu)
        delta_t = rho_t (r_t + g V(s_t+1) (1 - term_t) - V(s_t))
        v_s - V(s_t) = delta_t + g c_t (1 - end_t) (v_s+1 - V(s_t+1))
        adv_t  = rho_t (r_t + g v_s+1 (1 - term_t) - V(s_t)),  v_s+1 = V(final obs) at a segment end

    With pi = mu (all log_rhos 0), rho_bar, c_bar >= 1: v_s is GAE(lam)'s value target.
    """
    rewards = np.asarray(rewards, np.float64)                         # [N]
    values = np.asarray(values, np.float64)                           # [N]
    next_values = np.asarray(next_values, np.float64)                 # [N]
    log_rhos = np.asarray(log_rhos, np.float64)                       # [N]
    terminated, segment_end = np.asarray(terminated, bool), np.asarray(segment_end, bool)
    shapes = {a.shape for a in (rewards, values, next_values, terminated, segment_end, log_rhos)}
    if len(shapes) != 1 or rewards.ndim != 1:
        raise ValueError(f"compute_vtrace needs six equal 1-D arrays, got shapes {shapes}")

    ratios = np.exp(np.minimum(log_rhos, 50.0))                       # pi/mu [N] (capped: no inf)
    rho = np.minimum(rho_bar, ratios)                                 # [N]
    c = lam * np.minimum(c_bar, ratios)                               # [N]
    bootstrap = gamma * next_values * ~terminated                     # [N]
    deltas = rho * (rewards + bootstrap - values)                     # [N]
    decay = gamma * c * ~segment_end                                  # [N], 0 where a segment ends
    vs = values + _discounted_reverse_sum(deltas.tolist(), decay.tolist())  # [N]
    vs_next = np.empty_like(vs)                                       # v_s+1 [N]
    vs_next[:-1] = vs[1:]
    vs_next[segment_end] = next_values[segment_end]                   # bootstrap: V(final obs)
    advantages = rho * (rewards + gamma * vs_next * ~terminated - values)
    return advantages.astype(np.float32), vs.astype(np.float32)
