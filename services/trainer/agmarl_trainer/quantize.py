"""INT8 variants of an exported model: ONNX Runtime's quantisation tools over ``encoder.onnx`` and ``actor.onnx``.

    agmarl train --quantize models/default --out models/default-int8 [--quant-method dynamic|weight-only]

Reads a model folder (its files checked against its manifest first), writes ``<out>/encoder.onnx``,
``<out>/actor.onnx`` and ``<out>/manifest.json``: the source manifest (contract, training record) with
the new files' sha256, a new version ``<source version>-int8-<12 hex digits>``, ``variant``,
``quantised_from`` (the source version and its ONNX digests) and ``quantisation`` (method, tool, which
weights were quantised and which stayed float). The source's evaluation is not carried over (it measured
the float graphs). The output loads as ``model:<out>`` (``model:default-int8`` for models/default-int8)
through the same registry and sessions (one thread) as the float model. No torch here.

Methods (every Gemm with a constant weight is first rewritten as MatMul (+ Add), the same function, so
that both tools see it):
- ``dynamic``: ``quantize_dynamic``: int8 weights (per output channel), activations quantised per call
  to uint8 (DynamicQuantizeLinear -> MatMulInteger); no calibration data.
- ``weight-only``: ``MatMulNBitsQuantizer`` with 8 bits: int8 weights in blocks of ``block_size`` along the
  input dimension, float activations (MatMulNBits).
Weights named in ``keep_float`` stay float32: by default the actor's first scoring layer ``score.0``,
which reads the concatenation [pod_h | node_emb | pod_x | node_x | cand_attr]. One per-tensor activation
scale over those mixed ranges is too coarse (on a 1,523-node openb state the int8 pick differed from the
float pick on 9 % of pods with it quantised, 2.3 % without; docs/model.md, "INT8 variant").
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
from onnx import helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

from agmarl_common.serving import modelstore

METHODS = ("dynamic", "weight-only")
VARIANT = "int8"


@dataclass(frozen=True)
class QuantizeConfig:
    method: str = "dynamic"  # METHODS
    per_channel: bool = True  # dynamic: one weight scale per output channel
    block_size: int = 32  # weight-only: weights sharing one scale (along the input dimension)
    keep_float: tuple[str, ...] = ("score.0.weight",)  # weights (initializer names) left in float32


def gemm_to_matmul(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every ``Gemm(A, W[, C])`` whose W is an initializer (alpha = beta = 1, no transA)
    rewritten as ``MatMul(A, W') [+ Add(C)]``, W' = W (transposed when transB): the same function. The
    MatMul is named ``<gemm name>_MatMul``; a transposed weight is a new initializer ``<W>.T`` (W is dropped
    when nothing else reads it). Returns a new model."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {i.name: i for i in m.graph.initializer}
    nodes, new_inits = [], []
    for n in m.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        if n.op_type != "Gemm" or n.input[1] not in inits or attrs.get("transA", 0) \
                or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
            nodes.append(n)
            continue
        w = numpy_helper.to_array(inits[n.input[1]])
        w_name = n.input[1]
        if attrs.get("transB", 0):
            w_name = f"{w_name}.T"
            new_inits.append(numpy_helper.from_array(np.ascontiguousarray(w.T), w_name))  # (in, out)
        has_bias = len(n.input) > 2 and bool(n.input[2])
        mm_out = f"{n.output[0]}_mm" if has_bias else n.output[0]
        nodes.append(helper.make_node("MatMul", [n.input[0], w_name], [mm_out], name=f"{n.name}_MatMul"))
        if has_bias:
            nodes.append(helper.make_node("Add", [mm_out, n.input[2]], [n.output[0]], name=f"{n.name}_Add"))
    used = {i for n in nodes for i in n.input}
    kept = [i for i in m.graph.initializer if i.name in used]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    del m.graph.initializer[:]
    m.graph.initializer.extend(kept + new_inits)
    return m


def _matmuls(model: onnx.ModelProto) -> dict[str, str]:
    """{MatMul node name: its constant weight's name}."""
    inits = {i.name for i in model.graph.initializer}
    return {n.name: n.input[1] for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in inits}


def quantize_graph(src: Path, dst: Path, cfg: QuantizeConfig) -> dict:
    """Quantise one ONNX graph ``src`` -> ``dst``; returns {"quantised": [weights], "float": [weights]}."""
    if cfg.method not in METHODS:
        raise ValueError(f"unknown quantisation method {cfg.method!r}; known: {', '.join(METHODS)}")
    model = gemm_to_matmul(onnx.load(src))
    weights = _matmuls(model)
    exclude = sorted(name for name, w in weights.items() if w.removesuffix(".T") in cfg.keep_float)
    if cfg.method == "dynamic":
        with tempfile.TemporaryDirectory() as tmp:
            mid = Path(tmp) / src.name
            onnx.save(model, mid)
            quantize_dynamic(mid, dst, weight_type=QuantType.QInt8, per_channel=cfg.per_channel,
                             nodes_to_exclude=exclude)
    else:
        # imported here: importing it sets the root logger to INFO (every node it skips is logged)
        from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer  # noqa: PLC0415

        q = MatMulNBitsQuantizer(model, bits=8, block_size=cfg.block_size, is_symmetric=True, nodes_to_exclude=exclude)
        q.process()
        q.model.save_model_to_file(str(dst))
    return {"quantised": sorted(w.removesuffix(".T") for n, w in weights.items() if n not in exclude),
            "float": sorted(weights[n].removesuffix(".T") for n in exclude)}


def _sha256_file(path: Path) -> str:
    return modelstore.sha256(path.read_bytes())


def quantize_model(src_dir: str | Path, out_dir: str | Path, cfg: QuantizeConfig = QuantizeConfig()) -> dict:
    """Write the INT8 variant of the model folder ``src_dir`` to ``out_dir`` (module docstring); returns
    its manifest (unsigned: ``agmarl keys sign`` signs it). The source graphs must match its manifest's
    digests."""
    src, out = Path(src_dir), Path(out_dir)
    raw = (src / modelstore.MANIFEST).read_bytes()
    source = modelstore.parse_manifest(raw, str(src))
    graphs = (modelstore.ENCODER_FILE, modelstore.ACTOR_FILE)
    # never quantise graphs that are not the ones the manifest names
    modelstore.verify_files({n: (src / n).read_bytes() for n in graphs},
                            {"files": {n: source["files"][n] for n in graphs}}, str(src))
    version = str(source.get("version") or source["files"][modelstore.ACTOR_FILE][:12])
    out.mkdir(parents=True, exist_ok=True)
    summary = {name: quantize_graph(src / name, out / name, cfg) for name in graphs}
    files = {name: _sha256_file(out / name) for name in graphs}
    digest = hashlib.sha256((files[modelstore.ENCODER_FILE] + files[modelstore.ACTOR_FILE]).encode()).hexdigest()
    manifest = {k: v for k, v in source.items() if k not in ("files", "evaluation", "parity", "version", "created")}
    manifest.update({
        "version": f"{version}-{VARIANT}-{digest[:12]}",
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "variant": f"{VARIANT}-{cfg.method}",
        "quantised_from": {"version": version, "files": {n: source["files"][n] for n in graphs}},
        "quantisation": {"tool": f"onnxruntime.quantization {onnxruntime.__version__}", **asdict(cfg),
                         "keep_float": list(cfg.keep_float), "graphs": summary},
        "evaluation": {}, "files": files})
    (out / modelstore.MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest
