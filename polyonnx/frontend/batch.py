"""Whether a model can run in blocks along a symbolic dim: its batch.

A symbolic dim is a *batch* when no node mixes the samples along it: every output's slice
at sample n depends only on the inputs' slices at sample n. The model then computes, for
N samples, the samples of any split of them into blocks, one after the other; so one
compile for a block of b samples runs every N (runtime/blocks.py).

The proof reads the graph with the dim left symbolic, and specialised to 2 and 3 samples
(neither 1, which broadcasts) and to the one sample that is compiled. A value is
*batched* where exactly one dim is 2k at 2 and 3k at 3: its axis carries k rows per
sample. Walking the symbolic graph's nodes, a value that folded to a constant at 2 but
not in the symbolic graph is computed from the batch size (``derived``): it may only size
an output (a Reshape's target). Every other node must keep samples apart by the rule for
its op (``RULES``). Last, every value of the one-sample graph must have the shape its
batch says. An op without a rule, a rule that fails, or graphs that differ otherwise, and
the model is not blocked (it is compiled per shape, as before). The rules are sound, not
complete.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from polyonnx.frontend.graph import Graph, Node

SIZES = (1, 2, 3)
"""The sizes the graph is specialised to: the block compiled, and two that show the
batch (docs above)."""


@dataclass(frozen=True)
class Batched:
    """A value's batch: ``axis`` has extent ``outer * N * rows`` for N samples, its index
    ``(o * N + n) * rows + r`` (sample n). ``outer`` > 1 where a reshape merged an outer
    dim into the batch's (torch's sequence-first attention: [S, N, E] -> [S*N, E])."""

    axis: int
    rows: int
    outer: int = 1

    @property
    def factor(self) -> int:
        return self.rows * self.outer

    def moved(self, axis: int) -> Batched:
        return Batched(axis, self.rows, self.outer)


@dataclass(frozen=True)
class BatchPlan:
    """How to run a model in blocks of its batch ``symbol``: the axis of every input and
    output that carries it (None: an output the same for every block)."""

    symbol: str
    inputs: Mapping[str, Batched | None]
    outputs: Mapping[str, Batched | None]


class NotBatched(Exception):
    """Why a symbolic dim is not a batch the model can be blocked along."""


def batch_plan(symbol: str, symbolic: Graph, sized: tuple[Graph, Graph, Graph]) -> BatchPlan:
    """The plan for blocking along ``symbol``, proved on the model's graph with the dim
    symbolic and specialised to ``SIZES`` samples (otherwise the same); NotBatched says why
    not."""
    one, small, large = sized
    _same_structure(small, large)
    _same_structure(one, small)
    # values folded away at 2 are typed, and the constants among them known, in the
    # symbolic graph
    small = dataclasses.replace(
        small,
        values={**symbolic.values, **small.values},
        constants={**symbolic.constants, **small.constants},
    )
    observed = {name: _batch_of(small, large, name) for name in large.values}
    batched: dict[str, Batched | None] = dict.fromkeys(symbolic.constants)
    for v in small.inputs:
        batched[v.name] = observed[v.name]
    ctx = Context(batched, observed, symbolic.constants, set(), {})
    nodes = {node.name: node for node in small.nodes}
    computed = {name for node in small.nodes for name in node.outputs}
    for node in symbolic.nodes:
        if node.name in nodes:
            _check_node(nodes[node.name], small, ctx)
        elif not any(n in computed for n in node.outputs):  # folded at 2
            _folded(node, small, ctx)
        else:
            raise NotBatched("the graph folds differently at different batch sizes")
    outputs = {v.name: batched.get(v.name) for v in small.outputs}
    wrong = [name for name in outputs if name in ctx.derived]
    if wrong:
        raise NotBatched(f"output {wrong[0]!r} is computed from the batch size")
    inputs = {v.name: batched[v.name] for v in small.inputs}
    if not any(inputs.values()):
        raise NotBatched(f"no input carries {symbol!r}")
    _check_one_sample(one, small, ctx)
    return BatchPlan(symbol, MappingProxyType(inputs), MappingProxyType(outputs))


def _folded(node: Node, graph: Graph, ctx: Context) -> None:
    """A node the specialisation folded. From constants alone: a constant. Filling a
    batch-sized shape with a constant (ConstantOfShape, Expand): the same in every sample,
    by its rule. Arithmetic on shapes: derived where its entries come from the batch's dim
    (``_mask``), a constant elsewhere (a head size read off a shape). Otherwise: derived."""
    _known_inputs(node, ctx)
    data = [n for i, n in enumerate(node.inputs) if i not in SHAPE_INPUTS.get(node.op_type, ())]
    for name in node.outputs:
        ctx.batched[name] = None
    if not any(ctx.of(n) or n in ctx.derived for n in node.inputs):
        return
    if (
        node.op_type in ("ConstantOfShape", "Expand")
        and all(n in graph.values for n in (*node.inputs, *node.outputs) if n)
        and not any(ctx.of(n) or n in ctx.derived for n in data)
    ):
        RULES[node.op_type](node, graph, ctx)
        return
    mask = _mask(node, graph, ctx)
    if mask is not None:
        ctx.masks[node.outputs[0]] = mask
        if not mask.any():
            return  # no entry of it comes from the batch size
    ctx.derived.update(n for n in node.outputs if n)


MASKED = frozenset((
    "Add", "Sub", "Mul", "Div", "Mod", "Pow", "Max", "Min", "Sqrt", "Neg", "Abs", "Floor",
    "Ceil", "Cast", "Identity", "Equal", "Less", "Greater", "Not", "And", "Or", "Where",
))  # fmt: skip
"""Elementwise ops whose entries come from the batch size where an operand's do."""


