"""Pure pieces of the training loop: GAE, seed ranges, PPO terms on a batch."""

import numpy as np
import pytest
import torch

from agmarl_common.core.features import F_EDGE, F_NODE, F_POD, HeteroGraph
from agmarl_trainer.cli import parse_seeds
from agmarl_trainer.model import NetConfig, PolicyNet
from agmarl_trainer.rollout import Sample
from agmarl_trainer.train import gae, ppo_terms


@pytest.mark.parametrize("text,seeds", [("42-51", list(range(42, 52))), ("1,3,5", [1, 3, 5]), ("", []),
                                        ("7, 9-10", [7, 9, 10])])
def test_parse_seeds(text, seeds):
    assert parse_seeds(text) == seeds


def test_gae_with_lambda_one_is_return_minus_value_and_stops_at_episode_ends():
    rewards = np.array([1.0, 2.0, 3.0, 10.0, 20.0])
    values = np.array([0.5, 0.5, 0.5, 1.0, 1.0])
    dones = np.array([False, False, True, False, True])
    adv = gae(rewards, values, dones, gamma=1.0, lam=1.0)
    assert np.allclose(adv, [6 - 0.5, 5 - 0.5, 3 - 0.5, 30 - 1.0, 20 - 1.0])
    adv0 = gae(rewards, values, dones, gamma=1.0, lam=0.0)  # one-step TD errors
    assert np.allclose(adv0, [1 + 0.5 - 0.5, 2 + 0.5 - 0.5, 3 - 0.5, 10 + 1 - 1, 20 - 1])


def random_graph(rng: np.random.Generator, n: int, p: int, per: int) -> HeteroGraph:
    """n nodes with self loops, p pods, each with candidates 0..per-1, random feature rows."""
    return HeteroGraph(rng.random((n, F_NODE), dtype=np.float32), rng.random((p, F_POD), dtype=np.float32),
                       np.stack([np.arange(n)] * 2), np.stack([np.arange(p)] * 2), np.repeat(np.arange(p), per),
                       np.tile(np.arange(per), p), rng.random((p * per, F_EDGE), dtype=np.float32), np.full(p * per, -1))


def test_ppo_terms_sum_the_log_probs_of_a_rounds_agents():
    g = random_graph(np.random.default_rng(0), 5, 2, 3)
    torch.manual_seed(0)
    net = PolicyNet(NetConfig(hidden=8, mlp=16))
    joint, entropy, values = ppo_terms(net, [Sample(g, np.array([1, 5]))])
    logits = net.logits({k: torch.from_numpy(getattr(g, k)) for k in
                         ("node_x", "nn_edge_index", "pod_x", "cand_pod", "cand_node", "cand_attr")})
    expect = torch.log_softmax(logits[:3], 0)[1] + torch.log_softmax(logits[3:], 0)[2]
    assert torch.allclose(joint[0], expect, atol=1e-6)
    assert values.shape == (1,) and 0 < float(entropy.detach()) <= np.log(3) + 1e-6


def test_logit_penalty_adds_the_mean_squared_logit_and_shrinks_large_logits():
    from agmarl_trainer.imitation import imitation_loss

    g = random_graph(np.random.default_rng(1), 6, 2, 3)
    sample = Sample(g, np.array([0, 4]))
    torch.manual_seed(0)
    net = PolicyNet(NetConfig(hidden=8, mlp=16))
    with torch.no_grad():
        net.actor.score[-1].bias.fill_(50.0)  # logits around 50: the penalty dominates
    plain, _ = imitation_loss(net, [sample])
    penalised, _ = imitation_loss(net, [sample], logit_penalty=0.01)
    logits = net.logits({k: torch.from_numpy(getattr(g, k)) for k in
                         ("node_x", "nn_edge_index", "pod_x", "cand_pod", "cand_node", "cand_attr")})
    assert float((penalised - plain).detach()) == pytest.approx(0.01 * float((logits ** 2).mean().detach()), rel=1e-5)
    keys = ("node_x", "nn_edge_index", "pod_x", "cand_pod", "cand_node", "cand_attr")
    start = {k: v.clone() for k, v in net.state_dict().items()}
    peak = {}
    for penalty in (0.0, 0.1):  # cross-entropy alone is blind to a common shift of the logits
        net.load_state_dict(start)
        opt = torch.optim.Adam(net.parameters(), lr=0.05)
        for _ in range(50):
            loss, _ = imitation_loss(net, [sample], logit_penalty=penalty)
            opt.zero_grad()
            loss.backward()
            opt.step()
        peak[penalty] = float(net.logits({k: torch.from_numpy(getattr(g, k)) for k in keys}).abs().max().detach())
    assert peak[0.0] > 40 and peak[0.1] < 25
