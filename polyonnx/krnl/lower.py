"""Graph → Program: run each node's lowering, then settle where outputs live."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

import numpy as np

from polyonnx.aligned import aligned
from polyonnx.errors import LoweringError, UnsupportedOpError, ValueRequiredError
from polyonnx.frontend.graph import Graph, Node
from polyonnx.frontend.load import op_key
from polyonnx.krnl import build as kb
from polyonnx.krnl.ir import DTYPES, Buffer, Expr, Kernel, Program, Statement, storage

Lowering = Callable[["LowerContext", Node], None]
LOWERINGS: dict[str, Lowering] = {}


def lowers(*op_types: str) -> Callable[[Lowering], Lowering]:
    """Register a function as the lowering of ``op_types``."""

    def register(fn: Lowering) -> Lowering:
        for op in op_types:
            LOWERINGS[op] = fn
        return fn

    return register


def supported_ops() -> frozenset[str]:
    _load_op_modules()
    return frozenset(LOWERINGS)


class LowerContext:
    """The mutable workbench one lowering run uses; it yields a frozen Program."""

    def __init__(self, graph: Graph, input_offsets: Mapping[str, int] | None = None):
        self.graph = graph
        self._given_offsets = dict(input_offsets or {})
        self.input_offsets: dict[str, int] = {}
        self.buffers: dict[str, Buffer] = {}
        self.constants: dict[str, np.ndarray] = {}
        self.views: dict[str, str] = {}
        self.slices: dict[str, tuple[str, int]] = {}
        self.kernels: list[Kernel] = []
        self._kernel_names: set[str] = set()
        self._temp_count = 0
        for value in graph.inputs:
            if value.dtype not in DTYPES:
                raise LoweringError(
                    f"graph input {value.name!r} has dtype {value.dtype}, which polyonnx does not "
                    "support yet"
                )
            self.buffers[value.name] = Buffer(value.name, tuple(value.shape), value.dtype)

    # -- reading operands ------------------------------------------------------------

    def input_offset(self, name: str, default: int) -> int:
        """Where graph input ``name``'s data is taken to start past a cache line, in bytes:
        as given for this compilation (the runtime compiles per offset it meets), else
        ``default``. Recorded in the program: code laid out for it still runs correctly
        from any start."""
        offset = self._given_offsets.get(name, default)
        self.input_offsets[name] = offset
        return offset

    def buffer(self, name: str) -> Buffer:
        if name in self.buffers:
            return self.buffers[name]
        if name in self.graph.constants:
            return self._store(name, self.graph.constants[name])
        raise LoweringError(f"tensor {name!r} is used before it is produced")

    def constant(self, name: str) -> np.ndarray | None:
        """The value of ``name`` if it is a compile-time constant, else None."""
        if name in self.graph.constants:
            return np.asarray(self.graph.constants[name])
        return self.constants.get(name)

    def add_constant(self, name: str, array: np.ndarray) -> Buffer:
        """Register a constant computed at lowering time (e.g. folded BatchNorm scales) as
        a new buffer ``name``, stored like the graph's own constants."""
        if name in self.graph.values:
            raise LoweringError(f"constant {name!r} would shadow an existing tensor")
        return self.constant_output(name, array)

    def table(self, hint: str, array: np.ndarray) -> Buffer:
        """A constant computed at lowering time (tap weights, coordinate tables) under a
        fresh name derived from ``hint``."""
        name = hint
        while name in self.buffers or name in self.graph.values:
            name += "_"
        return self.add_constant(name, array)

    def constant_output(self, name: str, array: np.ndarray) -> Buffer:
        """A node output whose value is known when lowering (Shape, Size): a constant that
        later lowerings read through ``constant()``."""
        if name in self.buffers:
            raise LoweringError(f"constant {name!r} would shadow an existing tensor")
        return self._store(name, array)

    def _store(self, name: str, array: np.ndarray) -> Buffer:
        """Keep a constant as native code reads it (polyonnx/aligned.py): the graph's own
        are already so, the ones computed when lowering are copied."""
        array = aligned(array)
        self.constants[name] = array
        self.buffers[name] = Buffer(name, tuple(array.shape), array.dtype.name)
        return self.buffers[name]

    def require_constant(self, node: Node, index: int, what: str) -> np.ndarray:
        value = self.constant(node.input(index))
        if value is None and node.input(index) in {v.name for v in self.graph.inputs}:
            raise ValueRequiredError(
                [node.input(index)],
                f"{node.op_type} node {node.name!r}: input {index} ({what}) is the graph input "
                f"{node.input(index)!r}; its value is needed to compile",
            )
        if value is None:
            raise LoweringError(
                f"{node.op_type} node {node.name!r}: input {index} ({what}) must be a "
                "constant after constant folding; computed values are not supported"
            )
        return value

    def operand(self, name: str, stmt: str, out_dims: Sequence[str]) -> Expr:
        """``name`` read at the numpy-broadcast position of ``out_dims``; a constant
        with a single element becomes a literal instead of a load."""
        value = self.constant(name)
        if value is not None and value.size == 1:
            return kb.const(value.reshape(()).item(), value.dtype.name)
        buf = self.buffer(name)
        index = kb.broadcast_index(out_dims, buf.shape)
        return kb.load(kb.access(name, stmt, out_dims, index), buf.dtype)

    # -- writing results ---------------------------------------------------------------

    def output(self, name: str, shape: Sequence[int], dtype: str) -> Buffer:
        if dtype not in DTYPES:
            raise LoweringError(f"tensor {name!r} has unsupported dtype {dtype}")
        buf = Buffer(name, tuple(int(n) for n in shape), dtype)
        self.buffers[name] = buf
        return buf

    def temp(self, hint: str, shape: Sequence[int], dtype: str) -> Buffer:
        self._temp_count += 1
        return self.output(f"{hint}.tmp{self._temp_count}", shape, dtype)

    def view(self, name: str, base: str, shape: Sequence[int]) -> None:
        """``name`` is ``base``'s storage seen with another shape (no copy)."""
        src = self.buffer(base)
        buf = Buffer(name, tuple(int(n) for n in shape), src.dtype)
        if buf.size != src.size:
            raise LoweringError(f"view {name!r} of {base!r}: {buf.shape} vs {src.shape}")
        self.buffers[name] = buf
        self.views[name] = base

    def store_inside(self, name: str, container: str, start: int) -> None:
        """``name``'s storage is ``container``'s from element ``start`` on (no copy)."""
        self.slices[name] = (container, start)

    def kernel(
        self, node: Node, statements: Sequence[Statement], suffix: str = "", op_type: str = ""
    ) -> None:
        """A kernel of ``node``'s, named after it (plus ``suffix``, for the kernels of a
        lowering that takes several; a name already taken gets underscores), of the node's
        op type unless ``op_type`` names the part of it the kernel computes."""
        name = (node.name or node.op_type) + suffix
        while name in self._kernel_names:
            name = f"{name}_"
        self._kernel_names.add(name)
        kernel = Kernel(name, op_type or node.op_type, tuple(statements))
        self._check_views(node, kernel)
        self.kernels.append(kernel)

    def _check_views(self, node: Node, kernel: Kernel) -> None:
        """A kernel must not touch bytes it writes under two names (a buffer and a view
        of it): dependences are computed per name, so the schedule could reorder the
        write and the other name's reads (docs/architecture.md). Names for disjoint
        parts of one storage (a Concat's parts) are fine."""
        spans: dict[str, list[tuple[int, int, str]]] = {}
        for buffer in kernel.buffers():
            root, start = storage(self.views, self.slices, buffer)
            spans.setdefault(root, []).append((start, start + self.buffers[buffer].size, buffer))
        for stmt in kernel.statements:
            root, start = storage(self.views, self.slices, stmt.write.buffer)
            end = start + self.buffers[stmt.write.buffer].size
            clash = sorted(
                b for lo, hi, b in spans[root] if b != stmt.write.buffer and lo < end and start < hi
            )
            if clash:
                raise LoweringError(
                    f"{node.op_type} node {node.name!r}: its kernel writes "
                    f"{stmt.write.buffer!r} and also reaches its storage as {clash}; "
                    "dependences would miss the aliasing"
                )

    # -- result ------------------------------------------------------------------------

    def program(self) -> Program:
        return Program(
            kernels=tuple(self.kernels),
            buffers=MappingProxyType(dict(self.buffers)),
            inputs=tuple(v.name for v in self.graph.inputs),
            outputs=tuple(v.name for v in self.graph.outputs),
            constants=MappingProxyType(dict(self.constants)),
            views=MappingProxyType(dict(self.views)),
            slices=MappingProxyType(dict(self.slices)),
            input_offsets=MappingProxyType(dict(self.input_offsets)),
        )


