"""Wire messages: every kind round-trips; decode rejects oversized, malformed, bad-schema, unknown version."""
import base64
import typing

import msgpack
import numpy as np
import pytest

from agmarl_common.runtime.messages import (
    DEAD_LETTER_PAYLOAD_BYTES, MAX_MESSAGE_BYTES, MESSAGES, ClusterEvent, ClusterSnapshot, DeadLetter, Decision,
    DecodeError, Experience, GraphSync, GraphUpdate, HealthStatus, ModelPublished, PendingPod, PolicySelection,
    Reward, SelectionRefused, TrainRequest, TrainStatus, _to_plain, dead_letter, decode, encode, peek)
from pydantic import BaseModel

POD = {"name": "p0", "namespace": "team-a", "cpu_milli": 500, "memory_mib": 256, "gpu_count": 1}
STATE = {"nodes": [{"name": "n0", "cpu_milli": 4000}], "bound": [[]]}

SAMPLES = [
    PendingPod(cluster="sim", pod=POD, seen_at=1.5, seq=3),
    ClusterSnapshot(cluster="sim", seq=4, time=10.0, state=STATE, pending=[POD],
                    stats={"cpu_util": 0.25, "pending": 1.0}),
    ClusterEvent(cluster="sim", seq=5, type="pod_bound", pod_key="team-a/p0", node="n0", time=11.0,
                 decision_id="d1", epoch="e1", pod=POD, gpus=[0]),
    GraphUpdate(cluster="sim", epoch="g1", version=7, full=False,
                changes=[{"op": "bound", "pod": POD, "node": "n0", "gpus": [0]}], time=11.5),
    GraphSync(cluster="sim", replica="r1"),
    Decision(decision_id="d1", cluster="sim", namespace="team-a", pod_key="team-a/p0", node="n0", gpus=[0],
             policy="gnn", model_version="m3", mode="hybrid", score=0.8, scores={"n0": 0.8, "n1": 0.4},
             model_scores={"n0": 0.9}, default_scores={"n0": 0.6}, explanation={"top": ["cpu"]},
             trace_id="ab" * 16, seen_at=1.5, decided_at=1.6, source="extender"),
    Reward(decision_id="d1", cluster="sim", components={"balance": 0.3, "frag": -0.1}, total=0.2,
           scheme="default", time=12.0),
    Experience(id="e1", cluster="sim", state=STATE, action={"node": "n0"}, reward=0.2, next_state=STATE,
               time=12.0),
    PolicySelection(policy="fgd", reason="drift", time=13.0, previous="gnn"),
    TrainRequest(request_id="r1", reason="drift", evidence={"kl": 0.4}, requested_at=14.0),
    TrainStatus(request_id="r1", status="running", detail="epoch 2", time=15.0),
    ModelPublished(version="m4", sha256="0" * 64, object_name="m4.onnx", manifest={"metrics": {}}, time=16.0),
    DeadLetter(service="inference", subject="agmarl.v1.graph.sim", reason="bad", kind="schema",
               payload_b64="", size=0, time=17.0),
    HealthStatus(service="inference", status="healthy", pid=42, metrics_port=9100, details={"up": 1}),
    SelectionRefused(policy="model:m5", reason="digest", detail="actor.onnx: sha256 mismatch", time=18.0),
]


def test_samples_cover_every_kind():
    assert sorted(type(m).KIND for m in SAMPLES) == sorted(MESSAGES)
    assert all(MESSAGES[cls.KIND] is cls for cls in MESSAGES.values())


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: m.KIND)
def test_round_trip(msg):
    data = encode(msg)
    assert isinstance(data, bytes)
    again = decode(type(msg), data)
    assert again == msg
    assert again.v == 1


def test_numpy_values_encode_as_plain_lists():
    msg = GraphUpdate(cluster="sim", epoch="g", version=1, full=True, time=0.0,
                      state={"node_x": np.arange(4, dtype=np.float32).reshape(2, 2)})
    again = decode(GraphUpdate, encode(msg))
    assert again.state["node_x"] == [[0.0, 1.0], [2.0, 3.0]]


def _has_model(annotation) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return any(_has_model(a) for a in typing.get_args(annotation))


def test_no_message_has_a_model_typed_field():
    """``encode`` packs a message's fields as held (no ``model_dump`` copy): right only while no field is typed
    as a model, which ``model_dump`` would turn into a dict."""
    assert [f"{cls.KIND}.{name}" for cls in MESSAGES.values() for name, field in cls.model_fields.items()
            if _has_model(field.annotation)] == []


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: m.KIND)
def test_encode_gives_the_bytes_of_model_dump(msg):
    assert encode(msg) == msgpack.packb(msg.model_dump(mode="python"), use_bin_type=True)


def test_values_inside_dict_fields_encode_as_model_dump_gives_them():
    """numpy arrays and scalars, sets, tuples and a model put inside a dict field: the same bytes as packing
    ``model_dump``'s output (with the numpy / set hook)."""
    selection = PolicySelection(policy="fgd", reason="drift", time=1.0)
    msg = Experience(id="e", cluster="sim", state={"a": np.arange(3), "b": np.float32(0.5), "c": {3, 1},
                                                   "d": (1, 2), "m": selection},
                     action={}, reward=0.0, next_state={}, time=0.0)
    plain = msg.model_dump(mode="python")
    assert encode(msg) == msgpack.packb(plain, use_bin_type=True, default=_to_plain)
    assert decode(Experience, encode(msg)).state["m"] == selection.model_dump()


