"""QMIX-style monotonic mixer over a variable number of agents per graph (EPyMARL's qmix, segment form).

    hidden_g = ELU( sum_{a in g} q_a * |W1(s_g)| + b1(s_g) )          # (G, embed)
    V_g      = hidden_g . |W2(s_g)| + V(s_g)                          # (G,)

dV_g/dq_a >= 0 for every agent (absolute hypernetwork weights), so improving one pod's utility never
lowers the team value: the argmax of each agent's own utility is consistent with the joint argmax.
Agents of a batch of graphs are given as a flat vector with their graph index (``agent_batch``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class QMixer(nn.Module):
    """Args: state_dim (width of s_g), embed (mixing width, default 32).
    Shapes: q (A,), agent_batch (A,) int64 in [0, G), state (G, state_dim) -> (G,)."""

    def __init__(self, state_dim: int, embed: int = 32):
        super().__init__()
        self.embed = embed
        self.hyper_w1 = nn.Linear(state_dim, embed)
        self.hyper_b1 = nn.Linear(state_dim, embed)
        self.hyper_w2 = nn.Linear(state_dim, embed)
        self.hyper_v = nn.Sequential(nn.Linear(state_dim, embed), nn.ReLU(), nn.Linear(embed, 1))

    def forward(self, q: Tensor, agent_batch: Tensor, state: Tensor) -> Tensor:
        g = state.shape[0]
        w1 = torch.abs(self.hyper_w1(state))[agent_batch]  # (A, embed)
        mixed = torch.zeros(g, self.embed, dtype=q.dtype, device=q.device)
        mixed = mixed.index_add(0, agent_batch, q.unsqueeze(-1) * w1)  # (G, embed)
        hidden = F.elu(mixed + self.hyper_b1(state))  # (G, embed)
        w2 = torch.abs(self.hyper_w2(state))  # (G, embed)
        return (hidden * w2).sum(dim=-1) + self.hyper_v(state).squeeze(-1)  # (G,)
