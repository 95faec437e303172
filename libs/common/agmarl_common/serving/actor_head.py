"""``actor.onnx``'s function with its per-node work done once per node row instead of once per pair.

The exported actor (``RowActor``, docs/model.md) scores each (pod, candidate node) pair:

    s_e     = leaky_relu(a_src[n] + a_dst[p] + a_edge(attr_e))                  (E, heads)
    alpha_e = exp(s_e - max(0, max_e s_e)) / (sum over the pod's pairs + 1e-16)  (E, heads)
    pod_h   = elu(mean_heads(sum_e alpha_e * xs[n]) + res(pod_x) + bias)          (P, C)
    logit_e = MLP([pod_h[p] | node_emb[n] | pod_x[p] | node_x[n] | attr_e])      (E,)

with xs = [node_emb | node_x] W_src^T (N, heads * C) and a_src = <xs, att_src> per head. Everything
that reads only a node's row (xs, a_src and the node columns of the MLP's first layer) is kept in per-node
tables (``NodeTable``), updated only on the rows whose embedding or features changed since the last call
(``EncoderCache.dirty``); what reads only the pod (a_dst, res, its first-layer columns) is computed once per
pod. Per pair what remains is a gather of the tables, the pair's own inputs through a (F_e, hidden + heads)
matrix instead of the (C + H + F_p + F_n + F_e, hidden) one, the softmax and the MLP's later layers. The
same function as ``actor.onnx`` with the first layer's matrix split per input block: equal up to float32
rounding (``from_onnx`` checks it on a probe against ONNX Runtime and declines a graph it does not
recognise, e.g. a quantised one).

The per-pair part is itself an ONNX graph built here from the actor's weights (``_pair_graph``) and run by
ONNX Runtime with one thread, like the node tables' product: numpy's BLAS would spread the larger products
over threads that compete with the service's (a 1,000 x 64 x 64 product: 3 ms of wall time with them on
this 2-core machine, 0.1 ms on one thread), and numpy's one array per step costs more than ORT's kernels.
One pod alone (the live loop) runs ``_one_pod_graph``: the same function with reductions instead of scatters.

Shapes: node_emb (N, H), node_x (N, F_n), pod_x (P, F_p), cand_pod / cand_node (E,), cand_attr (E, F_e)
-> logits (E,), attention (E,) (heads averaged).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

PROBE_TOL = 1e-4  # max abs difference from actor.onnx on the probe graphs for the decomposed actor to be used
_GAT = ("gat.att_src", "gat.att_dst", "gat.att_edge", "gat.bias", "gat.lin_src.weight", "gat.lin_dst.weight",
        "gat.lin_edge.weight", "gat.res.weight")
_SCORE = re.compile(r"score\.(\d+)\.weight$")


@dataclass(frozen=True)
class ActorWeights:
    """The actor's parameters, shaped for row-major products: every matrix (in, out)."""

    heads: int
    channels: int  # C: pod_h width
    slope: float  # leaky_relu negative slope of the attention
    elu_alpha: float
    w_node: np.ndarray  # (H + F_n, heads*C + hidden): [W_src^T | node columns of the first MLP layer]
    att_src: np.ndarray  # (heads, C)
    w_pod: np.ndarray  # (F_p, heads*C + C + hidden): [W_dst^T | W_res^T | pod_x columns of the first layer]
    att_dst: np.ndarray  # (heads, C)
    w_attr: np.ndarray  # (F_e, hidden): cand_attr columns of the first layer
    edge_att: np.ndarray  # (F_e, heads): W_edge^T folded with att_edge (the attention's edge term)
    w_pod_h: np.ndarray  # (C, hidden): pod_h columns of the first layer
    bias: np.ndarray  # (C,) GAT bias
    b0: np.ndarray  # (hidden,) first layer bias
    layers: tuple[tuple[np.ndarray, np.ndarray], ...]  # later layers: (W^T (in, out), b (out,)), relu between


def _weights(model: onnx.ModelProto) -> ActorWeights | None:
    """The parameters of a float ``RowActor`` graph, or None for another graph."""
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    if any(k not in init or init[k].dtype != np.float32 for k in _GAT):
        return None
    score = sorted(int(mt.group(1)) for k in init if (mt := _SCORE.match(k)))
    if not score or any(f"score.{k}.bias" not in init for k in score):
        return None
    ops = [n.op_type for n in model.graph.node]
    if ops.count("Relu") != len(score) - 1 or ops.count("LeakyRelu") != 1 or ops.count("Elu") != 1:
        return None
    attr = {n.op_type: {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
            for n in model.graph.node if n.op_type in ("LeakyRelu", "Elu")}
    dims = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    hidden_in = dims.get("node_emb", [0, 0])[1]
    att_src = init["gat.att_src"][0]  # (heads, C)
    heads, c = att_src.shape
    w_src, w_dst, w_edge, w_res = (init[f"gat.{k}.weight"] for k in ("lin_src", "lin_dst", "lin_edge", "res"))
    w0 = init[f"score.{score[0]}.weight"]  # (hidden, C + H + F_p + F_n + F_e)
    f_n, f_p, f_e = w_src.shape[1] - hidden_in, w_dst.shape[1], w_edge.shape[1]
    if hidden_in <= 0 or f_n <= 0 or w0.shape[1] != c + hidden_in + f_p + f_n + f_e or w_src.shape[0] != heads * c:
        return None
    cut = np.cumsum([c, hidden_in, f_p, f_n])
    w_podh, w_emb, w_podx, w_nx, w_attr = np.split(w0, cut, axis=1)
    att_edge = init["gat.att_edge"][0]  # (heads, C)
    edge_att = (w_edge.T.reshape(f_e, heads, c) * att_edge).sum(-1)  # (F_e, heads)
    return ActorWeights(
        heads=heads, channels=c, slope=float(attr["LeakyRelu"].get("alpha", 0.01)),
        elu_alpha=float(attr["Elu"].get("alpha", 1.0)),
        w_node=np.ascontiguousarray(np.concatenate([w_src.T, np.concatenate([w_emb, w_nx], axis=1).T], axis=1)),
        att_src=att_src, att_dst=init["gat.att_dst"][0],
        w_pod=np.ascontiguousarray(np.concatenate([w_dst.T, w_res.T, w_podx.T], axis=1)),
        w_attr=np.ascontiguousarray(w_attr.T), edge_att=np.ascontiguousarray(edge_att.astype(np.float32)),
        w_pod_h=np.ascontiguousarray(w_podh.T), bias=init["gat.bias"], b0=init[f"score.{score[0]}.bias"],
        layers=tuple((np.ascontiguousarray(init[f"score.{k}.weight"].T), init[f"score.{k}.bias"])
                     for k in score[1:]))


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    """A CPU session with one intra-op and one inter-op thread (the options of ``onnx_model.make_session``:
    ScatterND with duplicate indices is wrong with more threads in ORT 1.32)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def _model(nodes: list, inputs: list[tuple[str, int, list]], outputs: list[str], init: dict[str, np.ndarray]
           ) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "actor_head", [helper.make_tensor_value_info(n, dt, shape) for n, dt, shape in inputs],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        initializer=[numpy_helper.from_array(np.ascontiguousarray(v), k) for k, v in init.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def _node_graph(w: ActorWeights, width: int) -> onnx.ModelProto:
    """[node_emb | node_x] (k, H + F_n) -> xs (k, heads*C), a_src (k, heads), node part (k, hidden)."""
    hc, hidden = w.heads * w.channels, w.b0.size
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w_node"], ["proj"]),
             n("Split", ["proj", "split"], ["xs", "node_part"], axis=1),
             n("Reshape", ["xs", "heads_c"], ["xs3"]),
             n("Mul", ["xs3", "att_src"], ["xa"]),
             n("ReduceSum", ["xa", "last"], ["a_src"], keepdims=0)]
    init = {"w_node": w.w_node, "split": np.array([hc, hidden], np.int64),
            "heads_c": np.array([-1, w.heads, w.channels], np.int64), "att_src": w.att_src,
            "last": np.array([-1], np.int64)}
    return _model(nodes, [("x", TensorProto.FLOAT, ["k", width])], ["xs", "a_src", "node_part"], init)


def _pair_graph(w: ActorWeights) -> onnx.ModelProto:
    """The pairs' part of the actor (module docstring). Inputs: the node tables xs (N, heads*C), a_src
    (N, heads), node_part (N, hidden); per pod a_dst (P, heads), res (P, C) (res(pod_x) + GAT bias) and
    pod_part (P, hidden) (its pod_x columns of the first layer + bias); cand_pod, cand_node (E,), cand_attr
    (E, F_e). Outputs logits (E,), attention (E,)."""
    heads, c, hidden = w.heads, w.channels, w.b0.size
    n = helper.make_node
    nodes = [
        n("Gather", ["xs", "cand_node"], ["xs_e"], axis=0),  # (E, heads*C)
        n("Gather", ["a_src", "cand_node"], ["as_e"], axis=0),  # (E, heads)
        n("Gather", ["node_part", "cand_node"], ["np_e"], axis=0),  # (E, hidden)
        n("Gather", ["a_dst", "cand_pod"], ["ad_e"], axis=0),  # (E, heads)
        n("MatMul", ["cand_attr", "w_edge"], ["edge"]),  # (E, hidden + heads)
        n("Split", ["edge", "split"], ["edge_h", "edge_a"], axis=1),
        n("Add", ["as_e", "ad_e"], ["s0"]), n("Add", ["s0", "edge_a"], ["s1"]),
        n("LeakyRelu", ["s1"], ["s"], alpha=w.slope),
        n("Concat", ["s", "zero_row"], ["s_z"], axis=0),
        n("ReduceMax", ["s_z", "first_axis"], ["m"], keepdims=1),  # one shift per head, as the export
        n("Sub", ["s", "m"], ["s_m"]), n("Exp", ["s_m"], ["e"]),
        n("Unsqueeze", ["cand_pod", "last"], ["idx"]),  # (E, 1)
        n("Shape", ["a_dst"], ["p_heads"]), n("ConstantOfShape", ["p_heads"], ["zeros_ph"]),
        n("ScatterND", ["zeros_ph", "idx", "e"], ["den"], reduction="add"),  # (P, heads)
        n("Gather", ["den", "cand_pod"], ["den_e"], axis=0),
        n("Add", ["den_e", "eps"], ["den_eps"]), n("Div", ["e", "den_eps"], ["alpha"]),  # (E, heads)
        n("Reshape", ["xs_e", "heads_c"], ["xs3"]), n("Unsqueeze", ["alpha", "last"], ["alpha3"]),
        n("Mul", ["xs3", "alpha3"], ["msg"]),  # (E, heads, C)
        n("Shape", ["a_dst"], ["p_h"]), n("Concat", ["p_h", "c_dim"], ["phc"], axis=0),
        n("ConstantOfShape", ["phc"], ["zeros_phc"]),
        n("ScatterND", ["zeros_phc", "idx", "msg"], ["agg"], reduction="add"),  # (P, heads, C)
        n("ReduceMean", ["agg", "second_axis"], ["mean"], keepdims=0),
        n("Add", ["mean", "res"], ["pre"]), n("Elu", ["pre"], ["pod_h"], alpha=w.elu_alpha),  # (P, C)
        n("MatMul", ["pod_h", "w_pod_h"], ["ph_first"]), n("Add", ["ph_first", "pod_part"], ["first"]),
        n("Gather", ["first", "cand_pod"], ["first_e"], axis=0),  # (E, hidden)
        n("Add", ["np_e", "edge_h"], ["h0"]), n("Add", ["h0", "first_e"], ["h1"]), n("Relu", ["h1"], ["r0"]),
        n("ReduceMean", ["alpha", "last"], ["attention"], keepdims=0),
    ]
    init = {"w_edge": np.concatenate([w.w_attr, w.edge_att], axis=1), "split": np.array([hidden, heads], np.int64),
            "zero_row": np.zeros((1, heads), np.float32), "first_axis": np.array([0], np.int64),
            "last": np.array([-1], np.int64), "second_axis": np.array([1], np.int64),
            "eps": np.array(1e-16, np.float32), "heads_c": np.array([-1, heads, c], np.int64),
            "c_dim": np.array([c], np.int64), "w_pod_h": w.w_pod_h, "flat": np.array([-1], np.int64)}
    _mlp_tail(w, nodes, init)
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    inputs = [("xs", f32, ["N", heads * c]), ("a_src", f32, ["N", heads]), ("node_part", f32, ["N", hidden]),
              ("a_dst", f32, ["P", heads]), ("res", f32, ["P", c]), ("pod_part", f32, ["P", hidden]),
              ("cand_pod", i64, ["E"]), ("cand_node", i64, ["E"]), ("cand_attr", f32, ["E", w.w_attr.shape[0]])]
    return _model(nodes, inputs, ["logits", "attention"], init)


def _mlp_tail(w: ActorWeights, nodes: list, init: dict) -> None:
    """Append the actor's MLP after its first layer ("r0") and the flat ``logits`` output (both pair graphs)."""
    out = "r0"
    for k, (wt, b) in enumerate(w.layers):
        init[f"w{k}"], init[f"b{k}"] = wt, b
        nodes.append(helper.make_node("Gemm", [out, f"w{k}", f"b{k}"], [f"g{k}"]))
        out = f"g{k}"
        if k < len(w.layers) - 1:
            nodes.append(helper.make_node("Relu", [out], [f"r{k + 1}"]))
            out = f"r{k + 1}"
    nodes.append(helper.make_node("Reshape", [out, "flat"], ["logits"]))


def _one_pod_graph(w: ActorWeights) -> onnx.ModelProto:
    """``_pair_graph`` for one pod (P = 1, the live loop's case) in fewer passes over the pairs: the softmax's
    sums and the attention-weighted sum of xs are reductions over all pairs (a (heads, E) x (E, heads*C)
    product whose diagonal blocks are the heads' sums) instead of scatters, and the pod's first-layer terms
    enter as the bias of the pairs' own product. Same inputs and outputs as ``_pair_graph`` (cand_pod unused)."""
    heads, c, hidden = w.heads, w.channels, w.b0.size
    n = helper.make_node
    nodes = [
        n("Gather", ["xs", "cand_node"], ["xs_e"], axis=0),  # (E, heads*C)
        n("Gather", ["a_src", "cand_node"], ["as_e"], axis=0),  # (E, heads)
        n("Gather", ["node_part", "cand_node"], ["np_e"], axis=0),  # (E, hidden)
        n("MatMul", ["cand_attr", "edge_att"], ["edge_a"]),  # (E, heads)
        n("Add", ["as_e", "edge_a"], ["s0"]), n("Add", ["s0", "a_dst"], ["s1"]),
        n("LeakyRelu", ["s1"], ["s"], alpha=w.slope),
        n("ReduceMax", ["s", "first_axis"], ["m0"], keepdims=1), n("Max", ["m0", "zero"], ["m"]),
        n("Sub", ["s", "m"], ["s_m"]), n("Exp", ["s_m"], ["e"]),
        n("ReduceSum", ["e", "first_axis"], ["den"], keepdims=1),
        n("Add", ["den", "eps"], ["den_eps"]), n("Div", ["e", "den_eps"], ["alpha"]),  # (E, heads)
        n("Transpose", ["alpha"], ["alpha_t"], perm=[1, 0]),  # (heads, E)
        n("MatMul", ["alpha_t", "xs_e"], ["agg_all"]),  # (heads, heads*C): head h's sum in block h
        n("Reshape", ["agg_all", "h_h_c"], ["agg3"]), n("Mul", ["agg3", "diag"], ["agg_d"]),
        n("ReduceSum", ["agg_d", "second_axis"], ["agg"], keepdims=0),  # (heads, C)
        n("ReduceMean", ["agg", "first_axis"], ["mean"], keepdims=1),  # (1, C)
        n("Add", ["mean", "res"], ["pre"]), n("Elu", ["pre"], ["pod_h"], alpha=w.elu_alpha),
        n("MatMul", ["pod_h", "w_pod_h"], ["ph_first"]), n("Add", ["ph_first", "pod_part"], ["first"]),  # (1, hidden)
        n("Gemm", ["cand_attr", "w_attr", "first"], ["edge_first"]),  # (E, hidden): attr part + the pod's part
        n("Add", ["np_e", "edge_first"], ["h1"]), n("Relu", ["h1"], ["r0"]),
        n("ReduceMean", ["alpha", "last"], ["attention"], keepdims=0),
    ]
    init = {"w_attr": w.w_attr, "edge_att": w.edge_att, "zero": np.zeros((1, heads), np.float32),
            "first_axis": np.array([0], np.int64), "second_axis": np.array([1], np.int64),
            "last": np.array([-1], np.int64), "eps": np.array(1e-16, np.float32),
            "h_h_c": np.array([heads, heads, c], np.int64),
            "diag": np.eye(heads, dtype=np.float32).reshape(heads, heads, 1),
            "w_pod_h": w.w_pod_h, "flat": np.array([-1], np.int64)}
    _mlp_tail(w, nodes, init)
    f32, i64 = TensorProto.FLOAT, TensorProto.INT64
    inputs = [("xs", f32, ["N", heads * c]), ("a_src", f32, ["N", heads]), ("node_part", f32, ["N", hidden]),
              ("a_dst", f32, [1, heads]), ("res", f32, [1, c]), ("pod_part", f32, [1, hidden]),
              ("cand_node", i64, ["E"]), ("cand_attr", f32, ["E", w.w_attr.shape[0]])]
    return _model(nodes, inputs, ["logits", "attention"], init)


class NodeTable:
    """The actor's per-node tables (xs, a_src, node part), kept in step with the node embeddings by rows
    (``update``)."""

    def __init__(self, session: ort.InferenceSession):
        self.session = session
        self.tables: list[np.ndarray] | None = None
        self.key: tuple = ()

    def _rows(self, emb: np.ndarray, node_x: np.ndarray) -> list[np.ndarray]:
        return self.session.run(None, {"x": np.concatenate([emb, node_x], axis=1)})

    def update(self, emb: np.ndarray, node_x: np.ndarray, key: tuple, rows: np.ndarray | None) -> list[np.ndarray]:
        """[xs, a_src, node_part] for ``emb`` / ``node_x``. ``key``: (source, version) of the embeddings;
        ``rows``: the rows that changed from (source, version - 1) to ``key`` (None: not known, every row is
        computed)."""
        if self.tables is not None and key == self.key:
            return self.tables
        prev, self.key = self.key, key
        if self.tables is None or rows is None or prev != (key[0], key[1] - 1) \
                or self.tables[0].shape[0] != emb.shape[0]:
            self.tables = self._rows(emb, node_x)
        elif rows.size:
            for table, new in zip(self.tables, self._rows(emb[rows], node_x[rows])):
                table[rows] = new
        return self.tables


class DecomposedActor:
    """``actor.onnx`` over per-node tables (module docstring). ``run`` has the ONNX graph's outputs;
    ``nodes`` is the ``NodeTable`` its owner keeps across calls."""

    def __init__(self, weights: ActorWeights):
        self.w = weights
        self._node_session = _session(_node_graph(weights, weights.w_node.shape[0]))
        self._pair_session = _session(_pair_graph(weights))
        self._one_pod_session = _session(_one_pod_graph(weights))
        self.nodes = self.table()

    def table(self) -> NodeTable:
        """A new, empty node table for this actor."""
        return NodeTable(self._node_session)

    @staticmethod
    def from_onnx(model: bytes | str | Path, session: ort.InferenceSession) -> "DecomposedActor | None":
        """The decomposed actor of an exported ``RowActor`` graph when it computes what ``session`` (that
        graph in ONNX Runtime) computes on probe graphs (to ``PROBE_TOL``); None for any other graph (the
        caller keeps ``session``)."""
        proto = onnx.load_model_from_string(model) if isinstance(model, bytes) else onnx.load(str(model))
        w = _weights(proto)
        if w is None:
            return None
        actor = DecomposedActor(w)
        return actor if all(actor.agrees_with(session, seed) for seed in range(3)) else None

    def agrees_with(self, session: ort.InferenceSession, seed: int = 0) -> bool:
        """Logits and attention within ``PROBE_TOL`` of ``session`` on a random graph (3 pods, 40 nodes,
        inputs in the features' ranges) and on its last pod alone."""
        rng = np.random.default_rng(seed)
        shapes = {i.name: i.shape for i in session.get_inputs()}
        n, counts = 40, [5, 17, 40]
        emb = rng.uniform(-1, 1, size=(n, shapes["node_emb"][1])).astype(np.float32)
        node_x = rng.uniform(0, 1, size=(n, shapes["node_x"][1])).astype(np.float32)
        pod_x = rng.uniform(0, 1, size=(len(counts), shapes["pod_x"][1])).astype(np.float32)
        cand_pod = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        cand_node = np.concatenate([rng.choice(n, k, replace=False) for k in counts]).astype(np.int64)
        attr = rng.uniform(0, 1, size=(cand_pod.size, shapes["cand_attr"][1])).astype(np.float32)
        tables = self.table().update(emb, node_x, ("probe", 0), None)
        last = cand_pod == len(counts) - 1  # and the last pod alone (the one-pod graph)
        for feed in ((pod_x, cand_pod, cand_node, attr), (pod_x[-1:], cand_pod[last] * 0, cand_node[last], attr[last])):
            ref = session.run(None, {"node_emb": emb, "node_x": node_x, "pod_x": feed[0], "cand_pod": feed[1],
                                     "cand_node": feed[2], "cand_attr": feed[3]})
            ours = self.run(tables, *feed)
            if not all(a.shape == b.shape and np.allclose(a, b, rtol=0, atol=PROBE_TOL) for a, b in zip(ours, ref)):
                return False
        return True

    def run(self, tables: list[np.ndarray], pod_x: np.ndarray, cand_pod: np.ndarray, cand_node: np.ndarray,
            cand_attr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(logits (E,), attention (E,)) of the pairs, the node rows read from ``tables`` (``NodeTable``)."""
        w = self.w
        hc = w.heads * w.channels
        pod = pod_x @ w.w_pod  # (P, heads*C + C + hidden): [xd | res | first-layer pod_x columns]
        a_dst = (pod[:, :hc].reshape(-1, w.heads, w.channels) * w.att_dst).sum(-1)  # (P, heads)
        xs, a_src, node_part = tables
        feed = {"xs": xs, "a_src": a_src, "node_part": node_part, "a_dst": a_dst,
                "res": pod[:, hc:hc + w.channels] + w.bias, "pod_part": pod[:, hc + w.channels:] + w.b0,
                "cand_node": cand_node, "cand_attr": cand_attr}
        if pod_x.shape[0] == 1 and cand_node.size:
            logits, attention = self._one_pod_session.run(None, feed)
        else:
            logits, attention = self._pair_session.run(None, {**feed, "cand_pod": cand_pod})
        return logits, attention
