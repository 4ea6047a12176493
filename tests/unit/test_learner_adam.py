"""The learner's Adam matches torch.optim.Adam step for step, and round-trips its state."""
from __future__ import annotations

import io

import torch

from rlinkd.daemon.learner.adam import Adam


def train(make_opt, steps: int = 25):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    opt = make_opt(model)
    x, y = torch.randn(64, 5), torch.randn(64, 2)
    for i in range(steps):
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        if i == 10:
            opt.param_groups[0]["lr"] = 3e-3  # a live change, as SIGHUP does
        opt.step()
    return model, opt


def test_matches_torch_optim_adam():
    ours, _ = train(lambda m: Adam(m.parameters(), lr=1e-2, eps=1e-5))
    ref, _ = train(lambda m: torch.optim.Adam(m.parameters(), lr=1e-2, eps=1e-5))
    for a, b in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_state_round_trip_continues_identically():
    model, opt = train(lambda m: Adam(m.parameters(), lr=1e-2), steps=5)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
    saved = torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    clone = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    clone.load_state_dict(saved["model"])
    clone_opt = Adam(clone.parameters(), lr=0.5)
    clone_opt.load_state_dict(saved["opt"])
    assert clone_opt.step_count == 5 and clone_opt.param_groups[0]["lr"] == 1e-2
    x = torch.randn(16, 5)
    for m, o in ((model, opt), (clone, clone_opt)):
        o.zero_grad()
        m(x).sum().backward()
        o.step()
    for a, b in zip(model.parameters(), clone.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
