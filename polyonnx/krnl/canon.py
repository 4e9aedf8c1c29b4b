"""Structural identity of kernels: two kernels that differ only in the names of the tensors
they touch compute the same thing, so they can share one compiled function (buffers are
passed as pointers) and one tuning record.

``structural_key`` renames a kernel's buffers to B0, B1, … in first-use order and hashes
the statements together with the buffers' shapes and dtypes (and, when given, the
schedule tree, which names no buffers).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Mapping

from polyonnx.krnl.ir import Access, Buffer, Expr, Extent, Kernel, Load, LoadAt, map_expr


def rename_buffers(kernel: Kernel, names: Mapping[str, str]) -> Kernel:
    """``kernel`` with every buffer ``b`` renamed to ``names[b]``."""

    def access(acc: Access) -> Access:
        return Access(names[acc.buffer], acc.index)

    statements = tuple(
        dataclasses.replace(
            s, write=access(s.write), expr=map_expr(s.expr, lambda e: _rename(e, access, names))
        )
        for s in kernel.statements
    )
    return Kernel(kernel.name, kernel.op_type, statements)


def _rename(expr: Expr, access: Callable[[Access], Access], names: Mapping[str, str]) -> Expr:
    if isinstance(expr, Load):
        return dataclasses.replace(expr, access=access(expr.access))
    if isinstance(expr, LoadAt | Extent):
        return dataclasses.replace(expr, buffer=names[expr.buffer])
    return expr


def structural_key(kernel: Kernel, buffers: Mapping[str, Buffer], schedule: str = "") -> str:
    names = {b: f"B{i}" for i, b in enumerate(kernel.buffers())}
    canonical = rename_buffers(kernel, names)
    layout = [(buffers[b].shape, buffers[b].dtype) for b in kernel.buffers()]
    text = repr((canonical.op_type, canonical.statements, layout, schedule))
    return hashlib.sha1(text.encode()).hexdigest()


__all__ = ["rename_buffers", "structural_key"]
