"""Einsum: one loop nest over every distinct subscript of the equation.

Each subscript (and each dim an ellipsis stands for) is one dim of the domain; an operand
is read through the access map of its subscripts, so a repeated subscript (``ii``, a
diagonal) names the same dim twice and a transposed output is just another write map.
Subscripts absent from the output are summed::

    'bij,bjk->bik'   S0: y[b, i, k] = 0
                     S1: y[b, i, k] += x0[b, i, j] * x1[b, j, k]
    'ij->ji'         S0: y[j, i] = x0[i, j]             (nothing to sum: one statement)

As in numpy, ellipsis dims broadcast (aligned to the right), a subscript of size 1 in one
operand broadcasts against the others, and without ``->`` the output is the ellipsis dims
followed by the subscripts that occur once, in alphabetical order.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce as fold

from polyonnx.errors import LoweringError
from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Expr, Statement
from polyonnx.krnl.lower import LowerContext, lowers


@dataclass(frozen=True)
class Equation:
    """A parsed equation: each operand's and the output's labels, one per dim. A label is
    a letter, or ``.k`` for the k-th dim of the (right-aligned) ellipsis."""

    inputs: tuple[tuple[str, ...], ...]
    output: tuple[str, ...]


def parse(equation: str, ranks: list[int]) -> Equation:
    """Parse ``equation`` for operands of ``ranks``; raises ValueError when it is malformed."""
    text = "".join(equation.split())
    lhs, arrow, rhs = text.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"equation {equation!r} has {len(terms)} operands, the node {len(ranks)}")
    spans = [_ellipsis_span(term, rank) for term, rank in zip(terms, ranks, strict=True)]
    width = max(spans, default=0)
    inputs = tuple(_labels(term, span, width) for term, span in zip(terms, spans, strict=True))
    if arrow:
        if "..." not in rhs and width and any(spans):
            raise ValueError(
                f"equation {equation!r}: the ellipsis covers {width} dim(s) but the output "
                "has no '...' to put them in"
            )
        output = _labels(rhs, width, width)
    else:
        letters = [label for term in inputs for label in term if not label.startswith(".")]
        once = sorted(c for c in set(letters) if letters.count(c) == 1)
        output = (*(f".{k}" for k in range(width)), *once)
    if len(set(output)) != len(output):
        raise ValueError(f"equation {equation!r}: a subscript repeats in the output")
    known = {label for term in inputs for label in term}
    if missing := [label for label in output if label not in known]:
        raise ValueError(f"equation {equation!r}: output subscripts {missing} are in no input")
    return Equation(inputs, output)


def _ellipsis_span(term: str, rank: int) -> int:
    """How many dims the term's ellipsis stands for (0 if it has none)."""
    letters = len(term.replace("...", ""))
    if (
        not all(c.isascii() and c.isalpha() for c in term.replace("...", ""))
        or term.count("...") > 1
    ):
        raise ValueError(f"bad einsum term {term!r}")
    span = rank - letters
    if span < 0 or (span > 0 and "..." not in term):
        raise ValueError(f"einsum term {term!r} does not match an operand of rank {rank}")
    return span


def _labels(term: str, span: int, width: int) -> tuple[str, ...]:
    head, dots, tail = term.partition("...")
    middle = tuple(f".{k}" for k in range(width - span, width)) if dots else ()
    return (*head, *middle, *tail)


def _dim(label: str) -> str:
    return f"e{label[1:]}" if label.startswith(".") else f"s_{label}"


@lowers("Einsum")
def lower_einsum(ctx: LowerContext, node: Node) -> None:
    operands = [ctx.buffer(name) for name in node.inputs if name]
    equation = node.attr("equation", "")
    equation = equation.decode() if isinstance(equation, bytes) else str(equation)
    try:
        eq = parse(equation, [len(buf.shape) for buf in operands])
    except ValueError as exc:
        raise LoweringError(f"Einsum node {node.name!r}: {exc}") from exc
    dtypes = {buf.dtype for buf in operands}
    if len(dtypes) != 1 or "bool" in dtypes:
        raise LoweringError(f"Einsum node {node.name!r}: operand dtypes {sorted(dtypes)}")
    dtype = dtypes.pop()

    sizes: dict[str, int] = {}
    for buf, labels in zip(operands, eq.inputs, strict=True):
        for label, n in zip(labels, buf.shape, strict=True):
            if sizes.get(label, 1) not in (1, n) and n != 1:
                raise LoweringError(
                    f"Einsum node {node.name!r}: subscript {label!r} has sizes "
                    f"{sizes[label]} and {n} ({equation!r} on {[b.shape for b in operands]})"
                )
            sizes[label] = max(sizes.get(label, 1), n)
    summed = [label for label in sizes if label not in eq.output]
    out_dims = [_dim(label) for label in eq.output]
    out_shape = [sizes[label] for label in eq.output]
    full = [*out_dims, *(_dim(label) for label in summed)]
    stmt = "S1" if summed else "S0"

    def read(buf, labels) -> Expr:
        index = [
            "0" if n == 1 and sizes[label] > 1 else _dim(label)
            for label, n in zip(labels, buf.shape, strict=True)
        ]
        return kb.load(kb.access(buf.name, stmt, full, index), buf.dtype)

    product = fold(
        lambda a, b: kb.binary("mul", a, b),
        [read(buf, labels) for buf, labels in zip(operands, eq.inputs, strict=True)],
    )
    out = ctx.output(node.outputs[0], out_shape, dtype).name
    domain = kb.box(stmt, full, [*out_shape, *(sizes[label] for label in summed)])
    if not summed:
        ctx.kernel(node, [Statement("S0", domain, kb.access(out, "S0", full, out_dims), product)])
        return
    init = Statement(
        "S0",
        kb.box("S0", out_dims, out_shape),
        kb.access(out, "S0", out_dims, out_dims),
        kb.const(0, dtype),
    )
    update = Statement("S1", domain, kb.access(out, "S1", full, out_dims), product, "add")
    ctx.kernel(node, [init, update])
