"""Checks every Program must pass before code generation.

``check_bounds`` proves with isl that each affine access stays inside its buffer: the
image of the statement's domain under the access map is a subset of the buffer's box.
(Computed-index reads, LoadAt, are clamped by code generation instead.) A failure is a
lowering bug, reported with the kernel, statement, buffer and one offending index, rather
than native code reading or writing out of bounds.
"""

from __future__ import annotations

from functools import lru_cache

import islpy as isl

from polyonnx.errors import LoweringError
from polyonnx.krnl.ir import Access, Program, Statement, loads
from polyonnx.krnl.islutil import parse_access, parse_set
from polyonnx.krnl.params import Poly


def check_bounds(program: Program) -> None:
    for kernel in program.kernels:
        for stmt in kernel.statements:
            domain = parse_set(stmt.domain)
            if domain.is_empty():
                continue
            for kind, acc in [
                ("writes", stmt.write),
                *(("reads", ld.access) for ld in loads(stmt.expr)),
            ]:
                shape = program.buffers[acc.buffer].shape
                image = _image(acc, domain)
                outside = image.subtract(_box(shape))
                if not outside.is_empty():
                    raise LoweringError(_message(kernel.name, stmt, kind, acc, shape, outside))


def _image(acc: Access, domain: isl.Set) -> isl.Set:
    return isl.Map.from_multi_aff(parse_access(acc.index)).intersect_domain(domain).range()


@lru_cache(maxsize=1024)
def _box(shape: tuple[int, ...]) -> isl.Set:
    dims = [f"o{r}" for r in range(len(shape))]
    sizes = [n.isl() if isinstance(n, Poly) else n for n in shape]
    bounds = " and ".join(f"0 <= {d} < {n}" for d, n in zip(dims, sizes, strict=True))
    symbols = sorted({s for n in shape if isinstance(n, Poly) for s in n.isl_names})
    params = f"[{', '.join(symbols)}] -> " if symbols else ""
    return isl.Set(f"{params}{{ [{', '.join(dims)}] : {bounds} }}" if dims else "{ [] }")


def _message(kernel: str, stmt: Statement, kind: str, acc: Access, shape, outside: isl.Set) -> str:
    point = outside.sample_point()
    index = [
        int(point.get_coordinate_val(isl.dim_type.set, r).to_python()) for r in range(len(shape))
    ]
    return (
        f"internal error in the lowering of kernel {kernel!r}: statement {stmt.name} {kind} "
        f"{acc.buffer!r} (shape {list(shape)}) at {index}, outside the buffer; "
        f"domain {stmt.domain}, access {acc.index}"
    )
