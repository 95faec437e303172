"""ONNX export: row-wise GAT modules that load the trained PyG weights, exported as two graphs.

PyG's GATConv exports, but its scatter-based softmax runs 2-4x slower in ONNX Runtime than in torch at
1,000+ nodes (ScatterElements). ``RowGAT`` computes the same layer with index_select / index_add only:

    s_e     = LeakyReLU(att_src . W_s x_src[j] + att_dst . W_d x_dst[i] (+ att_edge . W_e attr_e))   (E, heads)
    alpha_e = exp(s_e - m) / (sum_{e' -> i} exp(s_e' - m) + 1e-16)       m = max(0, max_e s_e) per head
    out_i   = mean_heads sum_{e: j -> i} alpha_e W_s x_src[j] + R x_dst[i] + b

Subtracting one maximum for all destinations instead of each destination's own is the same softmax
(the shift cancels); attention scores stay far inside float32 range for these inputs, which the parity
test checks against PyG on random and real graphs.

Files: ``encoder.onnx`` (node_x, nn_edge_index) -> node_emb and ``actor.onnx`` (node_emb, node_x, pod_x,
cand_pod, cand_node, cand_attr) -> (logits, attention); dynamic N, P, E, E_nn; opset 18, dynamo exporter.
ONNX Runtime must run them with intra_op_num_threads=1 (ScatterND with duplicate indices is wrong with
more threads in ORT 1.32).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import GATConv

from agmarl_common.core.features import F_EDGE, F_NODE, F_POD
from agmarl_trainer.model import CAND, NEAR, PolicyNet

OPSET = 18
ENCODER_FILE, ACTOR_FILE = "encoder.onnx", "actor.onnx"
ENCODER_INPUTS = ("node_x", "nn_edge_index")
ENCODER_OUTPUTS = ("node_emb",)
ACTOR_INPUTS = ("node_emb", "node_x", "pod_x", "cand_pod", "cand_node", "cand_attr")
ACTOR_OUTPUTS = ("logits", "attention")


class RowGAT(nn.Module):
    """GATConv (concat=False, add_self_loops=False, optional residual / edge_dim) with a row-wise softmax.

    Holds the very parameters of ``conv`` (shared, not copied). Shapes: x_src (Ns, Fs), x_dst (Nd, Fd),
    edge_index (2, E) src -> dst, edge_attr (E, F_e) or None -> out (Nd, C), alpha (E, heads).
    """

    def __init__(self, conv: GATConv):
        super().__init__()
        if conv.concat:
            raise ValueError("RowGAT supports concat=False only")
        self.heads, self.channels = conv.heads, conv.out_channels
        self.slope = conv.negative_slope
        self.lin_src = conv.lin if conv.lin is not None else conv.lin_src
        self.lin_dst = conv.lin if conv.lin is not None else conv.lin_dst
        self.att_src, self.att_dst = conv.att_src, conv.att_dst
        self.lin_edge, self.att_edge = conv.lin_edge, conv.att_edge
        self.res, self.bias = conv.res, conv.bias

    def forward(self, x_src: Tensor, x_dst: Tensor, edge_index: Tensor, edge_attr: Tensor | None = None):
        h, c = self.heads, self.channels
        xs = self.lin_src(x_src).view(-1, h, c)  # (Ns, h, c)
        xd = self.lin_dst(x_dst).view(-1, h, c)  # (Nd, h, c)
        src, dst = edge_index[0], edge_index[1]
        a_src = (xs * self.att_src).sum(-1)  # (Ns, h)
        a_dst = (xd * self.att_dst).sum(-1)  # (Nd, h)
        s = a_src.index_select(0, src) + a_dst.index_select(0, dst)  # (E, h)
        if self.lin_edge is not None and edge_attr is not None:
            s = s + (self.lin_edge(edge_attr).view(-1, h, c) * self.att_edge).sum(-1)
        s = F.leaky_relu(s, self.slope)
        m = torch.cat([s, s.new_zeros(1, h)], 0).amax(0, keepdim=True)  # (1, h)
        e = torch.exp(s - m)  # (E, h)
        den = torch.zeros_like(a_dst).index_add(0, dst, e)  # (Nd, h)
        alpha = e / (den.index_select(0, dst) + 1e-16)  # (E, h)
        msg = xs.index_select(0, src) * alpha.unsqueeze(-1)  # (E, h, c)
        out = torch.zeros_like(xd).index_add(0, dst, msg).mean(1)  # (Nd, c)
        if self.res is not None:
            out = out + self.res(x_dst)
        if self.bias is not None:
            out = out + self.bias
        return out, alpha


class RowEncoder(nn.Module):
    """``GATEncoder`` row-wise: node_x (N, F_NODE), nn_edge_index (2, E_nn) -> node_emb (N, H)."""

    def __init__(self, net: PolicyNet):
        super().__init__()
        self.layers = nn.ModuleList([RowGAT(conv.convs[NEAR]) for conv in net.encoder.convs])

    def forward(self, node_x: Tensor, nn_edge_index: Tensor) -> Tensor:
        h = node_x
        for layer in self.layers:
            out, _ = layer(h, h, nn_edge_index)
            h = F.elu(out)
        return h


class RowActor(nn.Module):
    """``PodActor`` row-wise: (node_emb, node_x, pod_x, cand_pod, cand_node, cand_attr)
    -> (logits (E,), attention (E,))."""

    def __init__(self, net: PolicyNet):
        super().__init__()
        self.gat = RowGAT(net.actor.conv.convs[CAND])
        self.score = net.actor.score

    def forward(self, node_emb: Tensor, node_x: Tensor, pod_x: Tensor, cand_pod: Tensor, cand_node: Tensor,
                cand_attr: Tensor) -> tuple[Tensor, Tensor]:
        src = torch.cat([node_emb, node_x], dim=1)  # (N, H + F_NODE)
        out, alpha = self.gat(src, pod_x, torch.stack([cand_node, cand_pod]), cand_attr)
        pod_h = F.elu(out)  # (P, H)
        z = torch.cat([pod_h.index_select(0, cand_pod), node_emb.index_select(0, cand_node),
                       pod_x.index_select(0, cand_pod), node_x.index_select(0, cand_node), cand_attr], 1)
        return self.score(z).squeeze(-1), alpha.mean(-1)


def example_inputs(hidden: int, n: int = 12, p: int = 3, e: int = 9, seed: int = 0) -> dict[str, Tensor]:
    g = torch.Generator().manual_seed(seed)
    nn_edge = torch.cat([torch.arange(n).repeat(2, 1), torch.randint(0, n, (2, 3 * n), generator=g)], 1)
    return {
        "node_x": torch.rand(n, F_NODE, generator=g), "nn_edge_index": nn_edge,
        "node_emb": torch.rand(n, hidden, generator=g), "pod_x": torch.rand(p, F_POD, generator=g),
        "cand_pod": torch.randint(0, p, (e,), generator=g), "cand_node": torch.randint(0, n, (e,), generator=g),
        "cand_attr": torch.rand(e, F_EDGE, generator=g),
    }


def export_onnx(net: PolicyNet, out_dir: str | Path) -> dict[str, Path]:
    """Write encoder.onnx and actor.onnx into ``out_dir``; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    net = net.eval()
    ex = example_inputs(net.cfg.hidden)
    n, e, enn, p = torch.export.Dim("N"), torch.export.Dim("E"), torch.export.Dim("E_nn"), torch.export.Dim("P")
    enc, act = RowEncoder(net).eval(), RowActor(net).eval()
    paths = {"encoder": out / ENCODER_FILE, "actor": out / ACTOR_FILE}
    with torch.no_grad():
        torch.onnx.export(enc, (ex["node_x"], ex["nn_edge_index"]), str(paths["encoder"]), dynamo=True,
                          opset_version=OPSET, input_names=list(ENCODER_INPUTS), output_names=list(ENCODER_OUTPUTS),
                          dynamic_shapes=({0: n}, {1: enn}), external_data=False, verbose=False)
        args = tuple(ex[k] for k in ACTOR_INPUTS)
        torch.onnx.export(act, args, str(paths["actor"]), dynamo=True, opset_version=OPSET,
                          input_names=list(ACTOR_INPUTS), output_names=list(ACTOR_OUTPUTS),
                          dynamic_shapes=({0: n}, {0: n}, {0: p}, {0: e}, {0: e}, {0: e}),
                          external_data=False, verbose=False)
    return paths


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def onnx_sessions(model_dir: str | Path):
    """ONNX Runtime sessions (encoder, actor) with one intra-op thread, as serving runs them."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    d = Path(model_dir)
    return (ort.InferenceSession(str(d / ENCODER_FILE), opts, providers=["CPUExecutionProvider"]),
            ort.InferenceSession(str(d / ACTOR_FILE), opts, providers=["CPUExecutionProvider"]))


def onnx_scores(sessions, graph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(node_emb, logits, attention) of a ``HeteroGraph`` through the two ONNX sessions."""
    enc, act = sessions
    node_emb = enc.run(None, {"node_x": graph.node_x, "nn_edge_index": graph.nn_edge_index})[0]
    logits, attention = act.run(None, {"node_emb": node_emb, "node_x": graph.node_x, "pod_x": graph.pod_x,
                                       "cand_pod": graph.cand_pod, "cand_node": graph.cand_node,
                                       "cand_attr": graph.cand_attr})
    return node_emb, logits, attention


def write_manifest(model_dir: str | Path, manifest: dict) -> Path:
    """manifest.json with the sha256 of every model file in ``model_dir`` added under ``files``."""
    d = Path(model_dir)
    files = {f.name: sha256_file(f) for f in sorted(d.iterdir())
             if f.is_file() and f.name != "manifest.json"}
    body = dict(manifest)
    body["files"] = files
    path = d / "manifest.json"
    path.write_text(json.dumps(body, indent=2, sort_keys=True, default=str) + "\n")
    return path
