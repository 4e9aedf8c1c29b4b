"""The fuzz generator: a seed picks a template of one of five families and the template's
random choices; the same seed always makes the same case (docs/fuzzing.md).

Families: 1 byte damage to real models, 2 structural damage, 3 semantic edge cases,
4 bad run-time inputs, 5 misuse of the schedule API. A template returns a Scenario: what
to load, what to feed, and what the oracle expects (child.py runs it)."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from .models import (
    F32,
    I32,
    I64,
    REAL_MODELS,
    ROOT,
    binary,
    const,
    damage,
    feeds_for,
    mm_bias_relu,
    model,
    replace_name,
    unary,
    vi,
)

FAMILIES = ("bytes", "structure", "semantics", "inputs", "schedule")


@dataclass(frozen=True)
class Scenario:
    """One case: ``model`` (serialized) is written to ``case/model/model.onnx`` beside
    ``files`` (paths relative to that directory, ``..`` included) and ``links``
    (symlinks), loaded from ``source`` ("path" or "bytes") by InferenceSession(threads=)
    or by ``action(source)``, run on ``feeds``; if ``ort_feeds`` is given and onnxruntime
    accepts the model, the outputs must match its outputs on them. ``expect="refuse"``: a
    success is a failure (the issue asks for a refusal: onnxruntime refuses too). ``cli``:
    run ``polyonnx`` with these arguments instead ({model}, {dir}: the model, its directory);
    exit code 2 is a refusal. ``more_feeds``: later runs of the same session, each checked
    against onnxruntime on the same feeds."""

    model: bytes | None
    feeds: Any = None
    ort_feeds: dict | None = None
    expect: str = "any"
    files: dict[str, bytes] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    source: str = "path"
    output_names: Any = None
    threads: Any = 1
    action: Callable[[Any], Any] | None = None
    cli: tuple[str, ...] | None = None
    more_feeds: tuple[dict, ...] = ()
    note: str = ""


@dataclass(frozen=True)
class Template:
    family: str
    name: str
    make: Callable[[random.Random], Scenario]


TEMPLATES: list[Template] = []


def template(family: str):
    """Register a template of ``family`` under its function's name."""

    def register(make: Callable[[random.Random], Scenario]):
        TEMPLATES.append(Template(family, make.__name__, make))
        return make

    return register


class Forced(random.Random):
    """A seeded Random whose first ``choice`` returns option ``variant`` (modulo the
    options): how the corpus walks every variant of a template's main choice."""

    def __init__(self, seed, variant: int | None = None):
        super().__init__(seed)
        self.variant = variant
        self.options: int | None = None

    def choice(self, seq):
        if self.options is None:
            self.options = len(seq)
            if self.variant is not None:
                return seq[self.variant % len(seq)]
        return super().choice(seq)


def variants(t: Template) -> int:
    """How many options the first ``choice`` of template ``t`` has (1 if it makes none)."""
    probe = Forced(0)
    t.make(probe)
    return probe.options or 1


@functools.cache
def enumerated() -> tuple[tuple[Template, int], ...]:
    """Every (template, variant) pair: variant 0 of every template (family by family),
    then variant 1 of those that have one, and so on. The head of every corpus."""
    ordered = sorted(TEMPLATES, key=lambda t: FAMILIES.index(t.family))
    counts = {t.name: variants(t) for t in ordered}
    deepest = max(counts.values())
    return tuple((t, v) for v in range(deepest) for t in ordered if v < counts[t.name])


CI_VARIANTS = 3
"""The CI corpus takes the first CI_VARIANTS variants of every template."""


def ci_cases() -> int:
    """The number of seeds in the CI corpus (seeds 0 up to it)."""
    return sum(1 for _, v in enumerated() if v < CI_VARIANTS)


def _pick(seed: int) -> tuple[Template, int | None]:
    if seed < 0:
        return SELF_TESTS[(-seed - 1) % len(SELF_TESTS)], None
    pairs = enumerated()
    if seed < len(pairs):
        return pairs[seed]
    rng = random.Random(f"pick-{seed}")
    family = rng.choice(FAMILIES)
    return rng.choice([t for t in TEMPLATES if t.family == family]), None


def pick(seed: int) -> Template:
    """The template of ``seed``: seeds below ``len(enumerated())`` take every template
    and variant in turn (so the CI corpus covers them all); later seeds draw a family, then
    one of its templates, and every choice at random."""
    return _pick(seed)[0]


def scenario(seed: int) -> Scenario:
    """The case of ``seed``, built deterministically."""
    t, variant = _pick(seed)
    return t.make(Forced(seed, variant))


def label(seed: int) -> str:
    t = pick(seed)
    return f"{seed}-{t.family}-{t.name}"


def checked(proto: onnx.ModelProto, feeds: dict, **kw) -> Scenario:
    """A scenario whose outputs are compared with onnxruntime's on the same feeds (arrays:
    numpy scalars become 0-d arrays, which onnxruntime wants)."""
    feeds = {name: np.asarray(value) for name, value in feeds.items()}
    return Scenario(proto.SerializeToString(), feeds, feeds, **kw)


def refused(proto: onnx.ModelProto | bytes, feeds: dict | None = None, **kw) -> Scenario:
    """A scenario polyonnx must refuse (with a PolyonnxError)."""
    data = proto if isinstance(proto, bytes) else proto.SerializeToString()
    return Scenario(data, feeds or {}, feeds, expect="refuse", **kw)


def nprng(rng: random.Random) -> np.random.Generator:
    return np.random.default_rng(rng.randrange(2**32))


# ---- 1. byte-level damage to real models ------------------------------------------------


def _damaged(rng: random.Random, kind: str) -> Scenario:
    path = ROOT / rng.choice(REAL_MODELS)
    data, where = damage(path.read_bytes(), kind, rng)
    files = {}
    for extra in path.parent.glob(path.stem + ".data"):
        files[extra.name] = extra.read_bytes()
    try:
        feeds = feeds_for(onnx.load_model_from_string(data), nprng(rng))
    except Exception:  # the damage broke the protobuf or its types: feed nothing
        feeds = {}
    return Scenario(data, feeds, feeds, files=files, note=f"{path.name}: {where}")


for _kind in ("truncate", "bitflip", "insert", "delete", "varint"):

    def _make(rng: random.Random, kind: str = _kind) -> Scenario:
        return _damaged(rng, kind)

    _make.__name__ = f"bytes_{_kind}"
    template("bytes")(_make)


@template("bytes")
def bytes_external_data_damage(rng: random.Random) -> Scenario:
    """resnet_torchscript's .data file truncated or with bits flipped."""
    path = ROOT / "tests/data/torch/resnet_torchscript.onnx"
    data = (path.parent / "resnet_torchscript.data").read_bytes()
    kind = rng.choice(["truncate", "bitflip"])
    bad, where = damage(data, kind, rng)
    feeds = feeds_for(onnx.load(path, load_external_data=False), nprng(rng))
    return Scenario(
        path.read_bytes(), feeds, feeds, files={"resnet_torchscript.data": bad}, note=where
    )


# ---- 2. structural damage --------------------------------------------------------------


def _x(m: int = 8, k: int = 16, rng: random.Random | None = None) -> dict:
    gen = np.random.default_rng(0 if rng is None else rng.randrange(2**32))
    return {"x": gen.standard_normal((m, k)).astype(np.float32)}


@template("structure")
def dangling_input(rng: random.Random) -> Scenario:
    proto = mm_bias_relu()
    node = proto.graph.node[rng.randrange(3)]
    node.input[rng.randrange(len(node.input))] = rng.choice(["ghost", "", "y"])
    return checked(proto, _x(rng=rng))


@template("structure")
def duplicate_names(rng: random.Random) -> Scenario:
    proto = mm_bias_relu()
    graph = proto.graph
    how = rng.choice(["output", "input_init", "init_init", "node_name", "input_input"])
    if how == "output":
        graph.node[1].output[0] = "t"
    elif how == "input_init":
        graph.input.append(vi("w", F32, [3, 3]))
    elif how == "init_init":
        graph.initializer.append(const("w", np.ones((2, 2), np.float32)))
    elif how == "node_name":
        for node in graph.node:
            node.name = "same"
    else:
        graph.input.append(vi("x", F32, [8, 16]))
    return checked(proto, _x(rng=rng), note=how)


@template("structure")
def cycle(rng: random.Random) -> Scenario:
    proto = mm_bias_relu()
    graph = proto.graph
    if rng.random() < 0.5:
        graph.node[2].input[0] = "y"  # Relu reads its own output
    else:
        graph.node[0].input[0] = "u"  # mm -> bias -> mm
    return checked(proto, _x(rng=rng))


@template("structure")
def missing_outputs(rng: random.Random) -> Scenario:
    proto = mm_bias_relu()
    how = rng.choice(["duplicate", "none", "unknown", "input_as_output"])
    del proto.graph.output[:]
    if how == "unknown":
        proto.graph.output.append(vi("nowhere", F32, [8, 12]))
    elif how == "input_as_output":
        proto.graph.output.append(vi("x", F32, [8, 16]))
    elif how == "duplicate":
        proto.graph.output.extend([vi("y", F32, [8, 12]), vi("y", F32, [8, 12])])
    return checked(proto, _x(rng=rng), note=how)


@template("structure")
def wrong_initializer_size(rng: random.Random) -> Scenario:
    proto = mm_bias_relu()
    w = proto.graph.initializer[0]
    how = rng.choice(["short_raw", "long_raw", "float_data", "dims", "negative_dim", "huge_dim"])
    if how == "short_raw":
        w.raw_data = w.raw_data[: rng.randrange(len(w.raw_data))]
    elif how == "long_raw":
        w.raw_data = w.raw_data + b"\0" * rng.choice([1, 4, 1000])
    elif how == "float_data":
        w.ClearField("raw_data")
        w.float_data.extend([1.0] * rng.choice([0, 3, 191]))
    elif how == "dims":
        w.dims[0] = rng.choice([15, 17, 0])
    elif how == "negative_dim":
        w.dims[0] = -16
    else:
        w.dims[0] = 2**40
    return checked(proto, _x(rng=rng), note=how)


@template("structure")
def wrong_types(rng: random.Random) -> Scenario:
    proto = mm_bias_relu()
    graph = proto.graph
    how = rng.choice(["init_int64", "output_int32", "input_int32", "bool_matmul"])
    feeds = _x(rng=rng)
    if how == "init_int64":
        graph.initializer[1].CopyFrom(const("b", np.arange(12, dtype=np.int64)))
    elif how == "output_int32":
        graph.output[0].type.tensor_type.elem_type = I32
    elif how == "input_int32":
        graph.input[0].type.tensor_type.elem_type = I32
        feeds = {"x": np.ones((8, 16), np.int32)}
    else:
        graph.input[0].type.tensor_type.elem_type = TensorProto.BOOL
        feeds = {"x": np.ones((8, 16), bool)}
    return Scenario(proto.SerializeToString(), feeds, feeds, note=how)