def _raw(**fields):
    return msgpack.packb(fields, use_bin_type=True)


GOOD_EVENT = {"cluster": "sim", "seq": 1, "type": "pod_added", "time": 1.0}

REJECTIONS = [
    # (name, cls, payload, kind, text in reason)
    ("oversized", PendingPod, b"\x80" + b" " * MAX_MESSAGE_BYTES, "oversized", "exceeds"),
    ("not msgpack", ClusterEvent, b"\xc1\xc1", "malformed", "msgpack"),
    ("truncated", ClusterEvent, encode(SAMPLES[2])[:-3], "malformed", "msgpack"),
    ("not a map", ClusterEvent, msgpack.packb([1, 2]), "schema", "expected a map"),
    ("missing field", ClusterEvent, _raw(cluster="sim", seq=1, type="pod_added"), "schema", "time"),
    ("unknown field", ClusterEvent, _raw(**GOOD_EVENT, colour="red"), "schema", "colour"),
    ("bad literal", ClusterEvent, _raw(**{**GOOD_EVENT, "type": "pod_exploded"}), "schema", "type"),
    ("no coercion", ClusterEvent, _raw(**{**GOOD_EVENT, "seq": "1"}), "schema", "seq"),
    ("unknown version", ClusterEvent, _raw(**GOOD_EVENT, v=2), "schema", "version 2"),
    ("version a list", ClusterEvent, _raw(**GOOD_EVENT, v=[1]), "schema", "version of type list"),
    ("version a map", ClusterEvent, _raw(**GOOD_EVENT, v={"a": 1}), "schema", "version of type dict"),
    ("version a string", ClusterEvent, _raw(**GOOD_EVENT, v="1"), "schema", "version '1'"),
    ("version a bool", ClusterEvent, _raw(**GOOD_EVENT, v=True), "schema", "version True"),
    ("version a float", ClusterEvent, _raw(**GOOD_EVENT, v=1.0), "schema", "version 1.0"),
]


@pytest.mark.parametrize("name,cls,payload,kind,text", REJECTIONS, ids=[r[0] for r in REJECTIONS])
def test_decode_rejects(name, cls, payload, kind, text):
    with pytest.raises(DecodeError) as info:
        decode(cls, payload)
    assert info.value.kind == kind
    assert text in info.value.reason


OTHER_TYPES = [None, True, -1, 2 ** 63, 1.5, "x", b"\x00", [], [1, "a"], {}, {"k": [1]}, {1: 2}, [[[]]]]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda msg: type(msg).KIND)
def test_any_field_of_another_type_is_a_schema_error(msg):
    """Every field of every kind, ``v`` included, replaced by values of other types: a DecodeError of
    kind "schema" (counted, dead-lettered, acked by the service middleware), never a TypeError."""
    fields = msg.model_dump(mode="python")
    for name in fields:
        for value in OTHER_TYPES:
            if type(value) is type(fields[name]) or value == fields[name]:
                continue
            payload = msgpack.packb({**fields, name: value}, use_bin_type=True)
            try:
                decode(type(msg), payload)
            except DecodeError as exc:
                assert exc.kind == "schema", (name, value, exc)
            else:  # accepted: only where the field's type admits the value (None for an optional, any JSON)
                assert name != "v", value


def test_max_bytes_is_a_parameter():
    data = encode(SAMPLES[0])
    assert decode(PendingPod, data, max_bytes=len(data)) == SAMPLES[0]
    with pytest.raises(DecodeError) as info:
        decode(PendingPod, data, max_bytes=len(data) - 1)
    assert info.value.kind == "oversized"


def test_constructing_unknown_version_fails():
    with pytest.raises(ValueError):
        PolicySelection(v=2, policy="x", reason="r", time=0.0)


def test_dead_letter_truncates_payload():
    payload = bytes(range(256)) * 1024  # 256 KiB
    letter = dead_letter("svc", "agmarl.v1.graph.sim", "too big", "oversized", payload, 5.0)
    assert letter.size == len(payload)
    assert base64.b64decode(letter.payload_b64) == payload[:DEAD_LETTER_PAYLOAD_BYTES]
    assert decode(DeadLetter, encode(letter)) == letter


def test_peek_reads_one_text_field_and_nothing_else():
    d = Decision(decision_id="d1", cluster="c", namespace="ns", pod_key="ns/p", policy="fgd", mode="full",
                   seen_at=1.0, decided_at=2.0)
    data = encode(d)
    assert peek(data, "pod_key") == "ns/p" and peek(data, "cluster") == "c"
    assert peek(data, "seen_at") is None and peek(data, "missing") is None  # not text / absent
    for bad in (b"\xc1", b"", encode(d)[:5], b"\x93\x01\x02\x03"):  # not msgpack, truncated, not a map
        assert peek(bad, "pod_key") is None
    assert peek(data, "pod_key", max_bytes=len(data) - 1) is None  # oversized
