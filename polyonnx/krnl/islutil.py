"""Parsing and questions about the isl strings kept in the krnl IR."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, TypeVar

import islpy as isl

from polyonnx.krnl.ir import Access, Statement

T = TypeVar("T")


class CallbackGuard:
    """Wraps the Python functions handed to isl as callbacks. islpy swallows an exception
    raised in a callback and hands isl an error value, on which some isl calls crash (an
    AST build's ``at_each_domain``): the guard catches it, stores it, answers isl with a
    harmless value, and :func:`isl_callbacks` raises it once the isl call returned."""

    def __init__(self) -> None:
        self.error: BaseException | None = None

    def wrap(self, fn: Callable[..., T], fallback: Callable[..., T]) -> Callable[..., T]:
        """``fn``, or ``fallback`` (same arguments) once a call raised: isl then unwinds
        through harmless answers without running more of our code."""

        def call(*args: Any) -> T:
            if self.error is None:
                try:
                    return fn(*args)
                except BaseException as error:
                    self.error = error
            return fallback(*args)

        return call

    def each(self, fn: Callable[..., Any]) -> Callable[..., None]:
        """A ``foreach_*`` callback: its answer is ignored, ``None`` goes on."""
        return self.wrap(fn, _none)

    def descend(self, fn: Callable[..., bool]) -> Callable[..., bool]:
        """A ``foreach_descendant_*`` callback: after an error, descend no further."""
        return self.wrap(fn, _false)

    def node(self, fn: Callable[..., T]) -> Callable[..., T]:
        """A callback that returns the node it is given (``at_each_domain``,
        ``map_descendant_bottom_up``): after an error, the node unchanged."""
        return self.wrap(fn, _first)


def _none(*_: Any) -> None:
    return None


def _false(*_: Any) -> bool:
    return False


def _first(first: T, *_: Any) -> T:
    return first


@contextmanager
def isl_callbacks(what: str) -> Iterator[CallbackGuard]:
    """A guard for the callbacks of the isl calls in the block; an exception one of them
    raised is raised again when the block ends (a PolyonnxError as it is, anything else
    as the original, with a note naming ``what`` isl was doing)."""
    guard = CallbackGuard()
    try:
        yield guard
    except Exception:
        if guard.error is None:
            raise
        _raise(guard.error, what)  # isl failed because our callback did: that is the news
    if guard.error is not None:
        _raise(guard.error, what)


def _raise(error: BaseException, what: str) -> None:
    error.add_note(f"(raised in an isl callback while {what})")
    raise error


def visit(obj: Any, method: str) -> list[tuple[Any, ...]]:
    """The arguments of every call isl makes to the callback of ``obj.method`` (a
    ``foreach_*`` method), in order: the objects a union or piecewise value holds."""
    found: list[tuple[Any, ...]] = []
    with isl_callbacks(method) as guard:
        getattr(obj, method)(guard.each(lambda *args: found.append(args)))
    return found


@lru_cache(maxsize=4096)
def parse_set(text: str) -> isl.Set:
    return isl.Set(text)


@lru_cache(maxsize=8192)
def tuple_names(union: isl.UnionSet) -> set[str]:
    """The statement names a union set (a schedule filter) holds points of."""
    return {part.get_tuple_name() for (part,) in visit(union, "foreach_set")}


@lru_cache(maxsize=8192)
def parse_access(text: str) -> isl.MultiAff:
    return isl.MultiAff(text)


def dim_names(stmt: Statement) -> list[str]:
    domain = parse_set(stmt.domain)
    return [domain.get_dim_name(isl.dim_type.set, d) for d in range(domain.dim(isl.dim_type.set))]


def extents(stmt: Statement) -> list[int]:
    """The number of values each domain dim of the statement takes (its bounding box)."""
    domain = parse_set(stmt.domain)
    count = domain.dim(isl.dim_type.set)
    if domain.is_empty():
        return [0] * count
    return [
        int(domain.dim_max_val(d).to_python()) - int(domain.dim_min_val(d).to_python()) + 1
        for d in range(count)
    ]


def row_major_strides(shape: Sequence[int]) -> list[int]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(int(n), 1)
    return strides[::-1]


def flat_stride(acc: Access, shape: Sequence[int], dim: int) -> int | None:
    """How far (in elements) the access moves when domain dim ``dim`` grows by one;
    None when the index is not affine in that dim (floor divisions)."""
    index = parse_access(acc.index)
    total = 0
    for r, stride in enumerate(row_major_strides(shape)):
        aff = index.get_aff(r)
        if aff.dim(isl.dim_type.div) and _div_involves(aff, dim):
            return None
        total += int(aff.get_coefficient_val(isl.dim_type.in_, dim).to_python()) * stride
    return total


def _div_involves(aff: isl.Aff, dim: int) -> bool:
    for d in range(aff.dim(isl.dim_type.div)):
        if aff.get_div(d).involves_dims(isl.dim_type.in_, dim, 1):
            return True
    return False


def named_access(acc: Access, buffer_id: str) -> isl.Map:
    """The access as an isl map whose range tuple is named ``buffer_id``."""
    relation = isl.Map.from_multi_aff(parse_access(acc.index))
    return relation.set_tuple_name(isl.dim_type.out, buffer_id)


def is_identity(stmt: Statement, index: str) -> bool:
    """The access reads (or writes) element (d0, d1, ..) at each point (d0, d1, ..) of the
    statement's domain (dims of extent 1 may be written as 0)."""
    names = ", ".join(dim_names(stmt))
    access = parse_access(index)
    if access.dim(isl.dim_type.out) != len(dim_names(stmt)):
        return False
    domain = parse_set(stmt.domain)
    identity = isl.Map(f"{{ {stmt.name}[{names}] -> [{names}] }}").intersect_domain(domain)
    return isl.Map.from_multi_aff(access).intersect_domain(domain).is_equal(identity)


def is_whole_identity(stmt: Statement, index: str, shape: Sequence[int]) -> bool:
    """The access is the identity (:func:`is_identity`) and the statement's domain is the
    whole buffer of ``shape``: the statement touches every element once, in place."""
    names = dim_names(stmt)
    if len(names) != len(shape) or not is_identity(stmt, index):
        return False
    bounds = " and ".join(f"0 <= {d} < {n}" for d, n in zip(names, shape, strict=True))
    head = f"{stmt.name}[{', '.join(names)}]"
    box = isl.Set(f"{{ {head} : {bounds} }}" if bounds else f"{{ {head} }}")
    return parse_set(stmt.domain).is_equal(box)