@template("structure")
def empty_graph(rng: random.Random) -> Scenario:
    how = rng.choice(["nothing", "passthrough", "init_output", "no_inputs"])
    x = {"x": np.ones((2, 3), np.float32)}
    if how == "nothing":
        proto = model([], [], [])
        x = {}
    elif how == "passthrough":
        proto = model([], [vi("x", F32, [2, 3])], [vi("x", F32, [2, 3])])
    elif how == "init_output":
        proto = model([], [], [vi("c", F32, [2])], [const("c", np.ones(2, np.float32))])
        x = {}
    else:
        proto = model([], [], [vi("y", F32, [2])])
        x = {}
    return Scenario(proto.SerializeToString(), x, x, note=how)


@template("structure")
def wrong_arity(rng: random.Random) -> Scenario:
    op, inputs, outputs = rng.choice(
        [
            ("MatMul", ["a"], ["y"]),
            ("Add", [], ["y"]),
            ("Add", ["a", "b", "a"], ["y"]),
            ("Relu", ["a", "b", "a"], ["y"]),
            ("Relu", ["a"], ["y", "z"]),
            ("Gemm", ["a"], ["y"]),
            ("Relu", ["a"], []),
            ("Where", ["a", "b"], ["y"]),
            ("Conv", ["a"], ["y"]),
        ]
    )
    node = helper.make_node(op, inputs, outputs, name="n")
    proto = model(
        [node], [vi("a", F32, [3, 3]), vi("b", F32, [3, 3])], [vi(o, F32, None) for o in outputs]
    )
    feeds = {"a": np.eye(3, dtype=np.float32), "b": np.ones((3, 3), np.float32)}
    return Scenario(proto.SerializeToString(), feeds, feeds, note=f"{op}{inputs}->{outputs}")


@template("structure")
def invalid_utf8(rng: random.Random) -> Scenario:
    where = rng.choice(["graph", "node", "tensor", "op_type", "domain", "doc", "init"])
    mark = "QZQZQZ"
    proto = mm_bias_relu()
    if where == "graph":
        proto.graph.name = mark
    elif where == "node":
        proto.graph.node[0].name = mark
    elif where == "tensor":
        proto.graph.node[0].output[0] = mark
        proto.graph.node[1].input[0] = mark
    elif where == "op_type":
        proto.graph.node[2].op_type = "Relu" + mark[:2]
        mark = "Relu" + mark[:2]
    elif where == "domain":
        proto.graph.node[2].domain = mark
    elif where == "doc":
        proto.graph.doc_string = mark
    else:
        proto.graph.initializer[1].name = mark
        proto.graph.node[1].input[1] = mark
    bad = rng.choice([b"\xff\xfe\xfd\xfc\xfb\xfa", b"\xc3(\xa0\xa1\xe2(", b"\xed\xa0\x80abc"])
    data = replace_name(proto.SerializeToString(), mark, bad[: len(mark)].ljust(len(mark), b"\xff"))
    return Scenario(data, _x(rng=rng), None, source=rng.choice(["path", "bytes"]), note=where)


@template("structure")
def unknown_dtype(rng: random.Random) -> Scenario:
    how = rng.choice(["init", "input", "cast", "output"])
    proto = mm_bias_relu()
    feeds = _x(rng=rng)
    if how == "init":
        proto.graph.initializer[1].data_type = 99
    elif how == "input":
        proto.graph.input[0].type.tensor_type.elem_type = 99
    elif how == "output":
        proto.graph.output[0].type.tensor_type.elem_type = 99
    else:
        proto = unary("Cast", [2, 3], to=99)
        feeds = {"x": np.ones((2, 3), np.float32)}
    return Scenario(proto.SerializeToString(), feeds, None, note=how)


@template("structure")
def string_tensors(rng: random.Random) -> Scenario:
    how = rng.choice(["identity", "concat_init", "add", "cast", "gather"])
    strs = np.array(["a", "bc", "déf"], dtype=object)
    S = TensorProto.STRING
    if how == "identity":
        proto = model(
            [helper.make_node("Identity", ["x"], ["y"])], [vi("x", S, [3])], [vi("y", S, [3])]
        )
    elif how == "concat_init":
        node = helper.make_node("Concat", ["x", "c"], ["y"], axis=0)
        proto = model([node], [vi("x", S, [3])], [vi("y", S, [6])], [const("c", strs)])
    elif how == "add":
        proto = model(
            [helper.make_node("Add", ["x", "x"], ["y"])], [vi("x", S, [3])], [vi("y", S, [3])]
        )
    elif how == "cast":
        node = helper.make_node("Cast", ["x"], ["y"], to=F32)
        proto = model([node], [vi("x", S, [3])], [vi("y", F32, [3])])
        strs = np.array(["1.5", "-2", "nan"], dtype=object)
    else:
        node = helper.make_node("Gather", ["c", "i"], ["y"], axis=0)
        proto = model([node], [vi("i", I64, [2])], [vi("y", S, [2])], [const("c", strs)])
        return Scenario(proto.SerializeToString(), {"i": np.array([0, 2])}, {"i": np.array([0, 2])})
    feeds = {"x": strs}
    return Scenario(proto.SerializeToString(), feeds, feeds, note=how)


def _external(location: str, offset: str = "0", length: str | None = None) -> onnx.ModelProto:
    """mm_bias_relu whose bias ``b`` (12 float32, 48 bytes) is stored at ``location``."""
    proto = mm_bias_relu()
    b = proto.graph.initializer[1]
    b.ClearField("raw_data")
    b.data_location = TensorProto.EXTERNAL
    entries = [("location", location), ("offset", offset)]
    if length is not None:
        entries.append(("length", length))
    for key, value in entries:
        b.external_data.add(key=key, value=value)
    return proto


BIAS = np.random.default_rng(0).standard_normal(16 * 12 + 12).astype(np.float32)[-12:].tobytes()


@template("structure")
def external_traversal(rng: random.Random) -> Scenario:
    """External data outside the model's directory: must be refused in every form."""
    how = rng.choice(
        ["dotdot", "absolute", "symlink_file", "symlink_dir", "nested_dotdot", "dotdot_backslash"]
    )
    files = {"../secret.bin": BIAS}
    links = {}
    location = {
        "dotdot": "../secret.bin",
        "nested_dotdot": "sub/../../secret.bin",
        "absolute": "@ABS@/secret.bin",
        "symlink_file": "link.bin",
        "symlink_dir": "outside/secret.bin",
        "dotdot_backslash": "..\\secret.bin",
    }[how]
    if how == "symlink_file":
        links["link.bin"] = "../secret.bin"
    elif how == "symlink_dir":
        links["outside"] = ".."
    elif how == "nested_dotdot":
        files["sub/placeholder"] = b""
    proto = _external(location)
    return refused(proto, _x(rng=rng), files=files, links=links, note=how)


@template("structure")
def external_bad_entries(rng: random.Random) -> Scenario:
    """External data entries that are wrong but stay inside the directory."""
    how = rng.choice(
        [
            "missing",
            "offset_past_end",
            "huge_length",
            "negative_offset",
            "nan_offset",
            "directory",
            "short",
            "empty_location",
            "nul",
        ]
    )
    files = {"b.bin": BIAS}
    location, offset, length = "b.bin", "0", None
    if how == "missing":
        location = "nothere.bin"
    elif how == "offset_past_end":
        offset = "4096"
    elif how == "huge_length":
        length = str(2**40)
    elif how == "negative_offset":
        offset = "-8"
    elif how == "nan_offset":
        offset = "abc"
    elif how == "directory":
        files = {"d/x": b""}
        location = "d"
    elif how == "short":
        files = {"b.bin": BIAS[:20]}
    elif how == "empty_location":
        location = ""
    else:
        location = "b.bin\0../../etc/passwd"
    proto = _external(location, offset, length)
    feeds = _x(rng=rng)
    return Scenario(
        proto.SerializeToString(),
        feeds,
        feeds,
        files=files,
        source=rng.choice(["path", "bytes"]),
        note=how,
    )


def _if_model(then_out: int, else_out: int, bad_name: bool) -> onnx.ModelProto:
    """If(c) with branches of ``then_out`` and ``else_out`` outputs (x + x, or x + ghost)."""

    def branch(name: str, count: int) -> onnx.GraphProto:
        outs = [f"{name}{i}" for i in range(count)]
        other = "ghost" if bad_name else "x"
        nodes = [helper.make_node("Add", ["x", other], [o]) for o in outs]
        return helper.make_graph(nodes, name, [], [vi(o, F32, [2]) for o in outs])

    node = helper.make_node(
        "If", ["c"], ["y"], then_branch=branch("t", then_out), else_branch=branch("e", else_out)
    )
    return model([node], [vi("c", TensorProto.BOOL, []), vi("x", F32, [2])], [vi("y", F32, [2])])


@template("structure")
def subgraph_damage(rng: random.Random) -> Scenario:
    how = rng.choice(
        ["then_two_outputs", "else_none", "undefined_name", "no_else", "loop_body", "cond_float"]
    )
    feeds = {"c": np.array(True), "x": np.ones(2, np.float32)}
    if how == "then_two_outputs":
        proto = _if_model(2, 1, False)
    elif how == "else_none":
        proto = _if_model(1, 0, False)
    elif how == "undefined_name":
        proto = _if_model(1, 1, True)
    elif how == "no_else":
        proto = _if_model(1, 1, False)
        attrs = [a for a in proto.graph.node[0].attribute if a.name != "else_branch"]
        del proto.graph.node[0].attribute[:]
        proto.graph.node[0].attribute.extend(attrs)
    elif how == "cond_float":
        proto = _if_model(1, 1, False)
        proto.graph.input[0].type.tensor_type.elem_type = F32
        feeds = {"c": np.array(1.0, np.float32), "x": np.ones(2, np.float32)}
    else:
        body = helper.make_graph(
            [helper.make_node("Add", ["v", "v"], ["w"])],
            "body",
            [vi("v", F32, [2])],  # a Loop body needs (iter, cond, state...) inputs
            [vi("w", F32, [2])],
        )
        node = helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)
        proto = model([node], [vi("n", I64, []), vi("x", F32, [2])], [vi("y", F32, [2])])
        feeds = {"n": np.array(3, np.int64), "x": np.ones(2, np.float32)}
    return Scenario(proto.SerializeToString(), feeds, feeds, note=how)


