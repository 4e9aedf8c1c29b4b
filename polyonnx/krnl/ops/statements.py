"""Loop nests and statement lists for the lowerings that write a few statements over
named dims by hand: Attention, RotaryEmbedding, LinearAttention, CausalConvWithState."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from polyonnx.frontend.graph import Node
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import Access, Expr, Iter, Statement
from polyonnx.krnl.islutil import parse_set
from polyonnx.krnl.lower import LowerContext


@dataclass(frozen=True)
class Nest:
    """A loop nest: named dims and their extents."""

    dims: tuple[str, ...]
    shape: tuple[int, ...]

    def domain(self, stmt: str, *where: str) -> str:
        """``{ stmt[dims] : 0 <= dim < size and ... and where }``."""
        bounds = [f"0 <= {d} < {n}" for d, n in zip(self.dims, self.shape, strict=True)]
        head = f"{stmt}[{', '.join(self.dims)}]"
        constraints = " and ".join([*bounds, *where])
        return f"{{ {head} : {constraints} }}" if constraints else f"{{ {head} }}"

    def at(self, buffer: str, stmt: str, index: Sequence[str]) -> Access:
        return kb.access(buffer, stmt, self.dims, index)

    def load(self, buffer: str, stmt: str, index: Sequence[str], dtype: str) -> Expr:
        return kb.load(self.at(buffer, stmt, index), dtype)

    def extend(self, dims: Sequence[str], shape: Sequence[int]) -> Nest:
        return Nest((*self.dims, *dims), (*self.shape, *shape))


class Statements:
    """Statements of one kernel, named S0, S1, … in order."""

    def __init__(self) -> None:
        self.list: list[Statement] = []

    @property
    def next(self) -> str:
        return f"S{len(self.list)}"

    def add(
        self,
        nest: Nest,
        write: tuple[str, Sequence[str]],
        expr: Callable[[str], Expr],
        *where: str,
        reduce: str | None = None,
    ) -> None:
        """``write = expr`` over ``nest`` restricted by ``where``; skipped when empty."""
        name = self.next
        domain = nest.domain(name, *where)
        if parse_set(domain).is_empty():
            return
        self.list.append(
            Statement(name, domain, nest.at(write[0], name, write[1]), expr(name), reduce)
        )

    def emit(self, ctx: LowerContext, node: Node) -> None:
        """The node's kernel; none when every domain was empty (zero-size outputs)."""
        if self.list:
            ctx.kernel(node, self.list)


def seq_index(rank3: bool, b: str, h: str, s: str, d: str, size: int) -> list[str]:
    """Where element [b, h, s, d] of a logical (batch, heads, seq, head_size) tensor lives:
    the tensor itself, or a 3-D (batch, seq, heads*head_size) one."""
    return [b, s, f"{size}*({h}) + {d}"] if rank3 else [b, h, s, d]


def i64(value: int | str) -> Expr:
    """An int64 index: a loop's iterator by name, or a constant."""
    return Iter("int64", value) if isinstance(value, str) else kb.const(value, "int64")
