"""Elementwise chain fusion: inline a producer kernel's expression into its one consumer.

``fuse_elementwise(program)`` merges chains of elementwise kernels (one statement, no
reduction) into one kernel with one statement, so the intermediates are never stored::

    before                                   after
    Add:     t0[i, j] = x[i, j] + b[j]       Sigmoid: y[i, j] =
    Mul:     t1[i, j] = t0[i, j] * s[i, 0]       sigmoid(max((x[i, j] + b[j]) * s[i, 0], 0))
    Relu:    t2[i, j] = max(t1[i, j], 0)
    Sigmoid: y[i, j]  = sigmoid(t2[i, j])

A producer P (writing T) is inlined into a consumer C when

- P has one statement, no reduction, no ``Iter``/``LoadAt``, and writes all of T at the
  identity index of its domain (the box of T's shape) in T's own dtype, and T's dtype is
  its register dtype (a bfloat16/float8 store rounds; inlining would skip that);
- T is not a graph input, output or constant, is no view and has no views, and C is the
  only kernel of ``program`` that reads it (C has one statement, no reduction, and reads
  T only through affine loads): a T with two consumers stays, even where inlining one
  consumer into the other would leave one;
- no kernel between P and C writes a buffer P reads;
- where C reads an element of T more than once (broadcasting: C's access to T is not
  injective), P's expression is cheap (no transcendental functions, no pow): inlining
  recomputes it per read.

Each of C's loads of T is replaced by P's expression with P's loads re-indexed into C's
domain (the isl access maps composed: ``load_P ∘ access_C``). The merged kernel keeps C's
name; its ``op_type`` joins both (``"Add+Mul"``). T leaves ``program.buffers``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from types import MappingProxyType

import islpy as isl

from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import (
    Access,
    Expr,
    Iter,
    Kernel,
    Load,
    Program,
    Statement,
    children,
    gathers,
    loads,
    map_loads,
    register_dtype,
)
from polyonnx.krnl.islutil import dim_names, parse_access, parse_set

EXPENSIVE_UNARY = frozenset(
    {"exp", "expneg", "log", "tanh", "sigmoid", "erf", "sin", "cos", "softplus", "expm1"}
    | {"log1p", "sqrt"}
)
EXPENSIVE_BINARY = frozenset({"pow", "div", "mod", "fmod"})


def fuse_elementwise(program: Program, keep: frozenset[str] = frozenset()) -> Program:
    """``program`` with every fusable elementwise producer inlined into its consumer (see
    the module docstring for the preconditions); the kernels named in ``keep`` (scripted
    ones) stay as they are. Pure: ``program`` is not changed."""
    readers = _readers(program)
    protected = _protected(program) | {n for n, ks in readers.items() if len(ks) > 1}
    done: list[Kernel] = []
    dropped: set[str] = set()
    for consumer in program.kernels:
        changed = consumer.name not in keep
        while changed:
            changed = False
            for pos in range(len(done) - 1, -1, -1):
                producer = done[pos]
                if producer.name in keep:
                    continue
                fused = _inline(program, producer, consumer, done[pos + 1 :], readers, protected)
                if fused is None:
                    continue
                target = producer.statements[0].write.buffer
                for name in producer.reads():
                    readers[program.root(name)].discard(producer.name)
                    readers[program.root(name)].add(consumer.name)
                readers.pop(target, None)
                dropped.add(target)
                del done[pos]
                consumer, changed = fused, True
                break
        done.append(consumer)
    if not dropped:
        return program
    buffers = {n: b for n, b in program.buffers.items() if n not in dropped}
    return dataclasses.replace(program, kernels=tuple(done), buffers=MappingProxyType(buffers))


# ---- preconditions ----------------------------------------------------------------


def _readers(program: Program) -> dict[str, set[str]]:
    """Per root buffer, the kernels that read it."""
    found: dict[str, set[str]] = {}
    for kernel in program.kernels:
        for name in kernel.reads():
            found.setdefault(program.root(name), set()).add(kernel.name)
    return found


def _protected(program: Program) -> set[str]:
    """Buffers whose storage must stay: graph inputs, outputs (and what they view),
    constants, views and the buffers views share, Concat parts and their outputs."""
    names = set(program.inputs) | set(program.outputs) | set(program.constants)
    names |= {program.root(o) for o in program.outputs}
    names |= set(program.views) | {program.root(v) for v in program.views}
    names |= set(program.slices) | {c for c, _ in program.slices.values()}
    return names


def _inline(
    program: Program,
    producer: Kernel,
    consumer: Kernel,
    between: list[Kernel],
    readers: Mapping[str, set[str]],
    protected: set[str],
) -> Kernel | None:
    """``consumer`` with ``producer`` inlined, or None when a precondition fails."""
    if len(producer.statements) != 1 or len(consumer.statements) != 1:
        return None
    p, c = producer.statements[0], consumer.statements[0]
    target = p.write.buffer
    if p.reduce is not None or c.reduce is not None or target in protected:
        return None
    if readers.get(target) != {consumer.name} or c.write.buffer == target:
        return None
    if any(g.buffer == target for g in gathers(c.expr)):
        return None
    if not _plain_producer(program, p):
        return None
    sources = {program.root(name) for name in producer.reads()}
    if any(program.root(w) in sources for k in between for w in k.writes()):
        return None
    reads = [ld for ld in loads(c.expr) if ld.access.buffer == target]
    if not all(_injective(ld.access, c) for ld in reads) and _expensive(p.expr):
        return None
    expr = map_loads(c.expr, lambda ld: _substitute(ld, p) if ld.access.buffer == target else ld)
    stmt = dataclasses.replace(c, expr=expr)
    return Kernel(consumer.name, f"{producer.op_type}+{consumer.op_type}", (stmt,))


def _plain_producer(program: Program, p: Statement) -> bool:
    """P writes all of its buffer at the identity index, in the buffer's own dtype, and
    its expression reads only through affine loads."""
    buffer = program.buffers[p.write.buffer]
    if p.expr.dtype != buffer.dtype or register_dtype(buffer.dtype) != buffer.dtype:
        return False
    if gathers(p.expr) or _has_iter(p.expr):
        return False
    dims = dim_names(p)
    if len(dims) != len(buffer.shape):
        return False
    tuple_name = parse_set(p.domain).get_tuple_name()
    box = kb.box(tuple_name, dims, buffer.shape)
    if not parse_set(p.domain).is_equal(parse_set(box)):
        return False
    identity = kb.access(buffer.name, tuple_name, dims, dims).index
    return parse_access(p.write.index).plain_is_equal(parse_access(identity))


def _has_iter(expr: Expr) -> bool:
    return isinstance(expr, Iter) or any(_has_iter(child) for child in children(expr))


def _expensive(expr: Expr) -> bool:
    """Whether recomputing ``expr`` costs more than a few arithmetic instructions."""
    op = getattr(expr, "op", None)
    if op in EXPENSIVE_UNARY or op in EXPENSIVE_BINARY:
        return True
    return any(_expensive(child) for child in children(expr))


def _injective(access: Access, stmt: Statement) -> bool:
    """Whether ``access`` reads each element at most once over the statement's domain."""
    relation = isl.Map.from_multi_aff(parse_access(access.index))
    return relation.intersect_domain(parse_set(stmt.domain)).is_injective()


# ---- substitution -----------------------------------------------------------------


def _substitute(read: Load, p: Statement) -> Expr:
    """P's expression seen from the consumer's domain: each of P's loads composed with
    the consumer's access to P's buffer (P's domain is the buffer's index space)."""
    to_index = parse_access(read.access.index)
    return map_loads(p.expr, lambda ld: _through(ld, to_index))


def _through(ld: Load, to_index: isl.MultiAff) -> Load:
    inner = parse_access(ld.access.index).reset_tuple_id(isl.dim_type.in_)
    composed = inner.pullback_multi_aff(to_index)
    return dataclasses.replace(ld, access=Access(ld.access.buffer, _anonymous_range(composed)))


def _anonymous_range(multi: isl.MultiAff) -> str:
    return re.sub(r"-> \w+\[", "-> [", str(multi))