@template("structure")
def bad_opset_and_ir(rng: random.Random) -> Scenario:
    how = rng.choice(
        [
            "opset_999",
            "opset_0",
            "no_opset",
            "ir_99",
            "ir_0",
            "unknown_domain",
            "unknown_op",
            "ml_domain_only",
        ]
    )
    proto = mm_bias_relu()
    if how == "opset_999":
        proto.opset_import[0].version = 999
    elif how == "opset_0":
        proto.opset_import[0].version = 0
    elif how == "no_opset":
        del proto.opset_import[:]
    elif how == "ir_99":
        proto.ir_version = 99
    elif how == "ir_0":
        proto.ir_version = 0
    elif how == "unknown_domain":
        proto.graph.node[2].domain = "com.example.nothing"
    elif how == "unknown_op":
        proto.graph.node[2].op_type = "Frobnicate"
    else:
        proto.opset_import[0].domain = "ai.onnx.ml"
    return checked(proto, _x(rng=rng), note=how)


@template("structure")
def bad_attribute_types(rng: random.Random) -> Scenario:
    how = rng.choice(
        ["perm_float", "perm_string", "axis_tensor", "missing_required", "unknown_attr"]
    )
    if how == "perm_float":
        proto = unary("Transpose", [2, 3], perm=[1.0, 0.0])
    elif how == "perm_string":
        proto = unary("Transpose", [2, 3], perm="10")
    elif how == "axis_tensor":
        proto = unary("Softmax", [2, 3], axis=const("t", np.array([1])))
    elif how == "missing_required":
        proto = unary("Cast", [2, 3])
    else:
        proto = unary("Relu", [2, 3], frobnicate=3)
    feeds = {"x": np.ones((2, 3), np.float32)}
    return Scenario(proto.SerializeToString(), feeds, feeds, note=how)


@template("structure")
def bad_declared_shapes(rng: random.Random) -> Scenario:
    how = rng.choice(
        ["negative_dim", "huge_dim", "wrong_output_shape", "zero_rank_mismatch", "no_type"]
    )
    proto = mm_bias_relu()
    feeds = _x(rng=rng)
    dims = proto.graph.input[0].type.tensor_type.shape.dim
    if how == "negative_dim":
        dims[0].dim_value = -8
    elif how == "huge_dim":
        dims[0].dim_value = 2**40
    elif how == "wrong_output_shape":
        proto.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 5
    elif how == "zero_rank_mismatch":
        del dims[:]
        feeds = {"x": np.ones((), np.float32)}
    else:
        proto.graph.input[0].ClearField("type")
    return Scenario(proto.SerializeToString(), feeds, feeds, note=how)


# ---- 3. semantic edge cases --------------------------------------------------------------


def _int_inputs(elem: int, a: np.ndarray, b: np.ndarray, op: str, **attrs) -> onnx.ModelProto:
    node = helper.make_node(op, ["a", "b"], ["y"], name=op.lower(), **attrs)
    return model([node], [vi("a", elem, a.shape), vi("b", elem, b.shape)], [vi("y", elem, None)])


@template("semantics")
def int_min_by_minus_one(rng: random.Random) -> Scenario:
    """INT_MIN / -1 overflows: a documented result or a PolyonnxError, never SIGFPE."""
    dtype, op = rng.choice(
        [(d, o) for o in ("Div", "Mod", "Mod_fmod") for d in (np.int32, np.int64)]
    )
    size = rng.choice([1, 7, 64])
    a = np.full(size, np.iinfo(dtype).min, dtype)
    b = np.full(size, -1, dtype)
    elem = I32 if dtype is np.int32 else I64
    attrs = {"fmod": 1} if op == "Mod_fmod" else {}
    proto = _int_inputs(elem, a, b, op.split("_")[0], **attrs)
    feeds = {"a": a, "b": b}
    return Scenario(proto.SerializeToString(), feeds, None, note=f"{op} {np.dtype(dtype)}[{size}]")


@template("semantics")
def int_division_by_zero(rng: random.Random) -> Scenario:
    """x / 0 and x % 0 on integers: a RunError, never a trap or silent 0."""
    dtype, op = rng.choice(
        [(d, o) for d in (np.int32, np.int64, np.uint8, np.int8) for o in ("Div", "Mod")][::-1]
    )
    size = rng.choice([1, 5, 33])
    a = np.arange(1, size + 1).astype(dtype)
    b = np.ones(size, dtype)
    b[rng.randrange(size)] = 0
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    proto = _int_inputs(elem, a, b, op)
    return Scenario(
        proto.SerializeToString(),
        {"a": a, "b": b},
        None,
        expect="refuse",
        note=f"{op} {np.dtype(dtype)}",
    )


@template("semantics")
def int_division_by_zero_constant(rng: random.Random) -> Scenario:
    """A divisor of 0 known at load time (an initializer): folded or lowered, never a trap."""
    dtype, op = rng.choice([(d, o) for d in (np.int32, np.int64) for o in ("Div", "Mod")])
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node(op, ["a", "z"], ["y"], name="div")
    proto = model(
        [node], [vi("a", elem, [4])], [vi("y", elem, None)], [const("z", np.zeros(4, dtype))]
    )
    return Scenario(
        proto.SerializeToString(), {"a": np.arange(4).astype(dtype)}, None, expect="refuse"
    )


@template("semantics")
def huge_pads(rng: random.Random) -> Scenario:
    op, pad = rng.choice(
        [
            ("Conv", 2**40),
            ("AveragePool", 2**62),
            ("Pad", 2**40),
            ("Conv", 2**62),
            ("Pad", 2**31),
            ("MaxPool", 2**40),
            ("AveragePool", 2**33 + 1),
        ]
    )
    feeds = {"x": np.ones((1, 1, 4, 4), np.float32)}
    if op == "Conv":
        node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[pad] * 4, name="conv")
        proto = model(
            [node],
            [vi("x", F32, [1, 1, 4, 4])],
            [vi("y", F32, None)],
            [const("w", np.ones((1, 1, 3, 3), np.float32))],
        )
    elif op == "Pad":
        node = helper.make_node("Pad", ["x", "p"], ["y"], name="pad")
        proto = model(
            [node],
            [vi("x", F32, [1, 1, 4, 4])],
            [vi("y", F32, None)],
            [const("p", np.array([0, 0, pad, 0, 0, 0, 0, pad], np.int64))],
        )
    else:
        proto = unary(op, [1, 1, 4, 4], kernel_shape=[2, 2], pads=[pad] * 4)
    return Scenario(proto.SerializeToString(), feeds, feeds, note=f"{op} pad {pad}")


@template("semantics")
def huge_range(rng: random.Random) -> Scenario:
    limit, dtype = rng.choice(
        [(2**40, np.int64), (2**40, np.float32), (2**62, np.int64), (2**33, np.float32)]
    )
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node("Range", ["s", "l", "d"], ["y"], name="range")
    inits = [
        const("s", np.array(0, dtype)),
        const("l", np.array(limit, dtype)),
        const("d", np.array(1, dtype)),
    ]
    proto = model([node], [], [vi("y", elem, None)], inits)
    return Scenario(
        proto.SerializeToString(), {}, {}, note=f"Range(0, {limit}, 1) {np.dtype(dtype)}"
    )


@template("semantics")
def huge_constant_of_shape(rng: random.Random) -> Scenario:
    how, shape = rng.choice(
        [
            ("initializer", [2**40]),
            ("input_value", [2**40]),
            ("initializer", [2**20, 2**20]),
            ("initializer", [2**31, 2**31, 2**31]),
            ("input_value", [2**62]),
        ]
    )
    node = helper.make_node("ConstantOfShape", ["s"], ["y"], name="cos")
    if how == "initializer":
        proto = model([node], [], [vi("y", F32, None)], [const("s", np.array(shape, np.int64))])
        feeds = {}
    else:
        proto = model([node], [vi("s", I64, [len(shape)])], [vi("y", F32, None)])
        feeds = {"s": np.array(shape, np.int64)}
    return Scenario(proto.SerializeToString(), feeds, feeds, note=f"{how} {shape}")


@template("semantics")
def huge_resize(rng: random.Random) -> Scenario:
    how = rng.choice(["scales", "sizes", "sizes_huge"])
    feeds = {"x": np.ones((1, 1, 2, 2), np.float32)}
    if how == "scales":
        inputs = ["x", "", "sc"]
        inits = [const("sc", np.array([1, 1, 1e6, 1e6], np.float32))]
    elif how == "sizes":
        inputs = ["x", "", "", "sz"]
        inits = [const("sz", np.array([1, 1, 2**31, 1], np.int64))]
    else:
        inputs = ["x", "", "", "sz"]
        inits = [const("sz", np.array([1, 1, 2**40, 2**40], np.int64))]
    node = helper.make_node(
        "Resize", inputs, ["y"], name="resize", mode=rng.choice(["nearest", "linear"])
    )
    proto = model([node], [vi("x", F32, [1, 1, 2, 2])], [vi("y", F32, None)], inits)
    return Scenario(proto.SerializeToString(), feeds, feeds, note=how)


@template("semantics")
def huge_sparse_initializer(rng: random.Random) -> Scenario:
    dims = rng.choice([[2**40], [2**20, 2**21], [2**62]])
    values = const("v", np.array([1.0], np.float32))
    indices = const("i", np.array([5], np.int64))
    sparse = helper.make_sparse_tensor(values, indices, dims)
    sparse.values.name = "s"
    node = helper.make_node("Identity", ["s"], ["y"], name="id")
    proto = model([node], [], [vi("y", F32, None)], sparse_initializer=[sparse])
    return Scenario(proto.SerializeToString(), {}, {}, note=str(dims))


@template("semantics")
def huge_tile_expand(rng: random.Random) -> Scenario:
    op = rng.choice(["Tile", "Expand"])
    if op == "Tile":
        node = helper.make_node("Tile", ["x", "r"], ["y"], name="tile")
        init = const("r", np.array([2**40, 1], np.int64))
    else:
        node = helper.make_node("Expand", ["x", "r"], ["y"], name="expand")
        init = const("r", np.array([2**40, 3], np.int64))
    proto = model([node], [vi("x", F32, [1, 3])], [vi("y", F32, None)], [init])
    feeds = {"x": np.ones((1, 3), np.float32)}
    return Scenario(proto.SerializeToString(), feeds, feeds, note=op)