def _mask(node: Node, graph: Graph, ctx: Context) -> np.ndarray | None:
    """Which entries of a folded shape computation's output depend on the batch size
    (True), for Shape and the ops exporters compute shapes with; None: unknown."""
    masks = [ctx.mask_of(n, graph) for n in node.inputs]
    op = node.op_type
    try:
        if op == "Shape":
            batch = ctx.of(node.inputs[0])
            rank = len(graph.value(node.inputs[0]).shape) if batch else 0
            full = np.arange(rank) == (batch.axis if batch else -1)
            return full[int(node.attr("start", 0)) : node.attr("end")]
        if any(m is None for m in masks[:1]) or (op in MASKED and None in masks):
            return None
        return _mask_of_op(node, lambda n: ctx.constants.get(n, graph.constants.get(n)), masks)
    except (IndexError, ValueError, TypeError, KeyError):
        return None


def _mask_of_op(node: Node, constant: Callable, masks: list) -> np.ndarray | None:
    op, first = node.op_type, masks[0]
    if op in MASKED:
        return np.logical_or.reduce(np.broadcast_arrays(*masks))
    if op == "Gather":
        indices = constant(node.inputs[1])
        return np.take(first, indices, axis=int(node.attr("axis", 0)))
    if op in ("Unsqueeze", "Squeeze", "Reshape"):
        return _reshaped_mask(node, constant, first)
    if op == "Concat":
        return np.concatenate(masks, axis=int(node.attr("axis", 0)))
    if op == "Slice" and first.ndim == 1 and node.input(3) == "" and node.input(4) == "":
        start, end = (int(constant(node.inputs[i])[0]) for i in (1, 2))
        return first[start:end]
    return None


def _reshaped_mask(node: Node, constant: Callable, mask: np.ndarray) -> np.ndarray | None:
    """Unsqueeze, Squeeze and Reshape of a mask, as they would move its entries."""
    axes = node.attr("axes")
    if axes is None and node.input(1):
        axes = constant(node.input(1))
    if node.op_type == "Reshape":
        return None if axes is None else mask.reshape([int(d) for d in axes])
    if node.op_type == "Squeeze":
        return np.squeeze(mask, axis=None if axes is None else tuple(int(a) for a in axes))
    return np.expand_dims(mask, tuple(int(a) for a in axes))