def lower(graph: Graph, input_offsets: Mapping[str, int] | None = None) -> Program:
    """Lower every node of a static-shaped graph to kernels; ``input_offsets``: where
    inputs' data starts past a cache line, in bytes (LowerContext.input_offset)."""
    _load_op_modules()
    missing: dict[str, list[str]] = {}
    for node in graph.nodes:
        if node.op_type not in LOWERINGS or node.domain not in ("", "ai.onnx"):
            missing.setdefault(op_key(node.domain, node.op_type), []).append(node.name)
    if missing:
        raise UnsupportedOpError(missing)
    if not graph.is_static:
        raise LoweringError("lowering needs static input shapes; specialise the graph first")
    ctx = LowerContext(graph, input_offsets)
    for node in graph.nodes:
        try:
            LOWERINGS[node.op_type](ctx, node)
        except (LoweringError, UnsupportedOpError):
            raise
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise LoweringError(f"{node.op_type} node {node.name!r}: {exc}") from exc
    _place_outputs(ctx)
    return ctx.program()


def _place_outputs(ctx: LowerContext) -> None:
    """Give every computed graph output storage of its own.

    An output that is a view of a graph input, of a constant, or of storage another output
    already owns gets a copy kernel; otherwise it owns its root's storage. Outputs that
    *are* an input or a constant are left to the runtime, which returns a copy.
    """
    external = set(ctx.graph.constants) | {v.name for v in ctx.graph.inputs}
    claimed: set[str] = set()
    for name in dict.fromkeys(v.name for v in ctx.graph.outputs):  # a name may repeat
        if name in ctx.graph.constants:
            ctx.buffer(name)  # registers the constant, which the runtime returns a copy of
            continue
        if name in external:
            continue
        root = _root(ctx.views, name)
        if root not in external and root not in ctx.slices and root not in claimed:
            claimed.add(root)
            continue
        source = f"{name}.src"
        ctx.buffers[source] = ctx.buffers[name]
        ctx.views[source] = ctx.views.pop(name)
        for view, base in list(ctx.views.items()):  # other views read the source, not the
            if base == name:  # copy, which only runs at the end
                ctx.views[view] = source
        shape = ctx.buffers[name].shape
        dims = kb.dims("d", len(shape))
        body = kb.load(kb.access(source, "S0", dims, dims), ctx.buffers[name].dtype)
        stmt = Statement("S0", kb.box("S0", dims, shape), kb.access(name, "S0", dims, dims), body)
        ctx.kernels.append(Kernel(f"copy_{name}", "Identity", (stmt,)))
        claimed.add(name)


def _root(views: dict[str, str], name: str) -> str:
    while name in views:
        name = views[name]
    return name


def _load_op_modules() -> None:
    """Import the op families so that their @lowers decorators register."""
    from polyonnx.krnl import ops  # noqa: F401