@template("semantics")
def high_rank(rng: random.Random) -> Scenario:
    shape, op = rng.choice(
        [
            ([2] * 10, "Relu"),
            ([1] * 20, "Relu"),
            ([2] * 10, "Add"),
            ([2] * 9, "Transpose"),
            ([1, 2] * 6, "ReduceSum"),
            ([3] * 7, "Softmax"),
            ([1] * 20, "Transpose"),
        ]
    )
    feeds = {"x": nprng(rng).standard_normal(shape).astype(np.float32)}
    if op == "Add":
        proto = binary("Add", shape, shape[-1:])
        feeds = {"a": feeds["x"], "b": np.ones(shape[-1:], np.float32)}
    elif op == "Transpose":
        proto = unary("Transpose", shape, perm=list(reversed(range(len(shape)))))
    elif op == "ReduceSum":
        proto = unary("ReduceSum", shape, keepdims=0)
    else:
        proto = unary(op, shape)
    return Scenario(proto.SerializeToString(), feeds, feeds, note=f"{op} {shape}")


@template("semantics")
def zero_size_dims(rng: random.Random) -> Scenario:
    op = rng.choice(
        ["Relu", "MatMul", "ReduceSum", "Concat", "Softmax", "Gather", "ReduceMax", "Conv"]
    )
    gen = nprng(rng)
    if op == "MatMul":
        proto = binary("MatMul", [0, 4], [4, 5])
        feeds = {
            "a": np.ones((0, 4), np.float32),
            "b": gen.standard_normal((4, 5)).astype(np.float32),
        }
    elif op == "ReduceSum":
        proto = unary("ReduceSum", [3, 0], keepdims=1)
        feeds = {"x": np.ones((3, 0), np.float32)}
    elif op == "ReduceMax":
        proto = unary("ReduceMax", [3, 0], keepdims=1)
        feeds = {"x": np.ones((3, 0), np.float32)}
    elif op == "Concat":
        node = helper.make_node("Concat", ["a", "b"], ["y"], axis=0)
        proto = model([node], [vi("a", F32, [0, 3]), vi("b", F32, [2, 3])], [vi("y", F32, None)])
        feeds = {
            "a": np.ones((0, 3), np.float32),
            "b": gen.standard_normal((2, 3)).astype(np.float32),
        }
    elif op == "Gather":
        node = helper.make_node("Gather", ["x", "i"], ["y"], axis=0)
        proto = model([node], [vi("x", F32, [3, 2]), vi("i", I64, [0])], [vi("y", F32, None)])
        feeds = {"x": np.ones((3, 2), np.float32), "i": np.zeros(0, np.int64)}
    elif op == "Conv":
        node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv")
        proto = model(
            [node],
            [vi("x", F32, [0, 1, 4, 4])],
            [vi("y", F32, None)],
            [const("w", np.ones((1, 1, 3, 3), np.float32))],
        )
        feeds = {"x": np.ones((0, 1, 4, 4), np.float32)}
    else:
        proto = unary(op, [0, 5])
        feeds = {"x": np.ones((0, 5), np.float32)}
    return Scenario(proto.SerializeToString(), feeds, feeds, note=op)


def _invalid(rng: random.Random, which: str) -> Scenario:
    """Attributes the ONNX spec forbids (onnxruntime refuses them): must be refused."""
    x23 = {"x": np.ones((2, 3), np.float32)}
    x4 = {"x": np.ones((1, 1, 4, 4), np.float32)}
    w = const("w", np.ones((1, 1, 3, 3), np.float32))
    if which == "transpose_perm":
        perm = rng.choice([[0, 5], [0, 0], [1], [0, 1, 2], [-1, 0]])
        return refused(unary("Transpose", [2, 3], perm=perm), x23, note=str(perm))
    if which == "gather_axis":
        axis = rng.choice([-5, 2, 7, -3])  # rank 2
        node = helper.make_node("Gather", ["x", "i"], ["y"], axis=axis, name="gather")
        proto = model(
            [node], [vi("x", F32, [2, 3])], [vi("y", F32, None)], [const("i", np.array([0, 1]))]
        )
        return refused(proto, x23, note=f"axis {axis}")
    if which == "conv_negative_pads":
        pads = rng.choice([[-1, -1, -1, -1], [0, 0, -2, 0], [-5, 0, 0, 0]])
        node = helper.make_node("Conv", ["x", "w"], ["y"], pads=pads, name="conv")
        proto = model([node], [vi("x", F32, [1, 1, 4, 4])], [vi("y", F32, None)], [w])
        return refused(proto, x4, note=str(pads))
    if which == "convtranspose_output_padding":
        stride = rng.choice([1, 2])
        node = helper.make_node(
            "ConvTranspose",
            ["x", "w"],
            ["y"],
            strides=[stride] * 2,
            output_padding=[stride, stride + rng.randrange(3)],
            name="convt",
        )
        proto = model([node], [vi("x", F32, [1, 1, 4, 4])], [vi("y", F32, None)], [w])
        return refused(proto, x4, note=f"stride {stride}")
    if which == "pad_reflect_wide":
        p = rng.choice([3, 4, 10])
        node = helper.make_node("Pad", ["x", "p"], ["y"], mode="reflect", name="pad")
        proto = model(
            [node],
            [vi("x", F32, [2, 3])],
            [vi("y", F32, None)],
            [const("p", np.array([0, p, 0, p], np.int64))],
        )
        return refused(proto, x23, note=f"reflect pad {p} on dim 3")
    if which == "reducesum_keepdims":
        keep = rng.choice([5, -1, 2])
        node = helper.make_node("ReduceSum", ["x"], ["y"], keepdims=keep, name="rsum")
        proto = model([node], [vi("x", F32, [2, 3])], [vi("y", F32, None)])
        return refused(proto, x23, note=f"keepdims {keep}")
    if which == "concat_scalars":
        node = helper.make_node("Concat", ["a", "b"], ["y"], axis=0, name="concat")
        proto = model([node], [vi("a", F32, []), vi("b", F32, [])], [vi("y", F32, None)])
        feeds = {"a": np.array(1, np.float32), "b": np.array(2, np.float32)}
        return refused(proto, feeds)
    if which == "concat_axis":
        node = helper.make_node(
            "Concat", ["x", "x"], ["y"], axis=rng.choice([2, -3, 9]), name="concat"
        )
        return refused(model([node], [vi("x", F32, [2, 3])], [vi("y", F32, None)]), x23)
    if which == "softmax_axis":
        return refused(unary("Softmax", [2, 3], axis=rng.choice([2, -3])), x23)
    if which == "conv_zero_stride":
        node = helper.make_node("Conv", ["x", "w"], ["y"], strides=[0, 1], name="conv")
        proto = model([node], [vi("x", F32, [1, 1, 4, 4])], [vi("y", F32, None)], [w])
        return refused(proto, x4)
    if which == "conv_zero_dilation":
        node = helper.make_node("Conv", ["x", "w"], ["y"], dilations=[0, 0], name="conv")
        proto = model([node], [vi("x", F32, [1, 1, 4, 4])], [vi("y", F32, None)], [w])
        return refused(proto, x4)
    if which == "split_sizes":
        node = helper.make_node("Split", ["x", "s"], ["y", "z"], axis=1, name="split")
        proto = model(
            [node],
            [vi("x", F32, [2, 3])],
            [vi("y", F32, None), vi("z", F32, None)],
            [const("s", np.array([2, 5], np.int64))],
        )
        return refused(proto, x23)
    if which == "reshape_mismatch":
        node = helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")
        proto = model(
            [node],
            [vi("x", F32, [2, 3])],
            [vi("y", F32, None)],
            [const("s", np.array(rng.choice([[4, 2], [-1, -1], [7], [0, 0, 0]]), np.int64))],
        )
        return refused(proto, x23)
    raise ValueError(which)


INVALID = (
    "transpose_perm",
    "gather_axis",
    "conv_negative_pads",
    "convtranspose_output_padding",
    "pad_reflect_wide",
    "reducesum_keepdims",
    "concat_scalars",
    "concat_axis",
    "softmax_axis",
    "conv_zero_stride",
    "conv_zero_dilation",
    "split_sizes",
    "reshape_mismatch",
)

for _which in INVALID:

    def _make_invalid(rng: random.Random, which: str = _which) -> Scenario:
        return _invalid(rng, which)

    _make_invalid.__name__ = f"invalid_{_which}"
    template("semantics")(_make_invalid)


@template("semantics")
def malformed_constant(rng: random.Random) -> Scenario:
    how = rng.choice(
        ["no_value", "two_values", "value_int_list_empty", "sparse_huge", "value_string"]
    )
    if how == "no_value":
        node = helper.make_node("Constant", [], ["y"], name="c")
    elif how == "two_values":
        node = helper.make_node("Constant", [], ["y"], name="c", value_float=1.0, value_int=2)
    elif how == "value_int_list_empty":
        node = helper.make_node("Constant", [], ["y"], name="c")
        node.attribute.append(
            helper.make_attribute("value_ints", [], attr_type=onnx.AttributeProto.INTS)
        )
    elif how == "sparse_huge":
        sparse = helper.make_sparse_tensor(
            const("v", np.array([1.0], np.float32)), const("i", np.array([3], np.int64)), [2**40]
        )
        node = helper.make_node("Constant", [], ["y"], name="c", sparse_value=sparse)
    else:
        node = helper.make_node("Constant", [], ["y"], name="c", value_string="abc")
    add = helper.make_node("Add", ["y", "x"], ["z"], name="add")
    proto = model([node, add], [vi("x", F32, [2])], [vi("z", F32, None)])
    feeds = {"x": np.ones(2, np.float32)}
    return Scenario(proto.SerializeToString(), feeds, feeds, note=how)


# ---- 3b. random valid models, checked against onnxruntime --------------------------------

UNARY_FLOAT = (
    "Relu",
    "Sigmoid",
    "Tanh",
    "Exp",
    "Log",
    "Sqrt",
    "Abs",
    "Neg",
    "Floor",
    "Ceil",
    "Erf",
    "Sin",
    "Cos",
    "Softplus",
    "LeakyRelu",
    "Elu",
    "HardSigmoid",
    "Sign",
    "Reciprocal",
    "Round",
    "Selu",
    "Softsign",
    "Atan",
    "Gelu",
)
BINARY_FLOAT = ("Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Equal", "Less", "Greater")


def _shape(rng: random.Random, rank: int, dims=(1, 2, 3, 5, 8, 17)) -> list[int]:
    return [rng.choice(dims) for _ in range(rank)]


