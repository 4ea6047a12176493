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


def test_a_closed_gate_leaves_weights_moments_and_step_count():
    model, opt = train(lambda m: Adam(m.parameters(), lr=1e-2), steps=3)
    state = [t.clone() for t in (opt.flat, opt.m, opt.v)]
    opt.zero_grad()
    model(torch.randn(4, 5)).sum().backward()  # finite gradients, but the gate says skip
    opt.step(torch.zeros(()))
    assert opt.step_count == 3
    for before, after in zip(state, (opt.flat, opt.m, opt.v)):
        assert torch.equal(before, after)
    opt.step(torch.ones(()))
    assert opt.step_count == 4 and not torch.equal(state[0], opt.flat)


def test_parameters_and_gradients_are_views_of_the_flat_buffers():
    model, opt = train(lambda m: Adam(m.parameters(), lr=1e-2), steps=2)
    flat, grad = opt.flat.data_ptr(), opt.grad.data_ptr()
    ends = (flat, flat + opt.flat.numel() * 4)
    for p in model.parameters():
        assert ends[0] <= p.data_ptr() < ends[1] and p.grad.data_ptr() >= grad
    opt.param_groups[0]["lr"] = 0.125  # a reload copies into the device tensor
    assert float(opt.lr_t) == 0.125 and opt.state_dict()["param_groups"][0]["lr"] == 0.125
