"""Small helpers that lowerings use to write isl domains, access maps and expressions."""

from __future__ import annotations

from collections.abc import Sequence

from polyonnx.errors import LoweringError
from polyonnx.krnl.ir import Access, Binary, Cast, Const, Expr, Load, Select, Unary, is_float


def box(stmt: str, dims: Sequence[str], shape: Sequence[int]) -> str:
    """``{ stmt[dims] : 0 <= dim < size ... }``: the rectangular domain of a loop nest."""
    bounds = " and ".join(f"0 <= {d} < {n}" for d, n in zip(dims, shape, strict=True))
    head = f"{stmt}[{', '.join(dims)}]"
    return f"{{ {head} : {bounds} }}" if bounds else f"{{ {head} }}"


def access(buffer: str, stmt: str, dims: Sequence[str], index: Sequence[str]) -> Access:
    """An access of ``buffer`` at the affine ``index`` expressions over ``dims``."""
    return Access(buffer, f"{{ {stmt}[{', '.join(dims)}] -> [{', '.join(index)}] }}")


def broadcast_index(out_dims: Sequence[str], in_shape: Sequence[int]) -> list[str]:
    """numpy (multidirectional) broadcasting as an index: trailing dims line up, and a
    dim of size 1 is read at 0 whatever the output index."""
    lead = len(out_dims) - len(in_shape)
    return ["0" if n == 1 else out_dims[lead + r] for r, n in enumerate(in_shape)]


def broadcast_shape(*shapes: Sequence[int]) -> tuple[int, ...]:
    """The numpy broadcast of ``shapes``; raises ValueError when they do not broadcast."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for r in range(rank):
        sizes = {s[r - rank + len(s)] for s in shapes if r - rank + len(s) >= 0}
        sizes.discard(1)
        if len(sizes) > 1:
            raise ValueError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def normalize_axis(axis: int, rank: int, where: str) -> int:
    """``axis`` of a rank-``rank`` tensor, given in ``[-rank, rank)``, as an index in
    ``[0, rank)``; ``where`` (e.g. ``"Softmax node 'sm'"``) names the node in the error."""
    axis = int(axis)
    if not -rank <= axis < rank:
        raise LoweringError(
            f"{where}: axis {axis} is out of range for rank {rank} (valid: {-rank}..{rank - 1})"
        )
    return axis % rank


def normalize_axes(axes: Sequence[int], rank: int, where: str) -> list[int]:
    """Every axis normalised by :func:`normalize_axis`, sorted; repeats are an error."""
    found = sorted(normalize_axis(a, rank, where) for a in axes)
    if len(set(found)) != len(found):
        raise LoweringError(f"{where}: axes {list(axes)} name the same axis twice")
    return found


def dims(prefix: str, rank: int) -> list[str]:
    return [f"{prefix}{r}" for r in range(rank)]


def const(value: float | int | bool, dtype: str) -> Const:
    if dtype == "bool":
        return Const(dtype, bool(value))
    return Const(dtype, float(value) if is_float(dtype) else int(value))


def unary(op: str, x: Expr, dtype: str | None = None) -> Unary:
    return Unary(dtype or x.dtype, op, x)


def binary(op: str, a: Expr, b: Expr, dtype: str | None = None) -> Binary:
    return Binary(dtype or a.dtype, op, a, b)


def select(cond: Expr, a: Expr, b: Expr) -> Select:
    return Select(a.dtype, cond, a, b)


def cast(x: Expr, dtype: str, saturate: bool = True) -> Expr:
    return x if x.dtype == dtype else Cast(dtype, x, saturate)


def load(acc: Access, dtype: str) -> Load:
    return Load(dtype, acc)
