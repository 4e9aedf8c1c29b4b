"""TopK: the k largest (or smallest) elements along an axis, and their indices.

Formulated as ranking, without sorting. An element's rank along the axis is how many
elements come before it in ONNX's order — larger values first (smaller with
``largest=0``), ties broken by the smaller index, NaN counted as the largest value, as
the reference's ``lexsort`` does. Because the tie-break is by position, "before" splits
into two affine halves of the (i, j) square with a plain comparison in each::

    S0: rank[.., i, ..] = 0
    S1: rank[.., i, ..] += x[.., j, ..] >= x[.., i, ..]     over j < i   (largest)
    S2: rank[.., i, ..] += x[.., j, ..] >  x[.., i, ..]     over j > i
    S3: indices[.., r, ..] = -1
    S4: indices[.., r, ..] = max(indices[.., r, ..], rank[.., i, ..] == r ? i : -1)
                                                             over r < k, i < n
    S5: values[.., r, ..] = x[.., indices[.., r, ..], ..]    (a LoadAt)

Ranks are a permutation of 0..n-1 along each line, so S4 finds exactly one i per r: a
gather by an argmax-style reduction. That is O(n²) comparisons per line (plus O(k·n) for
the gather) instead of a sort's O(n log n); TopK axes in models (scores, boxes,
vocabularies of a few thousand) keep this affordable, and every line is independent.

``sorted=0`` allows any order, so the output is always sorted.
"""

from __future__ import annotations

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Expr, Iter, LoadAt, Statement, is_float
from polyonnx.krnl.lower import LowerContext, lowers


@lowers("TopK")
def lower_topk(ctx: LowerContext, node: Node) -> None:
    x = ctx.buffer(node.inputs[0])
    rank = len(x.shape)
    where = f"TopK node {node.name!r}"
    if rank == 0:
        raise LoweringError(f"{where}: the input must have rank >= 1")
    if x.dtype == "bool":
        raise LoweringError(f"{where}: bool input is not supported")
    axis = kb.normalize_axis(int(node.attr("axis", -1)), rank, where)
    k = _k(ctx, node, where)
    n = x.shape[axis]
    if not 0 <= k <= n:
        raise LoweringError(f"{where}: k = {k} is outside [0, {n}] (axis {axis} of {x.shape})")
    largest = bool(int(node.attr("largest", 1)))
    shape = [k if r == axis else size for r, size in enumerate(x.shape)]
    values = ctx.output(node.outputs[0], shape, x.dtype)
    has_indices = len(node.outputs) > 1 and node.outputs[1]
    indices = (
        ctx.output(node.outputs[1], shape, "int64")
        if has_indices
        else ctx.temp(f"{values.name}.indices", shape, "int64")
    )
    if not values.size:
        return
    order = ctx.temp(f"{values.name}.rank", x.shape, "int64").name

    dims = kb.dims("d", rank)
    i = dims[axis]
    full = [*dims, "j"]
    at_j = [("j" if r == axis else d) for r, d in enumerate(dims)]
    bounds = [f"0 <= {d} < {size}" for d, size in zip(dims, x.shape, strict=True)]
    statements = [
        Statement("S0", kb.box("S0", dims, x.shape), kb.access(order, "S0", dims, dims), _i64(0))
    ]
    for name, side in (("S1", f"j < {i}"), ("S2", f"j > {i}")):
        domain = (
            f"{{ {name}[{', '.join(full)}] : {' and '.join([*bounds, f'0 <= j < {n}', side])} }}"
        )
        xi = kb.load(kb.access(x.name, name, full, dims), x.dtype)
        xj = kb.load(kb.access(x.name, name, full, at_j), x.dtype)
        before = _before(xj, xi, largest, earlier=name == "S1")
        body = kb.cast(before, "int64")
        statements.append(Statement(name, domain, kb.access(order, name, full, dims), body, "add"))

    r = dims[axis]
    statements.append(
        Statement(
            "S3", kb.box("S3", dims, shape), kb.access(indices.name, "S3", dims, dims), _i64(-1)
        )
    )
    gather_dims = [*dims, "i"]
    rank_at_i = [("i" if q == axis else d) for q, d in enumerate(dims)]
    hit = kb.binary(
        "eq",
        kb.load(kb.access(order, "S4", gather_dims, rank_at_i), "int64"),
        Iter("int64", r),
        "bool",
    )
    domain = kb.box("S4", gather_dims, [*shape, n])
    body = kb.select(hit, Iter("int64", "i"), _i64(-1))
    write = kb.access(indices.name, "S4", gather_dims, dims)
    statements.append(Statement("S4", domain, write, body, "max"))

    picked = kb.load(kb.access(indices.name, "S5", dims, dims), "int64")
    index = tuple(picked if q == axis else Iter("int64", d) for q, d in enumerate(dims))
    statements.append(
        Statement(
            "S5",
            kb.box("S5", dims, shape),
            kb.access(values.name, "S5", dims, dims),
            LoadAt(x.dtype, x.name, index),
        )
    )
    ctx.kernel(node, statements)


def _k(ctx: LowerContext, node: Node, where: str) -> int:
    if node.opset < 10:
        k = node.attr("k")
        if k is None:
            raise LoweringError(f"{where}: attribute k is required before opset 10")
        return int(k)
    value = ctx.require_constant(node, 1, "k")
    if value.size != 1:
        raise LoweringError(f"{where}: k must have one element, has shape {value.shape}")
    return int(value.reshape(-1)[0])


def _before(xj: Expr, xi: Expr, largest: bool, earlier: bool) -> Expr:
    """Whether element j comes before element i; ``earlier``: j < i, so ties count.

    NaN is the largest value: first when ``largest``, last otherwise."""
    if largest:
        cmp = kb.binary("ge" if earlier else "gt", xj, xi, "bool")
    else:
        cmp = kb.binary("le" if earlier else "lt", xj, xi, "bool")
    if not is_float(xj.dtype):
        return cmp
    nan_j, nan_i = kb.unary("isnan", xj, "bool"), kb.unary("isnan", xi, "bool")
    first, other = (nan_j, nan_i) if largest else (nan_i, nan_j)
    if earlier:  # NaN ties with NaN, and j < i wins the tie
        return kb.binary("or", first, cmp)
    return kb.binary("or", kb.binary("and", first, kb.unary("not", other)), cmp)


def _i64(value: int) -> Expr:
    return kb.const(value, "int64")
