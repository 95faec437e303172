"""QMixer: monotonic in every agent's utility, graphs mixed independently."""

import torch

from agmarl_trainer.mixer import QMixer


def test_value_is_monotonic_in_each_agent_utility():
    torch.manual_seed(0)
    mixer = QMixer(state_dim=6, embed=8)
    q = torch.randn(7, requires_grad=True)
    batch = torch.tensor([0, 0, 0, 1, 1, 2, 2])
    v = mixer(q, batch, torch.randn(3, 6))
    assert v.shape == (3,)
    (grad,) = torch.autograd.grad(v.sum(), q)
    assert (grad >= 0).all()


def test_graphs_do_not_mix():
    torch.manual_seed(1)
    mixer = QMixer(state_dim=4, embed=8)
    state = torch.randn(2, 4)
    batch = torch.tensor([0, 0, 1])
    v1 = mixer(torch.tensor([1.0, 2.0, 3.0]), batch, state)
    v2 = mixer(torch.tensor([1.0, 2.0, -5.0]), batch, state)
    assert torch.allclose(v1[0], v2[0]) and not torch.allclose(v1[1], v2[1])