def _check_one_sample(one: Graph, small: Graph, ctx: Context) -> None:
    """Every value of the one-sample graph has the shape its batch gives it at 1."""
    for name, value in small.values.items():
        if name in ctx.derived or name not in one.values:
            continue
        want = list(value.shape)
        batch = ctx.of(name)
        if batch is not None:
            want[batch.axis] = batch.factor
        if list(one.value(name).shape) != want:
            raise NotBatched(
                f"value {name!r} has the shape {list(one.value(name).shape)} for one sample, "
                f"not {want}: the graph is another one at 1"
            )


def _same_structure(small: Graph, large: Graph) -> None:
    """Both specialisations must be the same nodes on the same names."""
    if [(n.name, n.op_type, n.inputs, n.outputs) for n in small.nodes] != [
        (n.name, n.op_type, n.inputs, n.outputs) for n in large.nodes
    ]:
        raise NotBatched("the graph folds differently at different batch sizes")
    if set(small.constants) != set(large.constants):
        raise NotBatched("the graph folds differently at different batch sizes")
    for a, b in zip(small.nodes, large.nodes, strict=True):
        if not _equal_attrs(a.attrs, b.attrs):
            raise NotBatched(f"node {a.name!r} ({a.op_type}): its attributes depend on the batch")


def _equal_attrs(a: Mapping, b: Mapping) -> bool:
    if set(a) != set(b):
        return False
    return all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