def _broadcast_operand(rng: random.Random, shape: list[int]) -> list[int]:
    """A shape that broadcasts to ``shape``: leading dims dropped, some dims set to 1."""
    cut = rng.randrange(len(shape) + 1)
    return [1 if rng.random() < 0.3 else d for d in shape[cut:]]


@template("semantics")
def random_elementwise(rng: random.Random) -> Scenario:
    """A unary or broadcasting binary op on random shapes (odd, size-1 and empty dims)."""
    op = rng.choice(UNARY_FLOAT + BINARY_FLOAT)
    dims = (0, 1, 2, 3, 5, 8, 17) if rng.random() < 0.15 else (1, 2, 3, 5, 8, 17)
    shape = _shape(rng, rng.randrange(0, 5), dims)
    gen = nprng(rng)
    if op in UNARY_FLOAT:
        x = (3 * gen.standard_normal(shape)).astype(np.float32)
        if op in ("Log", "Sqrt"):
            x = np.abs(x) + np.float32(0.01)
        node = helper.make_node(op, ["a"], ["y"], name="op")
        proto = model([node], [vi("a", F32, shape)], [vi("y", None, None)], opset=20)
        feeds = {"a": x}
    else:
        b_shape = _broadcast_operand(rng, shape)
        a, b = shape, b_shape
        if rng.random() < 0.5:
            a, b = b, a
        xa = (3 * gen.standard_normal(a)).astype(np.float32)
        xb = (3 * gen.standard_normal(b)).astype(np.float32)
        if op == "Pow":
            xa = np.abs(xa) + np.float32(0.1)
        node = helper.make_node(op, ["a", "b"], ["y"], name="op")
        proto = model([node], [vi("a", F32, a), vi("b", F32, b)], [vi("y", None, None)], opset=20)
        feeds = {"a": xa, "b": xb}
    return checked(proto, feeds, note=f"{op} {shape}")


