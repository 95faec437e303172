"""Networks of the learned policy (training side, PyG): node encoder, pod actor, centralised critic.

Heterogeneous graph (``agmarl_common.core.features.HeteroGraph``), node types ``node`` and ``pod``:

    ('node', 'near', 'node')  rack / zone neighbours, self loops in the data   -> GATEncoder
    ('node', 'cand', 'pod')   candidate node -> pending pod, edge attr F_EDGE  -> PodActor (pod attends over candidates)
    ('pod', 'rev', 'node')    pending pod -> candidate node                    -> CentralCritic
    ('pod', 'peer', 'pod')    same service / affinity, self loops              -> CentralCritic

Every GATConv has ``add_self_loops=False`` (self loops are in the data) so the modules export to ONNX;
``export.py`` re-implements the encoder and actor row-wise with the same weights for serving.

Each pending pod is an agent; the actor's parameters are shared. The actor reads the pod, its
candidates and the node embeddings only (decentralised execution); the critic reads the whole graph,
pod -> pod edges included (centralised training) and mixes per-pod utilities monotonically (mixer.py).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import GATConv, HeteroConv
from torch_geometric.utils import scatter

from agmarl_common.core.features import F_EDGE, F_NODE, F_POD
from agmarl_trainer.mixer import QMixer

NEAR = ("node", "near", "node")
CAND = ("node", "cand", "pod")
REV = ("pod", "rev", "node")
PEER = ("pod", "peer", "pod")


@dataclass(frozen=True)
class NetConfig:
    hidden: int = 32  # H, node / pod embedding width
    heads: int = 2  # attention heads, averaged (concat=False)
    encoder_layers: int = 2
    mlp: int = 64  # width of the pair scorer


def _gat(in_ch, out_ch: int, heads: int, edge_dim: int | None = None) -> GATConv:
    conv = GATConv(in_ch, out_ch, heads=heads, concat=False, add_self_loops=False, residual=True,
                   edge_dim=edge_dim)
    remove_generated_sources()
    return conv


def remove_generated_sources() -> None:
    """Delete the source files PyG generated for this process's message-passing modules.

    The first GATConv a process builds renders its ``propagate`` / ``edge_updater`` from templates into files in
    the temporary directory, imports them and keeps them there (``torch_geometric.template.module_from_template``,
    ``delete=False``): two files per training run, test worker or export that are never removed. Once imported
    the modules live in ``sys.modules`` and the files are not read again, so they are deleted here: only files
    in the temporary directory that back a ``torch_geometric`` module of this process."""
    tmp = os.path.realpath(tempfile.gettempdir())
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) or ""
        if name.startswith("torch_geometric.") and path and os.path.dirname(os.path.realpath(path)) == tmp:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


class GATEncoder(nn.Module):
    """Node embeddings from node features over node -> node edges.

    Per layer l (GAT, heads averaged, residual):
        h_i^{l+1} = ELU( mean_k sum_{j in N(i)} a_ij^k W^k h_j^l + R h_i^l + b ),
        a_ij^k = softmax_j LeakyReLU(s^k . W^k h_j + d^k . W^k h_i).

    Args: cfg (hidden H, heads, encoder_layers).
    Shapes: node_x (N, F_NODE), nn_edge_index (2, E_nn) -> (N, H).
    """

    def __init__(self, cfg: NetConfig = NetConfig()):
        super().__init__()
        self.convs = nn.ModuleList([
            HeteroConv({NEAR: _gat(F_NODE if layer == 0 else cfg.hidden, cfg.hidden, cfg.heads)}, aggr="sum")
            for layer in range(cfg.encoder_layers)
        ])

    def forward(self, node_x: Tensor, nn_edge_index: Tensor) -> Tensor:
        h = node_x  # (N, F_NODE)
        for conv in self.convs:
            h = F.elu(conv({"node": h}, {NEAR: nn_edge_index})["node"])  # (N, H)
        return h


class PodActor(nn.Module):
    """Scores (pod, candidate node) pairs; one shared set of parameters for every pod agent.

    pod_h_p = ELU(GAT_{node->pod}([node_emb | node_x], pod_x, cand_attr))     (pod attends over its candidates)
    logit_e = MLP([pod_h_{p(e)} | node_emb_{n(e)} | pod_x_{p(e)} | node_x_{n(e)} | cand_attr_e])

    Args: cfg. Shapes: node_emb (N, H), node_x (N, F_NODE), pod_x (P, F_POD), cand_pod (E,), cand_node (E,),
    cand_attr (E, F_EDGE) -> logits (E,) [, attention (E,) = the GAT weights of each candidate, heads averaged].
    """

    def __init__(self, cfg: NetConfig = NetConfig()):
        super().__init__()
        h = cfg.hidden
        with warnings.catch_warnings():  # node types are sources only here, by design
            warnings.filterwarnings("ignore", message="There exist node types")
            self.conv = HeteroConv({CAND: _gat((h + F_NODE, F_POD), h, cfg.heads, edge_dim=F_EDGE)}, aggr="sum")
        self.score = nn.Sequential(
            nn.Linear(2 * h + F_POD + F_NODE + F_EDGE, cfg.mlp), nn.ReLU(),
            nn.Linear(cfg.mlp, cfg.mlp), nn.ReLU(),
            nn.Linear(cfg.mlp, 1),
        )

    def forward(self, node_emb: Tensor, node_x: Tensor, pod_x: Tensor, cand_pod: Tensor, cand_node: Tensor,
                cand_attr: Tensor, return_attention: bool = False):
        src = torch.cat([node_emb, node_x], dim=1)  # (N, H + F_NODE)
        edge = torch.stack([cand_node, cand_pod])  # (2, E) node -> pod
        if return_attention:
            out, (_, alpha) = self.conv.convs[CAND]((src, pod_x), edge, edge_attr=cand_attr,
                                                    return_attention_weights=True)
        else:
            out = self.conv({"node": src, "pod": pod_x}, {CAND: edge}, edge_attr_dict={CAND: cand_attr})["pod"]
        pod_h = F.elu(out)  # (P, H)
        z = torch.cat([pod_h[cand_pod], node_emb[cand_node], pod_x[cand_pod], node_x[cand_node], cand_attr], 1)
        logits = self.score(z).squeeze(-1)  # (E,)
        if return_attention:
            return logits, alpha.mean(dim=-1)  # (E,), (E,)
        return logits


class CentralCritic(nn.Module):
    """Centralised value over the whole graph (training only, never exported).

    One HeteroConv layer over near / cand / rev / peer edges, per-pod utilities q_p = MLP(pod_h_p), and a
    monotonic QMIX-style mixer conditioned on the pooled graph state s_g = [mean node_h | mean pod_h]:
        V_g = QMixer({q_p : p in g}, s_g).
    Shapes: node_emb (N, H), pod_x (P, F_POD), edges as in the graph, node_batch (N,), pod_batch (P,),
    n_graphs G -> (G,).
    """

    def __init__(self, cfg: NetConfig = NetConfig()):
        super().__init__()
        h = cfg.hidden
        self.pod_in = nn.Linear(F_POD, h)
        self.conv = HeteroConv({
            NEAR: _gat(h, h, cfg.heads),
            CAND: _gat((h, h), h, cfg.heads, edge_dim=F_EDGE),
            REV: _gat((h, h), h, cfg.heads, edge_dim=F_EDGE),
            PEER: _gat(h, h, cfg.heads),
        }, aggr="sum")
        self.utility = nn.Sequential(nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 1))
        self.mixer = QMixer(state_dim=2 * h, embed=h)

    def forward(self, node_emb: Tensor, pod_x: Tensor, nn_edge_index: Tensor, pp_edge_index: Tensor,
                cand_pod: Tensor, cand_node: Tensor, cand_attr: Tensor, node_batch: Tensor, pod_batch: Tensor,
                n_graphs: int) -> Tensor:
        x = {"node": node_emb, "pod": F.elu(self.pod_in(pod_x))}  # (N, H), (P, H)
        edges = {NEAR: nn_edge_index, CAND: torch.stack([cand_node, cand_pod]),
                 REV: torch.stack([cand_pod, cand_node]), PEER: pp_edge_index}
        attrs = {CAND: cand_attr, REV: cand_attr}
        h = {k: F.elu(v) for k, v in self.conv(x, edges, edge_attr_dict=attrs).items()}
        state = torch.cat([scatter(h["node"], node_batch, 0, n_graphs, reduce="mean"),
                           scatter(h["pod"], pod_batch, 0, n_graphs, reduce="mean")], dim=1)  # (G, 2H)
        q = self.utility(h["pod"]).squeeze(-1)  # (P,)
        return self.mixer(q, pod_batch, state)  # (G,)


class PolicyNet(nn.Module):
    """Encoder + actor + critic, the unit that is trained, checkpointed and exported."""

    def __init__(self, cfg: NetConfig = NetConfig()):
        super().__init__()
        self.cfg = cfg
        self.encoder = GATEncoder(cfg)
        self.actor = PodActor(cfg)
        self.critic = CentralCritic(cfg)

    def forward(self, g: dict[str, Tensor], with_value: bool = False):
        """Logits (E,) of a batched graph, and the critic's values (G,) when ``with_value`` (DDP calls this)."""
        return self.logits_and_value(g) if with_value else self.logits(g)

    def logits(self, g: dict[str, Tensor]) -> Tensor:
        """Candidate logits (E,) of a (batched) graph dict of tensors."""
        node_emb = self.encoder(g["node_x"], g["nn_edge_index"])
        return self.actor(node_emb, g["node_x"], g["pod_x"], g["cand_pod"], g["cand_node"], g["cand_attr"])

    def logits_and_value(self, g: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        node_emb = self.encoder(g["node_x"], g["nn_edge_index"])
        logits = self.actor(node_emb, g["node_x"], g["pod_x"], g["cand_pod"], g["cand_node"], g["cand_attr"])
        # the critic reads the encoder's output but does not train it: value errors never move the actor
        value = self.critic(node_emb.detach(), g["pod_x"], g["nn_edge_index"], g["pp_edge_index"], g["cand_pod"],
                            g["cand_node"], g["cand_attr"], g["node_batch"], g["pod_batch"], int(g["n_graphs"]))
        return logits, value