def _batch_of(small: Graph, large: Graph, name: str) -> Batched | None:
    """The batch of value ``name``: the one dim that is 2k and 3k; None if none differs."""
    a, b = small.value(name).shape, large.value(name).shape
    if len(a) != len(b):
        raise NotBatched(f"value {name!r} has a rank that depends on the batch")
    differ = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
    if not differ:
        return None
    axis = differ[0]
    x, y = a[axis], b[axis]
    _, small_size, large_size = SIZES
    ok = len(differ) == 1 and isinstance(x, int) and isinstance(y, int)
    if not ok or x % small_size or x // small_size * large_size != y:
        raise NotBatched(f"value {name!r}: its shape {list(a)} / {list(b)} is not batch-major")
    return Batched(axis, x // small_size)
    # as observed: the rules split rows from outer where a reshape merged them


# ---- the rules -------------------------------------------------------------------

Rule = Callable[[Node, Graph, "Context"], None]


@dataclass(frozen=True)
class Context:
    """What the rules read and write: each value's batch as the rules worked it out, as
    its shapes show it (axis and rows per sample), and the values computed from the batch
    size."""

    batched: dict[str, Batched | None]
    observed: Mapping[str, Batched | None]
    constants: Mapping[str, np.ndarray]
    """The symbolic graph's constants: values that do not depend on the batch size."""
    derived: set[str]
    masks: dict[str, np.ndarray]
    """Derived values of which only some entries come from the batch size: which."""

    def of(self, name: str) -> Batched | None:
        return self.batched.get(name) if name else None

    def mask_of(self, name: str, graph: Graph) -> np.ndarray | None:
        """Which entries of ``name`` come from the batch size (None: unknown)."""
        if name in self.masks:
            return self.masks[name]
        if name in self.derived or self.of(name):
            return None
        array = self.constants.get(name, graph.constants.get(name))
        return None if array is None else np.zeros(np.shape(array), bool)

    def seen(self, name: str) -> Batched | None:
        return self.observed.get(name) if name else None

    def put(self, node: Node, name: str, want: Batched | None) -> None:
        """Give output ``name`` the batch ``want``, which its shapes must show."""
        seen = self.seen(name)
        shown = None if want is None else Batched(want.axis, want.factor)
        if seen != shown and name in self.observed:  # an untyped value: nothing reads it
            _refuse(node, f"does not keep the batch on {name!r}")
        self.batched[name] = want


def _check_node(node: Node, graph: Graph, ctx: Context) -> None:
    """Refuse ``node`` unless its rule holds; values it computes from batch-derived ones
    join ``ctx.derived``."""
    _known_inputs(node, ctx)
    inputs = [ctx.of(n) for n in node.inputs]
    outputs = [ctx.seen(n) for n in node.outputs if n]
    if not any(inputs) and not any(outputs):
        if any(n in ctx.derived for n in node.inputs):
            ctx.derived.update(n for n in node.outputs if n)
        for name in node.outputs:
            ctx.batched[name] = None
        return  # nothing of the batch flows through
    shape_inputs = SHAPE_INPUTS.get(node.op_type, ())
    used = [n for i, n in enumerate(node.inputs) if n in ctx.derived and i not in shape_inputs]
    if used:
        _refuse(node, f"reads {used[0]!r}, a value computed from the batch size")
    rule = RULES.get(node.op_type)
    if rule is None:
        _refuse(node, "has no rule for running in blocks")
    rule(node, graph, ctx)


def _known_inputs(node: Node, ctx: Context) -> None:
    """Every input must be a graph input, a constant of the symbolic graph or an output
    of a node walked before (else the graphs were rewritten differently)."""
    unknown = [n for n in node.inputs if n and n not in ctx.batched]
    if unknown:
        _refuse(node, f"reads {unknown[0]!r}, which the graphs compute differently")


def _refuse(node: Node, why: str) -> None:
    raise NotBatched(f"node {node.name!r} ({node.op_type}) {why}")


def _rank(graph: Graph, name: str) -> int:
    return len(graph.value(name).shape)


def _outputs_like(node: Node, ctx: Context, want: Batched | None) -> None:
    for name in node.outputs:
        if name:
            ctx.put(node, name, want)


def _elementwise(node: Node, graph: Graph, ctx: Context) -> None:
    """Broadcasting: every batched input on the same output axis with the same batch; an
    unbatched input has size 1 there or lacks the axis."""
    rank = _rank(graph, node.outputs[0])
    wants = set()
    for name in node.inputs:
        got = ctx.of(name)
        if got is not None:
            wants.add(got.moved(got.axis + rank - _rank(graph, name)))
    if len(wants) != 1:
        _refuse(node, "combines inputs batched along different axes" if wants else "loses it")
    (want,) = wants
    for name in node.inputs:
        axis = want.axis - (rank - _rank(graph, name)) if name else -1
        if ctx.of(name) is None and axis >= 0 and graph.value(name).shape[axis] != 1:
            _refuse(node, f"broadcasts {name!r} along the batch")
    _outputs_like(node, ctx, want)


def _per_sample(node: Node, graph: Graph, ctx: Context) -> None:
    """Ops that treat axis 0 as images (Conv, pools, normalisations over channels): the
    first input batched on axis 0, the others not, and every output as the first."""
    first = ctx.of(node.inputs[0])
    if first is None or first.axis != 0:
        _refuse(node, "is not batched on its first input's axis 0")
    if any(ctx.of(n) for n in node.inputs[1:]):
        _refuse(node, "takes a batched weight")
    if node.op_type == "MaxPool" and len([n for n in node.outputs if n]) > 1:
        _refuse(node, "returns indices over the whole batch")
    if node.op_type == "BatchNormalization" and int(node.attr("training_mode", 0)):
        _refuse(node, "computes statistics over the batch (training mode)")
    _outputs_like(node, ctx, first)


def _axes_op(axes_of: Callable[[Node, Graph, int], set[int]]) -> Rule:
    """Ops that mix along some axes of their first input: the batch must not be one. An
    output of lower rank has lost the mixed axes (keepdims=0)."""

    def rule(node: Node, graph: Graph, ctx: Context) -> None:
        first = ctx.of(node.inputs[0])
        if first is None or any(ctx.of(n) for n in node.inputs[1:]):
            _refuse(node, "is not batched on its data input alone")
        rank = _rank(graph, node.inputs[0])
        mixed = axes_of(node, graph, rank)
        if first.axis in mixed:
            _refuse(node, "reduces or mixes along the batch")
        for name in node.outputs:
            if not name:
                continue
            lost = rank - _rank(graph, name)
            dropped = sum(1 for a in mixed if a < first.axis) if lost else 0
            ctx.put(node, name, first.moved(first.axis - dropped))

    return rule


def _axis_attr(default: int) -> Callable[[Node, Graph, int], set[int]]:
    return lambda node, graph, rank: {int(node.attr("axis", default)) % rank}


def _softmax_axes(node: Node, graph: Graph, rank: int) -> set[int]:
    if node.opset < 13:  # coerced to 2-D at axis: it mixes every axis from there
        return set(range(int(node.attr("axis", 1)) % rank, rank))
    return {int(node.attr("axis", -1)) % rank}


def _trailing_axes(node: Node, graph: Graph, rank: int) -> set[int]:
    return set(range(int(node.attr("axis", -1)) % rank, rank))


def _reduce_axes(node: Node, graph: Graph, rank: int) -> set[int]:
    axes = node.attr("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1]:
        if node.inputs[1] not in graph.constants:
            return set(range(rank))
        axes = graph.constants[node.inputs[1]].reshape(-1).tolist()
    if not axes:
        return set() if int(node.attr("noop_with_empty_axes", 0)) else set(range(rank))
    return {int(a) % rank for a in axes}


def _cumulative_axes(node: Node, graph: Graph, rank: int) -> set[int]:
    axis = graph.constants.get(node.inputs[1]) if len(node.inputs) > 1 else None
    return set(range(rank)) if axis is None else {int(np.asarray(axis).reshape(-1)[0]) % rank}


def _mvn_axes(node: Node, graph: Graph, rank: int) -> set[int]:
    return {int(a) % rank for a in node.attr("axes", (0, 2, 3))}


def _transpose(node: Node, graph: Graph, ctx: Context) -> None:
    got = ctx.of(node.inputs[0])
    rank = _rank(graph, node.inputs[0])
    perm = list(node.attr("perm", tuple(reversed(range(rank)))))
    _outputs_like(node, ctx, got.moved(perm.index(got.axis)))


def _view(node: Node, graph: Graph, ctx: Context) -> None:
    """A reshape keeps the row-major order: sample n's entries are the runs of ``chunk``
    entries at n, N + n, 2N + n, ... chunks (``above`` runs of them). The output's batch
    is the axis that holds those runs whole."""
    got = ctx.of(node.inputs[0])
    if got is None:
        _refuse(node, "reshapes a batch it does not have")
    seen = ctx.seen(node.outputs[0])
    if seen is None:
        _refuse(node, "loses the batch")
    shape = graph.value(node.inputs[0]).shape
    above = int(np.prod(shape[: got.axis], dtype=np.int64)) * got.outer
    chunk = got.rows * int(np.prod(shape[got.axis + 1 :], dtype=np.int64))
    out = graph.value(node.outputs[0]).shape
    inner = int(np.prod(out[seen.axis + 1 :], dtype=np.int64))
    outer_dims = int(np.prod(out[: seen.axis], dtype=np.int64))
    if chunk % inner or above % outer_dims:
        _refuse(node, "splits a sample's rows across dims")
    ctx.put(node, node.outputs[0], Batched(seen.axis, chunk // inner, above // outer_dims))


def _matmul(node: Node, graph: Graph, ctx: Context) -> None:
    """Batched on a batch dim of both (aligned), on A's rows, or on B's columns; never on
    the contracted dim."""
    a, b = node.inputs[:2]
    ra, rb = _rank(graph, a), _rank(graph, b)
    rank = _rank(graph, node.outputs[0])
    wants = set()
    for name, r, contracted, last in ((a, ra, ra - 1, rank - 2), (b, rb, rb - 2, rank - 1)):
        got = ctx.of(name)
        if got is None:
            continue
        if r == 1 or got.axis == contracted:
            _refuse(node, f"contracts along the batch of {name!r}")
        wants.add(got.moved(last if got.axis >= r - 2 else got.axis + rank - r))
    if len(wants) != 1:
        _refuse(node, "pairs rows of one sample with columns of another")
    _outputs_like(node, ctx, wants.pop())


def _gemm(node: Node, graph: Graph, ctx: Context) -> None:
    """Batched on A's rows (and C's, if C has them), never on B."""
    rows = 1 if int(node.attr("transA", 0)) else 0
    got = ctx.of(node.inputs[0])
    if got is None or got.axis != rows or ctx.of(node.inputs[1]):
        _refuse(node, "is not batched on A's rows alone")
    want = got.moved(0)
    c = node.input(2)
    if c and ctx.of(c) not in (None, want):
        _refuse(node, "adds a C batched otherwise")
    if c and ctx.of(c) is None and _rank(graph, c) == 2 and graph.value(c).shape[0] != 1:
        _refuse(node, "broadcasts C along the batch")
    _outputs_like(node, ctx, want)


def _gather(node: Node, graph: Graph, ctx: Context) -> None:
    data, indices = node.inputs[:2]
    rank = _rank(graph, data)
    axis = int(node.attr("axis", 0)) % rank
    gd, gi = ctx.of(data), ctx.of(indices)
    if gd and gi:
        _refuse(node, "indexes a batched tensor with batched indices")
    if gd and gd.axis == axis:
        _refuse(node, "gathers along the batch")
    if gd:
        shift = 0 if gd.axis < axis else _rank(graph, indices) - 1
        _outputs_like(node, ctx, gd.moved(gd.axis + shift))
    else:
        _outputs_like(node, ctx, gi.moved(axis + gi.axis))


def _concat(node: Node, graph: Graph, ctx: Context) -> None:
    rank = _rank(graph, node.outputs[0])
    axis = int(node.attr("axis", 0)) % rank
    parts = {ctx.of(n) for n in node.inputs if n}
    if len(parts) != 1 or None in parts:
        _refuse(node, "joins parts batched differently")
    (want,) = parts
    if want.axis == axis:
        _refuse(node, "concatenates along the batch")
    _outputs_like(node, ctx, want)


def _data_batch(node: Node, ctx: Context) -> Batched:
    """The batch of ``node``'s first input, which must be its only batched one."""
    got = ctx.of(node.inputs[0])
    if got is None or any(ctx.of(n) for n in node.inputs[1:]):
        _refuse(node, "is not batched on its data alone")
    return got


def _split(node: Node, graph: Graph, ctx: Context) -> None:
    got = ctx.of(node.inputs[0])
    axis = int(node.attr("axis", 0)) % _rank(graph, node.inputs[0])
    if got is None or got.axis == axis or any(ctx.of(n) for n in node.inputs[1:]):
        _refuse(node, "splits along the batch")
    _outputs_like(node, ctx, got)


def _slice(node: Node, graph: Graph, ctx: Context) -> None:
    """Along other axes only, or the whole batch from 0 with step 1."""
    got = _data_batch(node, ctx)
    rank = _rank(graph, node.inputs[0])
    consts = [graph.constants.get(node.input(i)) for i in range(1, 5)]
    starts, ends, axes, steps = consts
    if starts is None or ends is None or (node.input(3) and axes is None):
        _refuse(node, "slices by values known only at run time")
    axes = range(len(starts)) if axes is None else axes.reshape(-1).tolist()
    for i, axis in enumerate(axes):
        if int(axis) % rank != got.axis:
            continue
        step = 1 if steps is None else int(steps.reshape(-1)[i])
        if int(starts.reshape(-1)[i]) != 0 or step != 1 or got.outer != 1:
            _refuse(node, "slices the batch")
    _outputs_like(node, ctx, got)


def _expand(node: Node, graph: Graph, ctx: Context) -> None:
    """A batched input keeps its batch; an unbatched one may be broadcast to one (the same
    in every sample)."""
    got, seen = ctx.of(node.inputs[0]), ctx.seen(node.outputs[0])
    shift = _rank(graph, node.outputs[0]) - _rank(graph, node.inputs[0])
    _outputs_like(node, ctx, seen if got is None else got.moved(got.axis + shift))


def _constant_of_shape(node: Node, graph: Graph, ctx: Context) -> None:
    """The same value everywhere: every sample alike."""
    _outputs_like(node, ctx, ctx.seen(node.outputs[0]))


def _tile(node: Node, graph: Graph, ctx: Context) -> None:
    got = ctx.of(node.inputs[0])
    repeats = graph.constants.get(node.inputs[1])
    if got is None or repeats is None or int(repeats.reshape(-1)[got.axis]) != 1:
        _refuse(node, "repeats along the batch")
    _outputs_like(node, ctx, got)


def _quant(node: Node, graph: Graph, ctx: Context) -> None:
    """Q/DQ: a per-axis scale must not be along the batch."""
    got = _data_batch(node, ctx)
    scale = node.input(1)
    rank = _rank(graph, node.inputs[0])
    if _rank(graph, scale) >= 1 and graph.value(scale).shape != (1,):
        axis = int(node.attr("axis", 1)) % rank
        if axis == got.axis or _rank(graph, scale) > 1:
            _refuse(node, "scales along the batch")
    _outputs_like(node, ctx, got)


ELEMENTWISE = (
    "Neg", "Abs", "Sqrt", "Exp", "Log", "Tanh", "Sigmoid", "Erf", "Sin", "Cos", "Floor",
    "Ceil", "Round", "Sign", "Reciprocal", "Not", "Softplus", "Tan", "Asin", "Acos", "Atan",
    "Sinh", "Cosh", "Asinh", "Acosh", "Atanh", "Relu", "LeakyRelu", "IsNaN", "IsInf",
    "Cast", "CastLike", "Clip", "Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor",
    "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Mod", "BitShift",
    "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "Max", "Min", "Sum", "Mean",
    "PRelu", "Where", "Identity", "Dropout", "Elu", "Selu", "Celu", "HardSigmoid",
    "HardSwish", "Softsign", "Mish", "Gelu", "ThresholdedRelu", "Shrink", "Swish"
)  # fmt: skip
PER_SAMPLE = (
    "Conv", "ConvInteger", "QLinearConv", "ConvTranspose", "MaxPool", "AveragePool",
    "LpPool", "GlobalMaxPool", "GlobalAveragePool", "GlobalLpPool", "BatchNormalization",
    "InstanceNormalization", "LRN", "DepthToSpace", "SpaceToDepth", "GroupNormalization",
    "Pad", "Resize", "Upsample"
)  # fmt: skip
REDUCE = (
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
    "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"
)  # fmt: skip
RULES: dict[str, Rule] = {
    **dict.fromkeys(ELEMENTWISE, _elementwise),
    **dict.fromkeys(PER_SAMPLE, _per_sample),
    **dict.fromkeys(REDUCE, _axes_op(_reduce_axes)),
    **dict.fromkeys(("Softmax", "LogSoftmax", "Hardmax"), _axes_op(_softmax_axes)),
    **dict.fromkeys(("LayerNormalization", "RMSNormalization"), _axes_op(_trailing_axes)),
    **dict.fromkeys(("ArgMax", "ArgMin"), _axes_op(_axis_attr(0))),
    "TopK": _axes_op(_axis_attr(-1)),
    **dict.fromkeys(("CumSum", "CumProd"), _axes_op(_cumulative_axes)),
    "LpNormalization": _axes_op(_axis_attr(-1)),
    "MeanVarianceNormalization": _axes_op(_mvn_axes),
    "Transpose": _transpose,
    **dict.fromkeys(("Reshape", "Flatten", "Squeeze", "Unsqueeze"), _view),
    **dict.fromkeys(("MatMul", "MatMulInteger"), _matmul),
    "Gemm": _gemm,
    "Gather": _gather,
    "Concat": _concat,
    "Split": _split,
    "Slice": _slice,
    "Expand": _expand,
    "ConstantOfShape": _constant_of_shape,
    "Tile": _tile,
    **dict.fromkeys(("QuantizeLinear", "DequantizeLinear"), _quant),
}
"""Op -> the check that it keeps samples apart (and its outputs' batches agree)."""

SHAPE_INPUTS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "ConstantOfShape": (0,), "Slice": (1, 2),
    "Squeeze": (1,), "Unsqueeze": (1,),
}  # fmt: skip
"""Inputs that may hold values computed from the batch size: they size the output, and
the rules check what the output's batch then is."""