@template("semantics")
def random_integer_arith(rng: random.Random) -> Scenario:
    """Integer ops with signs, wrap-around and extremes (divisors never 0 or -1 here)."""
    op = rng.choice(["Div", "Mod", "Add", "Sub", "Mul", "Abs", "Neg", "Mod_fmod", "Max", "Min"])
    dtype = rng.choice([np.int32, np.int64, np.int8, np.uint8, np.int16, np.uint32])
    info = np.iinfo(dtype)
    gen = nprng(rng)
    size = rng.choice([1, 5, 16, 33])
    edges = np.array([info.min, info.max, 0, 1, info.max // 2 + 1], dtype=dtype)
    a = np.concatenate(
        [edges, gen.integers(info.min, info.max, size=size, endpoint=True, dtype=dtype)]
    )
    b = gen.integers(info.min, info.max, size=a.size, endpoint=True, dtype=dtype)
    if op.startswith(("Div", "Mod")):
        b[(b == 0) | ((b == -1) if info.min < 0 else False)] = 3
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    name = op.split("_")[0]
    if name in ("Abs", "Neg"):
        if info.min == 0 and name == "Neg":
            name = "Abs"
        node = helper.make_node(name, ["a"], ["y"], name="op")
        proto = model([node], [vi("a", elem, [a.size])], [vi("y", elem, [a.size])])
        return checked(proto, {"a": a}, note=f"{name} {np.dtype(dtype)}")
    attrs = {"fmod": 1} if op == "Mod_fmod" else {}
    node = helper.make_node(name, ["a", "b"], ["y"], name="op", **attrs)
    proto = model(
        [node], [vi("a", elem, [a.size]), vi("b", elem, [a.size])], [vi("y", elem, [a.size])]
    )
    return checked(proto, {"a": a, "b": b}, note=f"{op} {np.dtype(dtype)}")


REDUCE_OPS = (
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSumExp",
    "ReduceSumSquare",
    "ArgMax",
    "ArgMin",
)


@template("semantics")
def random_reduce(rng: random.Random) -> Scenario:
    """A reduction over random axes (negative ones too), keepdims 0 or 1."""
    op = rng.choice(REDUCE_OPS)
    rank = rng.randrange(1, 5)
    shape = _shape(rng, rank, (1, 2, 3, 4, 7))
    gen = nprng(rng)
    x = gen.standard_normal(shape).astype(np.float32)
    keep = rng.choice([0, 1])
    if op.startswith("Arg"):
        axis = rng.randrange(-rank, rank)
        attrs = {"axis": axis, "keepdims": keep, "select_last_index": rng.choice([0, 1])}
        node = helper.make_node(op, ["x"], ["y"], name="op", **attrs)
        proto = model([node], [vi("x", F32, shape)], [vi("y", I64, None)], opset=18)
        return checked(proto, {"x": x}, note=f"{op} {shape} {attrs}")
    axes = sorted(rng.sample(range(rank), rng.randrange(1, rank + 1)))
    axes = [a - rank if rng.random() < 0.3 else a for a in axes]
    node = helper.make_node(op, ["x", "axes"], ["y"], name="op", keepdims=keep)
    inits = [const("axes", np.array(axes, np.int64))]
    proto = model([node], [vi("x", F32, shape)], [vi("y", F32, None)], inits, opset=18)
    return checked(proto, {"x": x}, note=f"{op} {shape} axes {axes} keepdims {keep}")


def _movement(rng: random.Random, op: str, shape: list[int]) -> tuple[list, list, dict]:
    """(nodes, initializers, attrs note) of one data-movement op on an input of ``shape``."""
    rank = len(shape)
    if op == "Transpose":
        perm = rng.sample(range(rank), rank)
        return [helper.make_node("Transpose", ["x"], ["y"], perm=perm)], [], {"perm": perm}
    if op == "Slice":
        axes = rng.sample(range(rank), rng.randrange(1, rank + 1))
        starts, ends, steps = [], [], []
        for a in axes:
            d = shape[a]
            step = rng.choice([1, 1, 2, 3, -1, -2])
            starts.append(rng.randrange(-d - 2, d + 3))
            ends.append(rng.choice([rng.randrange(-d - 2, d + 3), 2**62, -(2**62)]))
            steps.append(step)
        inits = [
            const(n, np.array(v, np.int64))
            for n, v in (("s", starts), ("e", ends), ("a", axes), ("p", steps))
        ]
        node = helper.make_node("Slice", ["x", "s", "e", "a", "p"], ["y"])
        return [node], inits, {"starts": starts, "ends": ends, "axes": axes, "steps": steps}
    if op == "Pad":
        mode = rng.choice(["constant", "reflect", "edge"])
        pads = []
        for _ in range(2):
            for d in shape:
                limit = d - 1 if mode == "reflect" else 3
                pads.append(rng.randrange(-min(d - 1, 1) if mode == "constant" else 0, limit + 1))
        node = helper.make_node("Pad", ["x", "p"], ["y"], mode=mode)
        return [node], [const("p", np.array(pads, np.int64))], {"mode": mode, "pads": pads}
    if op == "Concat":
        axis = rng.randrange(-rank, rank)
        node = helper.make_node("Concat", ["x", "x", "x"], ["y"], axis=axis)
        return [node], [], {"axis": axis}
    if op == "Gather":
        axis = rng.randrange(-rank, rank)
        d = shape[axis]
        idx = [rng.randrange(-d, d) for _ in range(rng.randrange(1, 5))]
        node = helper.make_node("Gather", ["x", "i"], ["y"], axis=axis)
        return [node], [const("i", np.array(idx, np.int64))], {"axis": axis, "indices": idx}
    if op == "Tile":
        reps = [rng.choice([1, 2, 3]) for _ in shape]
        node = helper.make_node("Tile", ["x", "r"], ["y"])
        return [node], [const("r", np.array(reps, np.int64))], {"repeats": reps}
    if op == "Flatten":
        axis = rng.randrange(-rank, rank + 1)
        return [helper.make_node("Flatten", ["x"], ["y"], axis=axis)], [], {"axis": axis}
    if op == "Split":
        axis = rng.randrange(rank)
        node = helper.make_node("Split", ["x"], ["y", "z"], axis=axis, num_outputs=2)
        return [node], [], {"axis": axis}
    if op == "Expand":
        target = [rng.choice([d, 3]) if d == 1 else d for d in shape]
        target = [rng.choice([1, 2])] * rng.randrange(2) + target
        node = helper.make_node("Expand", ["x", "t"], ["y"])
        return [node], [const("t", np.array(target, np.int64))], {"shape": target}
    axes = [rng.randrange(-rank - 1, rank + 1)]
    node = helper.make_node("Unsqueeze", ["x", "a"], ["y"])
    return [node], [const("a", np.array(axes, np.int64))], {"axes": axes}


@template("semantics")
def random_movement(rng: random.Random) -> Scenario:
    """A data-movement op with random valid attributes (negative axes, steps and pads)."""
    op = rng.choice(
        [
            "Slice",
            "Pad",
            "Transpose",
            "Concat",
            "Gather",
            "Tile",
            "Flatten",
            "Split",
            "Expand",
            "Unsqueeze",
        ]
    )
    shape = _shape(rng, rng.randrange(1, 5), (1, 2, 3, 4, 5, 7))
    nodes, inits, attrs = _movement(rng, op, shape)
    outputs = [vi(o, F32, None) for o in nodes[0].output]
    proto = model(nodes, [vi("x", F32, shape)], outputs, inits, opset=18)
    x = nprng(rng).standard_normal(shape).astype(np.float32)
    return checked(proto, {"x": x}, note=f"{op} {shape} {attrs}"[:200])


@template("semantics")
def random_conv_pool(rng: random.Random) -> Scenario:
    """Conv, ConvTranspose or a pool with random valid strides, dilations, pads, groups."""
    op = rng.choice(["Conv", "MaxPool", "AveragePool", "ConvTranspose", "Conv1d"])
    spatial = 1 if op == "Conv1d" else 2
    op = "Conv" if op == "Conv1d" else op
    n, groups = rng.choice([1, 2]), rng.choice([1, 1, 2])
    c = groups * rng.choice([1, 2, 3])
    size = [rng.randrange(3, 10) for _ in range(spatial)]
    kernel = [rng.randrange(1, 4) for _ in range(spatial)]
    strides = [rng.choice([1, 1, 2, 3]) for _ in range(spatial)]
    dilations = [rng.choice([1, 1, 2]) for _ in range(spatial)]
    pads = [rng.randrange(0, k) for k in kernel] * 2
    attrs: dict[str, Any] = {"kernel_shape": kernel, "strides": strides}
    auto = rng.choice(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"])
    if auto == "NOTSET":
        attrs["pads"] = pads
    else:
        attrs["auto_pad"] = auto
    x = nprng(rng).standard_normal([n, c, *size]).astype(np.float32)
    inits = []
    inputs = ["x"]
    if op in ("Conv", "ConvTranspose"):
        attrs.update(dilations=dilations, group=groups)
        m = groups * rng.choice([1, 2])
        wshape = [m, c // groups, *kernel] if op == "Conv" else [c, m // groups, *kernel]
        inits = [const("w", nprng(rng).standard_normal(wshape).astype(np.float32))]
        inputs.append("w")
        if rng.random() < 0.5:
            inits.append(const("b", nprng(rng).standard_normal(m).astype(np.float32)))
            inputs.append("b")
    elif op == "MaxPool":
        attrs.update(dilations=dilations, ceil_mode=rng.choice([0, 1]))
    else:
        attrs.update(ceil_mode=rng.choice([0, 1]), count_include_pad=rng.choice([0, 1]))
    node = helper.make_node(op, inputs, ["y"], name="op", **attrs)
    proto = model([node], [vi("x", F32, list(x.shape))], [vi("y", F32, None)], inits, opset=19)
    return checked(proto, {"x": x}, note=f"{op} x{list(x.shape)} {attrs}"[:200])


CHAIN_UNARY = ("Relu", "Sigmoid", "Tanh", "Exp", "Abs", "Neg", "Softplus", "Erf", "Sqrt_abs")


def _chain_step(rng: random.Random, x: str, shape: list[int], n: int):
    """One random op on tensor ``x`` of ``shape``: (nodes, initializers, output shape)."""
    y = f"t{n}"
    kind = rng.choice(["unary", "binary", "transpose", "reduce", "softmax", "matmul", "slice"])
    gen = nprng(rng)
    if kind == "unary":
        op = rng.choice(CHAIN_UNARY)
        if op == "Sqrt_abs":
            return (
                [helper.make_node("Abs", [x], [y + "a"]), helper.make_node("Sqrt", [y + "a"], [y])],
                [],
                shape,
            )
        return [helper.make_node(op, [x], [y])], [], shape
    if kind == "binary":
        c = const(f"c{n}", gen.standard_normal(_broadcast_operand(rng, shape)).astype(np.float32))
        op = rng.choice(["Add", "Mul", "Sub", "Max"])
        return [helper.make_node(op, [x, c.name], [y])], [c], shape
    if kind == "transpose" and len(shape) > 1:
        perm = rng.sample(range(len(shape)), len(shape))
        return [helper.make_node("Transpose", [x], [y], perm=perm)], [], [shape[p] for p in perm]
    if kind == "reduce":
        axis = rng.randrange(len(shape))
        axes = const(f"a{n}", np.array([axis], np.int64))
        node = helper.make_node(
            rng.choice(["ReduceSum", "ReduceMax", "ReduceMean"]), [x, axes.name], [y], keepdims=1
        )
        return [node], [axes], [1 if i == axis else d for i, d in enumerate(shape)]
    if kind == "softmax":
        axis = rng.randrange(-len(shape), len(shape))
        return [helper.make_node("Softmax", [x], [y], axis=axis)], [], shape
    if kind == "matmul":
        k, m = shape[-1], rng.choice([1, 3, 8, 17])
        w = const(f"w{n}", gen.standard_normal((k, m)).astype(np.float32) / max(k, 1))
        return [helper.make_node("MatMul", [x, w.name], [y])], [w], [*shape[:-1], m]
    axis = rng.randrange(len(shape))
    d = shape[axis]
    start, end = rng.randrange(0, d), rng.randrange(1, d + 1)
    start, end = min(start, end - 1), max(start + 1, end)
    inits = [
        const(f"{p}{n}", np.array([v], np.int64))
        for p, v in (("s", start), ("e", end), ("x", axis))
    ]
    node = helper.make_node("Slice", [x, *(i.name for i in inits)], [y])
    return [node], inits, [end - start if i == axis else v for i, v in enumerate(shape)]


@template("semantics")
def random_chain(rng: random.Random) -> Scenario:
    """A chain of 2 to 6 random ops (what fusion and scheduling see), one or two outputs,
    on 1 or 2 threads."""
    threads = rng.choice([1, 2])
    shape = _shape(rng, rng.randrange(1, 5), (1, 2, 3, 5, 8, 17))
    nodes, inits, x = [], [], "x"
    current = shape
    steps = rng.randrange(2, 7)
    for n in range(steps):
        more, consts, current = _chain_step(rng, x, current, n)
        nodes += more
        inits += consts
        x = nodes[-1].output[0]
    outputs = [vi(x, F32, current)]
    if rng.random() < 0.3 and len(nodes) > 1:  # an intermediate is an output too
        outputs.append(vi(nodes[0].output[0], F32, None))
    proto = model(nodes, [vi("x", F32, shape)], outputs, inits, opset=18)
    feeds = {"x": nprng(rng).standard_normal(shape).astype(np.float32)}
    ops = " ".join(n.op_type for n in nodes)
    return checked(proto, feeds, threads=threads, note=f"{shape}: {ops} (threads {threads})")


@template("bytes")
def bytes_small_model(rng: random.Random) -> Scenario:
    """Damage to a tiny model, where most bytes are structure rather than weights."""
    kind = rng.choice(["bitflip", "varint", "insert", "delete", "truncate"])
    proto = rng.choice([mm_bias_relu(2, 3, 4), unary("Softmax", [2, 5], axis=-1), _tiny_conv()])
    data, where = damage(proto.SerializeToString(), kind, rng)
    try:
        feeds = feeds_for(onnx.load_model_from_string(data), nprng(rng))
    except Exception:  # the damage broke the protobuf or its types: feed nothing
        feeds = {}
    return Scenario(
        data, feeds, feeds, source=rng.choice(["path", "bytes"]), note=f"{kind}: {where}"
    )


def _tiny_conv() -> onnx.ModelProto:
    w = const("w", np.arange(18, dtype=np.float32).reshape(2, 1, 3, 3) / 10)
    node = helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])
    return model([node], [vi("x", F32, [1, 1, 4, 4])], [vi("y", F32, [1, 2, 4, 4])], [w])


# ---- 4. bad run-time inputs --------------------------------------------------------------


def _mbr(rng: random.Random) -> tuple[bytes, dict]:
    proto = mm_bias_relu()
    return proto.SerializeToString(), _x(rng=rng)


@template("inputs")
def feed_wrong_names(rng: random.Random) -> Scenario:
    data, feeds = _mbr(rng)
    how = rng.choice(["renamed", "missing", "extra", "empty_name", "int_key", "none_key"])
    x = feeds["x"]
    bad = {
        "renamed": {"X": x},
        "missing": {},
        "extra": {"x": x, "nope": x},
        "empty_name": {"": x},
        "int_key": {0: x},
        "none_key": {None: x},
    }[how]
    return Scenario(data, bad, None, note=how)


@template("inputs")
def feed_wrong_dtype(rng: random.Random) -> Scenario:
    data, feeds = _mbr(rng)
    dtype = rng.choice(
        [np.float64, np.float16, np.int32, np.int64, bool, np.uint8, object, "U3", np.complex64]
    )
    bad = {"x": feeds["x"].astype(dtype)}
    return Scenario(data, bad, None, note=str(np.dtype(dtype)))


@template("inputs")
def feed_wrong_shape(rng: random.Random) -> Scenario:
    data, _ = _mbr(rng)
    shape = rng.choice([(8, 15), (16, 8), (8,), (1, 8, 16), (), (0, 16), (8, 16, 1), (2**20, 0)])
    return Scenario(data, {"x": np.ones(shape, np.float32)}, None, note=str(shape))


@template("inputs")
def feed_byte_order(rng: random.Random) -> Scenario:
    data, feeds = _mbr(rng)
    big = feeds["x"].astype(">f4")
    return Scenario(data, {"x": big}, feeds, note="big-endian float32")


@template("inputs")
def feed_layouts(rng: random.Random) -> Scenario:
    """Valid values in odd layouts: accepted with the right result, or refused cleanly."""
    data, feeds = _mbr(rng)
    x = feeds["x"]
    how = rng.choice(
        ["strided", "fortran", "readonly", "misaligned", "negative_stride", "broadcast_view"]
    )
    if how == "strided":
        wide = np.zeros((8, 32), np.float32)
        wide[:, ::2] = x
        given = wide[:, ::2]
    elif how == "fortran":
        given = np.asfortranarray(x)
    elif how == "readonly":
        given = x.copy()
        given.flags.writeable = False
    elif how == "misaligned":
        raw = np.zeros(x.nbytes + 1, np.uint8)
        given = raw[1:].view(np.float32).reshape(x.shape)
        given[...] = x
    elif how == "negative_stride":
        given = np.flip(np.flip(x, 0).copy(), 0)
    else:
        row = x[:1]
        given = np.broadcast_to(row, x.shape)
        feeds = {"x": np.ascontiguousarray(given)}
    return Scenario(data, {"x": given}, feeds, note=how)


@template("inputs")
def feed_wrong_container(rng: random.Random) -> Scenario:
    data, feeds = _mbr(rng)
    x = feeds["x"]
    how = rng.choice(
        [
            "none",
            "list",
            "tuple",
            "nested_list",
            "scalar",
            "string",
            "generator",
            "output_names_bad",
            "output_names_str",
        ]
    )
    output_names = None
    if how == "none":
        bad = None
    elif how == "list":
        bad = [x]
    elif how == "tuple":
        bad = (x,)
    elif how == "nested_list":
        bad = {"x": x.tolist()}
    elif how == "scalar":
        bad = {"x": 1.0}
    elif how == "string":
        bad = "x"
    elif how == "generator":
        bad = (v for v in [x])
    elif how == "output_names_bad":
        bad, output_names = feeds, ["nope"]
    else:
        bad, output_names = feeds, "y"
    return Scenario(data, bad, None, output_names=output_names, note=how)


@template("inputs")
def feed_special_values(rng: random.Random) -> Scenario:
    data, feeds = _mbr(rng)
    x = feeds["x"].copy()
    spots = [(rng.randrange(8), rng.randrange(16)) for _ in range(3)]
    for (i, j), v in zip(spots, [np.nan, np.inf, -np.inf], strict=True):
        x[i, j] = v
    return Scenario(data, {"x": x}, {"x": x})


def _oob(rng: random.Random, op: str) -> Scenario:
    """An index out of range given at run time: a RunError naming the node, never a clamp."""
    n = 4
    bad = rng.choice([n, -n - 1, 2**31, -(2**40), 2**62])
    data = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    if op == "Gather":
        node = helper.make_node("Gather", ["x", "i"], ["y"], axis=0, name="gather")
        idx = np.array([0, bad, 1], np.int64)
        inputs = [vi("x", F32, [n, 3]), vi("i", I64, [3])]
    elif op == "GatherElements":
        node = helper.make_node("GatherElements", ["x", "i"], ["y"], axis=0, name="gather_elements")
        idx = np.zeros((2, 3), np.int64)
        idx[1, 2] = bad
        inputs = [vi("x", F32, [n, 3]), vi("i", I64, [2, 3])]
    elif op == "GatherND":
        node = helper.make_node("GatherND", ["x", "i"], ["y"], name="gather_nd")
        idx = np.array([[0, 1], [bad, 0]], np.int64)
        inputs = [vi("x", F32, [n, 3]), vi("i", I64, [2, 2])]
    elif op == "ScatterElements":
        node = helper.make_node(
            "ScatterElements", ["x", "i", "u"], ["y"], axis=0, name="scatter_elements"
        )
        idx = np.array([[1, bad, 0]], np.int64)
        inputs = [vi("x", F32, [n, 3]), vi("i", I64, [1, 3]), vi("u", F32, [1, 3])]
    elif op == "ScatterND":
        node = helper.make_node("ScatterND", ["x", "i", "u"], ["y"], name="scatter_nd")
        idx = np.array([[bad]], np.int64)
        inputs = [vi("x", F32, [n, 3]), vi("i", I64, [1, 1]), vi("u", F32, [1, 3])]
    elif op == "ReverseSequence":
        node = helper.make_node(
            "ReverseSequence", ["x", "i"], ["y"], batch_axis=1, time_axis=0, name="revseq"
        )
        idx = np.array([1, rng.choice([n + 1, 2**31, -3]), 2], np.int64)
        inputs = [vi("x", F32, [n, 3]), vi("i", I64, [3])]
    else:
        loss = rng.choice(["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
        node = helper.make_node(loss, ["x", "i"], ["y"], name="loss")
        idx = np.array([0, 1, abs(bad) if bad != -(2**40) else 3], np.int64)  # 3 classes
        idx[1] = rng.choice([3, -2, 2**31])
        data = np.arange(9, dtype=np.float32).reshape(3, 3)
        inputs = [vi("x", F32, [3, 3]), vi("i", I64, [3])]
        op = loss
    feeds = {"x": data, "i": idx}
    if len(inputs) == 3:
        feeds["u"] = np.full((1, 3), 7, np.float32)
    proto = model([node], inputs, [vi("y", F32, None)])
    return refused(proto, feeds, note=f"{op} index {idx.ravel().tolist()}")


for _op in (
    "Gather",
    "GatherElements",
    "GatherND",
    "ScatterElements",
    "ScatterND",
    "ReverseSequence",
    "Loss",
):

    def _make_oob(rng: random.Random, op: str = _op) -> Scenario:
        return _oob(rng, op)

    _make_oob.__name__ = f"oob_{_op}"
    template("inputs")(_make_oob)


@template("inputs")
def in_range_negative_indices(rng: random.Random) -> Scenario:
    """Negative indices in range are valid: the positive control of the oob_* cases."""
    node = helper.make_node("Gather", ["x", "i"], ["y"], axis=rng.choice([0, 1, -1]), name="gather")
    proto = model([node], [vi("x", F32, [4, 3]), vi("i", I64, [3])], [vi("y", F32, None)])
    feeds = {
        "x": np.arange(12, dtype=np.float32).reshape(4, 3),
        "i": np.array([-1, 0, -3], np.int64),
    }
    return checked(proto, feeds)


@template("inputs")
def bad_value_inputs(rng: random.Random) -> Scenario:
    """Inputs whose values shape the output (Reshape, ConstantOfShape, Range, TopK, Tile)."""
    how = rng.choice(["reshape", "constant_of_shape", "range", "topk", "tile", "slice_huge"])
    if how == "reshape":
        node = helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")
        proto = model([node], [vi("x", F32, [2, 3]), vi("s", I64, [2])], [vi("y", F32, None)])
        feeds = {
            "x": np.ones((2, 3), np.float32),
            "s": np.array(rng.choice([[4, 2], [-1, -1], [2**40, 0]]), np.int64),
        }
    elif how == "constant_of_shape":
        node = helper.make_node("ConstantOfShape", ["s"], ["y"], name="cos")
        proto = model([node], [vi("s", I64, [2])], [vi("y", F32, None)])
        feeds = {"s": np.array(rng.choice([[2**40, 2], [-1, 3], [2**31, 2**31]]), np.int64)}
    elif how == "range":
        node = helper.make_node("Range", ["a", "b", "c"], ["y"], name="range")
        proto = model([node], [vi(n, I64, []) for n in "abc"], [vi("y", I64, None)])
        start, limit, delta = rng.choice([(0, 2**40, 1), (0, 10, 0), (-(2**62), 2**62, 1)])
        feeds = {"a": np.array(start), "b": np.array(limit), "c": np.array(delta)}
    elif how == "topk":
        node = helper.make_node("TopK", ["x", "k"], ["v", "i"], name="topk")
        proto = model(
            [node],
            [vi("x", F32, [2, 3]), vi("k", I64, [1])],
            [vi("v", F32, None), vi("i", I64, None)],
        )
        feeds = {
            "x": np.ones((2, 3), np.float32),
            "k": np.array([rng.choice([4, -1, 2**40])], np.int64),
        }
    elif how == "tile":
        node = helper.make_node("Tile", ["x", "r"], ["y"], name="tile")
        proto = model([node], [vi("x", F32, [2, 3]), vi("r", I64, [2])], [vi("y", F32, None)])
        feeds = {
            "x": np.ones((2, 3), np.float32),
            "r": np.array(rng.choice([[2**40, 1], [-1, 2]]), np.int64),
        }
    else:
        node = helper.make_node("Slice", ["x", "s", "e"], ["y"], name="slice")
        proto = model(
            [node],
            [vi("x", F32, [4, 3]), vi("s", I64, [1]), vi("e", I64, [1])],
            [vi("y", F32, None)],
        )
        feeds = {
            "x": np.arange(12, dtype=np.float32).reshape(4, 3),
            "s": np.array([-(2**62)]),
            "e": np.array([2**62]),
        }
    return Scenario(proto.SerializeToString(), feeds, feeds, note=how)


@template("inputs")
def dynamic_batch(rng: random.Random) -> Scenario:
    """A model with a symbolic batch dim, run on one session with batches of several
    sizes (0 and 1 included): every run must match onnxruntime's."""
    name = rng.choice(["mlp_torchscript", "mlp_dynamo", "resnet_torchscript"])
    path = ROOT / "tests/data/torch" / f"{name}.onnx"
    files = {p.name: p.read_bytes() for p in path.parent.glob(f"{name}.data")}
    proto = onnx.load(path, load_external_data=False)
    batches = [rng.choice([1, 2, 3, 7]), rng.choice([0, 1, 4]), rng.choice([1, 2, 3, 7])]
    runs = [feeds_for(proto, nprng(rng), sym=b) for b in batches]
    return Scenario(
        path.read_bytes(),
        runs[0],
        runs[0],
        files=files,
        more_feeds=tuple(runs[1:]),
        note=f"{name} batches {batches}",
    )


# ---- 4b. the command line ------------------------------------------------------------------


def _npy(array: np.ndarray, allow_pickle: bool = False) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=allow_pickle)
    return buf.getvalue()


CLI_MISUSE: tuple[tuple[str, ...], ...] = (
    ("run", "{model}", "--input", "x={dir}/garbage.npy"),
    ("run", "{model}", "--input", "x={dir}/pickled.npy"),
    ("run", "{model}", "--input", "x={dir}/wrong_shape.npy"),
    ("run", "{model}", "--input", "x={dir}/nothere.npy"),
    ("run", "{model}", "--input", "x"),
    ("run", "{model}", "--input", "nope={dir}/good.npy"),
    ("run", "{model}", "--input", "x={dir}"),
    ("run", "{model}", "--shape", "x=a,b"),
    ("run", "{model}", "--shape", "x=-1,16"),
    ("run", "{model}", "--shape", "x=99999999999999999999,16"),
    ("run", "{model}", "--repeat", "0"),
    ("run", "{model}", "--threads", "0"),
    ("run", "{model}", "--db", "{dir}/garbage.npy"),
    ("run", "{dir}/nothere.onnx"),
    ("run", "{dir}"),
    ("run", "{dir}/garbage.npy"),
    ("show", "{model}", "--kernel", "nope"),
    ("show", "{model}", "--shape", "x=,"),
    ("compile", "{model}", "-o", "{dir}/garbage.npy"),
    ("compile", "{model}", "-o", "{dir}/out", "--target", "nonsense-triple"),
    ("tune", "{model}", "--budget", "abc"),
    ("cache", "frobnicate"),
    ("frobnicate",),
)
"""Command lines that must end with exit code 2 and one line on stderr, never a traceback."""


@template("inputs")
def cli_misuse(rng: random.Random) -> Scenario:
    argv = rng.choice(CLI_MISUSE)
    x = np.ones((8, 16), np.float32)
    files = {
        "garbage.npy": b"\\x93NUMPY garbage" * 3,
        "pickled.npy": _npy(np.array([{"a": 1}], dtype=object), allow_pickle=True),
        "wrong_shape.npy": _npy(np.ones((3, 3), np.float32)),
        "good.npy": _npy(x),
    }
    return Scenario(mm_bias_relu().SerializeToString(), files=files, cli=argv, note=" ".join(argv))


# ---- 5. misuse of the schedule API -------------------------------------------------------


def _scheduled(steps: Callable[[Any], None], threads: Any = 1, note: str = "") -> Scenario:
    """mm_bias_relu scheduled by ``steps(program)``, compiled and compared with onnxruntime."""
    proto = mm_bias_relu()
    data = proto.SerializeToString()

    def action(source):
        import polyonnx

        prog = polyonnx.load(data)
        steps(prog)
        return polyonnx.InferenceSession(prog, threads=threads)

    feeds = _x()
    return Scenario(data, feeds, feeds, action=action, note=note)


SPLIT = {"loop": "i", "factor": 4}
MALFORMED_TRACES: dict[str, tuple[Any, ...]] = {
    "containers": (
        None,
        [None],
        5,
        "split",
        {"kernel": "mm"},
        [{}],
        [[("kernel", "mm")]],
        [{"kernel": "mm", "primitive": "split", "args": SPLIT}, None],
    ),
    "missing_keys": (
        [{"kernel": "mm", "primitive": "split"}],
        [{"primitive": "split", "args": SPLIT}],
        [{"kernel": "mm", "args": SPLIT}],
        [{"kernel": "mm"}],
        [{"kernel": "mm", "primitive": "split", "args": {}}],
        [{"kernel": "mm", "primitive": "split", "args": {"loop": "i"}}],
        [{"kernel": "mm", "primitive": "reorder", "args": {}}],
        [{"kernel": "mm", "primitive": "ukernel", "args": {}}],
    ),
    "wrong_types": (
        [{"kernel": "mm", "primitive": "split", "args": None}],
        [{"kernel": 5, "primitive": "split", "args": SPLIT}],
        [{"kernel": "mm", "primitive": None, "args": {}}],
        [{"kernel": "mm", "primitive": "split", "args": [1, 2]}],
        [{"kernel": "mm", "primitive": ["split"], "args": {}}],
        [{"kernel": "mm", "primitive": "split", "args": {"loop": 3, "factor": 4}}],
        [{"kernel": "mm", "primitive": "split", "args": {"loop": "i", "factor": "4"}}],
        [{"kernel": "mm", "primitive": "reorder", "args": {"loops": "ijk"}}],
        [{"kernel": "mm", "primitive": "ukernel", "args": {"params": "mr=4"}}],
        [{"kernel": "mm", "primitive": "ukernel", "args": {"params": {"mr": "a"}}}],
        [{"kernel": "mm", "primitive": "pack", "args": {"buffer": None, "at": "i"}}],
        [{"kernel": "mm", "primitive": "compute_at", "args": {"name": 3, "loop": "i"}}],
    ),
    "wrong_values": (
        [{"kernel": "nope", "primitive": "split", "args": SPLIT}],
        [{"kernel": "mm", "primitive": "frobnicate", "args": {}}],
        [{"kernel": "mm", "primitive": "split", "args": {"loop": "nope", "factor": 4}}],
        [{"kernel": "mm", "primitive": "reorder", "args": {"loops": ["i", "i", "j"]}}],
        [{"kernel": "mm", "primitive": "tile", "args": {"loops": ["i", "j"], "sizes": [4]}}],
        [{"kernel": "mm", "primitive": "unroll", "args": {"loop": "i", "factor": -3}}],
        [{"kernel": "mm+mm", "primitive": "split", "args": SPLIT}],
        [{"kernel": "", "primitive": "split", "args": SPLIT}],
        [{"kernel": "mm", "primitive": "split", "args": SPLIT, "extra": 1}],
        [{"kernel": "mm", "primitive": "split", "args": {**SPLIT, "extra": 1}}],
    ),
}
"""Traces ``Program.apply`` must refuse with a ScheduleError (or replay correctly)."""

for _group in MALFORMED_TRACES:

    def _make_trace(rng: random.Random, group: str = _group) -> Scenario:
        trace = rng.choice(MALFORMED_TRACES[group])
        return _scheduled(lambda prog: prog.apply(trace), note=repr(trace)[:200])

    _make_trace.__name__ = f"malformed_trace_{_group}"
    template("schedule")(_make_trace)


@template("schedule")
def trace_fuzz(rng: random.Random) -> Scenario:
    """A valid trace with one field replaced by a random value of a random type."""
    steps = [
        {"kernel": "mm", "primitive": "split", "args": {"loop": "i", "factor": 4}},
        {"kernel": "mm", "primitive": "reorder", "args": {"loops": ["i_o", "i_i", "k", "j"]}},
        {"kernel": "mm", "primitive": "vectorize", "args": {"loop": "j"}},
        {"kernel": "mm", "primitive": "unroll", "args": {"loop": "i_i", "factor": None}},
    ]
    junk = [None, -1, 0, 2**70, 1.5, "", "i", [], {}, True, b"i", float("nan"), ["i"], {"a": 1}]
    step = steps[rng.randrange(len(steps))]
    keys = [("kernel",), ("primitive",), ("args",)] + [("args", k) for k in step["args"]]
    key = rng.choice(keys)
    value = rng.choice(junk)
    if len(key) == 1:
        step[key[0]] = value
    else:
        step["args"][key[1]] = value
    return _scheduled(lambda prog: prog.apply(steps), note=f"{key} = {value!r}")


def _loops(prog):
    s = prog.schedule("mm")
    return s, s.loops


PRIMITIVE_MISUSE: dict[str, dict[str, Callable[..., Any]]] = {
    "ukernel": {
        "mr_a": lambda s, i, j: s.ukernel(mr="a"),
        "mr_neg": lambda s, i, j: s.ukernel(mr=-4),
        "unknown": lambda s, i, j: s.ukernel(bogus=1),
        "nr_odd": lambda s, i, j: s.ukernel(nr=3),
        "kc_zero": lambda s, i, j: s.ukernel(kc=0, mc=0, nc=0),
        "split_word": lambda s, i, j: s.ukernel(split="diagonal"),
        "mr_huge": lambda s, i, j: s.ukernel(mr=2**40),
    },
    "split": {
        "zero": lambda s, i, j: s.split(i, 0),
        "true": lambda s, i, j: s.split(i, True),
        "negative": lambda s, i, j: s.split(i, -1),
        "float": lambda s, i, j: s.split(i, 2.5),
        "huge": lambda s, i, j: s.split(i, 2**70),
        "string": lambda s, i, j: s.split(i, "4"),
        "loop_object": lambda s, i, j: s.split(object(), 2),
        "loop_none": lambda s, i, j: s.split(None, 2),
    },
    "other": {
        "tile_len": lambda s, i, j: s.tile(i, j, sizes=(4,)),
        "tile_zero": lambda s, i, j: s.tile(i, j, sizes=(0, 4)),
        "reorder_dup": lambda s, i, j: s.reorder(i, i, j),
        "reorder_missing": lambda s, i, j: s.reorder(j),
        "unroll_0": lambda s, i, j: s.unroll(j, 0),
        "unroll_str": lambda s, i, j: s.unroll(j, "2"),
        "pack_unknown": lambda s, i, j: s.pack("nope", i),
        "compute_at_unknown": lambda s, i, j: s.compute_at("nope", i),
        "vectorize_outer": lambda s, i, j: s.vectorize(i),
        "parallel_none": lambda s, i, j: s.parallel(None),
        "schedule_unknown": lambda s, i, j: s.apply("split"),
    },
}
"""Bad arguments to the schedule primitives: a ScheduleError, never a TypeError."""

for _group in PRIMITIVE_MISUSE:

    def _make_misuse(rng: random.Random, group: str = _group) -> Scenario:
        how = rng.choice(list(PRIMITIVE_MISUSE[group]))

        def steps(prog):
            s, (i, j, _) = _loops(prog)
            PRIMITIVE_MISUSE[group][how](s, i, j)

        return _scheduled(steps, note=how)

    _make_misuse.__name__ = f"bad_args_{_group}"
    template("schedule")(_make_misuse)


@template("schedule")
def nested_splits(rng: random.Random) -> Scenario:
    """Many nested splits: refused with a ScheduleError or done in polynomial time."""
    count = rng.choice([200, 50, 120, 64])
    factor = rng.choice([1, 2])

    def steps(prog):
        s, (i, _, _) = _loops(prog)
        loop = i
        for _ in range(count):
            _, loop = s.split(loop, factor)

    return _scheduled(steps, note=f"{count} x split(inner, {factor})")


@template("schedule")
def bad_threads(rng: random.Random) -> Scenario:
    threads = rng.choice([True, 0, "2", 2.5, -1, False, None, 10**6, 2**63, [2], float("nan")])
    data, feeds = _mbr(rng)
    return Scenario(data, feeds, feeds, threads=threads, note=f"threads={threads!r}")


@template("schedule")
def random_valid_schedule(rng: random.Random) -> Scenario:
    """A random sequence of primitives on mm; refusals are fine, results must match."""
    count = rng.randrange(1, 6)
    choices = [rng.random() for _ in range(count * 3)]

    def steps(prog):
        import polyonnx

        s, _ = _loops(prog)
        for n in range(count):
            loops = [lp.name for lp in s.loops]
            a, b = choices[3 * n : 3 * n + 2]
            pick_loop = loops[int(a * len(loops))]
            op = int(choices[3 * n + 2] * 5)
            try:
                if op == 0:
                    s.split(pick_loop, 1 + int(b * 9))
                elif op == 1:
                    s.unroll(pick_loop)
                elif op == 2:
                    s.vectorize(pick_loop)
                elif op == 3:
                    s.parallel(pick_loop)
                else:
                    turn = int(b * len(loops))
                    s.reorder(*(loops[turn:] + loops[:turn]))
            except polyonnx.ScheduleError:
                pass

    return _scheduled(steps, threads=rng.choice([1, 2]), note=f"{count} steps")


# ---- the harness's own negative tests (negative seeds; not in any corpus) -----------------


class _Reference:
    """A stand-in session that runs onnxruntime, ``offset`` added to its outputs (so the
    oracle's own tests do not depend on polyonnx)."""

    offset = 0.0

    def __init__(self, source):
        import onnxruntime as ort

        self.sess = ort.InferenceSession(source, providers=["CPUExecutionProvider"])

    def run(self, names, feeds):
        return [out + self.offset for out in self.sess.run(names, feeds)]


class _Wrong(_Reference):
    offset = 1.0


def _self_test(name: str, action: Callable[[Any], Any], expect: str = "any") -> Template:
    data, feeds = mm_bias_relu().SerializeToString(), _x()
    return Template(
        "selftest", name, lambda rng: Scenario(data, feeds, feeds, expect=expect, action=action)
    )


def _segfault(source):
    import ctypes

    ctypes.string_at(0)


def _allocate(source):
    return bytearray(8 << 30)


def _hang(source):
    import time

    time.sleep(3600)


def _raise(source):
    raise KeyError("args")


def _exit(source):
    import os

    os._exit(3)


def _refuse(source):
    import polyonnx

    raise polyonnx.ScheduleError("refused on purpose")


SELF_TESTS = [
    _self_test("crash", _segfault),
    _self_test("memory", _allocate),
    _self_test("hang", _hang),
    _self_test("exception", _raise),
    _self_test("exit", _exit),
    _self_test("wrong", _Wrong),
    _self_test("silent", _Reference, expect="refuse"),
    _self_test("refused", _refuse),
    _self_test("ok", _Reference),
]
"""Seed -1 is SELF_TESTS[0], -2 SELF_TESTS[1], ...: each shows the oracle's verdict."""
