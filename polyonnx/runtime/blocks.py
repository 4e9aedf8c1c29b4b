"""Running a model in blocks along its batch: one compile for every batch size.

frontend/batch.py proves that a model keeps its samples apart along a symbolic dim. Such
a model is compiled once for a block of ``BLOCK`` samples, and a run of N samples is N /
BLOCK calls of that code on slices of the inputs, each writing its slice of the outputs.
A block of one sample was as fast as the code specialised to the whole batch, or faster,
on the CNNs measured (docs/measurements.md, 'Batches run in blocks'), so one size serves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from polyonnx.aligned import aligned_empty
from polyonnx.errors import PolyonnxError
from polyonnx.frontend.batch import SIZES, Batched, BatchPlan, NotBatched, batch_plan
from polyonnx.frontend.graph import Graph, Value
from polyonnx.runtime.compiled import CompiledModel

BLOCK = 1
"""Samples per block (docs/measurements.md, 'Batches run in blocks')."""


class Runnable:
    """What runs a validated feed: a CompiledModel or a LibraryModel."""

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]: ...


@dataclass(frozen=True)
class Blocked:
    """``model``, compiled for ``BLOCK`` samples, run over a batch of any size.
    ``aligned``: inputs whose code is laid out for where their data starts, copied to
    fresh storage for each block (a slice would start elsewhere)."""

    plan: BatchPlan
    model: Runnable
    aligned: frozenset[str] = frozenset()

    def samples(self, feed: Mapping[str, np.ndarray]) -> int:
        """The batch size of ``feed`` (validated: every batched input agrees)."""
        for name, batch in self.plan.inputs.items():
            if batch is not None:
                return feed[name].shape[batch.axis] // batch.factor
        raise AssertionError("a plan has a batched input")

    def run(self, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        total = self.samples(feed)
        if total == BLOCK:
            return self.model.run(feed)
        direct = self._direct(feed, total)
        if direct is not None:
            return direct
        results: dict[str, np.ndarray] = {}
        for start in range(0, total, BLOCK):
            part = self.model.run(self.block_feed(feed, start))
            if not results:
                results = {n: _full(a, self.plan.outputs[n], total) for n, a in part.items()}
            for name, array in part.items():
                batch = self.plan.outputs[name]
                if batch is not None:
                    _split(results[name], batch)[_rows(batch, start)] = _split(array, batch)
        return results

    def _direct(self, feed: Mapping[str, np.ndarray], total: int) -> dict | None:
        """The outputs, computed by the native code sample by sample on the inputs' and
        outputs' own storage, where every sample's data is contiguous in it (at more than
        one thread, a group of samples per thread: runtime/side_by_side.py); else None
        (run block by block through copies)."""
        model = self.model
        if not isinstance(model, CompiledModel) or model.copies_outputs or self.aligned:
            return None
        arrays: dict[str, tuple[np.ndarray, int]] = {}
        for name, array in feed.items():
            batch = self.plan.inputs[name]
            if batch is not None and not _contiguous(array.shape, batch):
                return None
            arrays[name] = (array, array.nbytes // total if batch is not None else 0)
        results = {}
        for port in model.abi.outputs:
            batch = self.plan.outputs.get(port.name)
            if port.name in results:
                continue
            if batch is None or not _contiguous(port.shape, batch):
                return None
            shape = list(port.shape)
            shape[batch.axis] *= total
            results[port.name] = aligned_empty(tuple(shape), np.dtype(port.dtype))
            arrays[port.name] = (results[port.name], results[port.name].nbytes // total)
        model.run_samples(arrays, total, model.threads)
        return results

    def block_feed(self, feed: Mapping[str, np.ndarray], start: int) -> dict[str, np.ndarray]:
        """The inputs of the block of samples from ``start``: C-contiguous slices."""
        block = {}
        for name, array in feed.items():
            batch = self.plan.inputs[name]
            if batch is None:
                block[name] = array
                continue
            part = _block_of(array, batch, start)
            if name in self.aligned or not part.flags.c_contiguous:
                part = _copy(part)
            block[name] = part
        return block

    @property
    def abi(self):
        """The one-sample code's ABI (its ports have one sample's shapes)."""
        return self.model.abi

    @property
    def tuned(self) -> tuple[str, ...]:
        return getattr(self.model, "tuned", ())

    @property
    def cached(self) -> bool:
        return getattr(self.model, "cached", False)

    def memory(self):
        """The one-sample code's memory: the same for every batch size."""
        return self.model.memory()

    def kernel_profile(self):
        return self.model.kernel_profile()

    def reset_profile(self) -> None:
        self.model.reset_profile()


def _contiguous(shape: Sequence[int], batch: Batched) -> bool:
    """Whether each sample's data is one run of ``shape``'s row-major storage."""
    return batch.outer == 1 and all(d == 1 for d in shape[: batch.axis])


def plan_along(
    symbol: str,
    inputs: Sequence[Value],
    shapes: Mapping[str, tuple],
    specialise: Callable[[Mapping[str, tuple]], Graph],
) -> BatchPlan | str:
    """The plan for running a model in blocks along ``symbol``, its other dims as in
    ``shapes`` (``specialise`` loads the model's graph for given input shapes, duplicates
    not merged, so that names agree), or why it cannot run so."""
    names = [v.name for v in inputs]
    graphs = []
    for size in (symbol, *SIZES):
        sized = resized(inputs, shapes, symbol, size)
        try:
            graphs.append(specialise(dict(zip(names, sized, strict=True))))
        except PolyonnxError as exc:  # e.g. a Reshape target valid at one batch size only
            return f"the model does not load at {size} samples: {exc}"
    try:
        return batch_plan(symbol, graphs[0], (graphs[1], graphs[2], graphs[3]))
    except NotBatched as exc:
        return str(exc)


def resized(inputs: Sequence[Value], shapes: Mapping, symbol: str, size: int | str | None) -> tuple:
    """The input shapes of ``shapes`` (arrays or shapes, by name) with the dims of
    ``symbol`` made ``size`` (the symbol itself: left symbolic)."""
    return tuple(
        tuple(
            size if d == symbol else n for d, n in zip(v.shape, _shape(shapes[v.name]), strict=True)
        )
        for v in inputs
    )


def _shape(given) -> tuple:
    return tuple(given.shape) if isinstance(given, np.ndarray) else tuple(given)


@dataclass(frozen=True)
class BatchOf:
    """What the symbolic dims of a model's inputs are, for a library or a tuning session."""

    graph: Graph
    """The model's graph at the given input shapes."""
    symbols: tuple[str, ...]
    """The symbolic dims left, in the order inputs first give them."""
    plan: BatchPlan | None
    """How it runs in blocks, where one symbol is left and it is a batch."""
    why: str
    """Why there is no plan (empty where there is, or no symbol is left)."""
    one_sample: dict[str, tuple[int, ...]] | None
    """The input shapes of one sample of the plan."""


def batch_of(model, input_shapes: Mapping[str, Sequence[int]] | None = None) -> BatchOf:
    """Whether the one symbolic dim that ``input_shapes`` leaves of ``model``'s inputs is
    a batch: the plan of its blocks and one sample's input shapes, or why not."""
    from polyonnx.frontend.load import load_graph
    from polyonnx.krnl.lower import supported_ops

    def specialise(shapes, merge=False):
        return load_graph(model, supported_ops=supported_ops(), input_shapes=shapes, merge=merge)

    graph = specialise(input_shapes, merge=True)
    symbols = tuple(dict.fromkeys(d for v in graph.inputs for d in v.shape if isinstance(d, str)))
    if len(symbols) != 1:
        why = f"{len(symbols)} symbolic dims are left, blocks run along one" if symbols else ""
        return BatchOf(graph, symbols, None, why, None)
    shapes = {v.name: v.shape for v in graph.inputs}
    plan = plan_along(symbols[0], graph.inputs, shapes, specialise)
    if isinstance(plan, str):
        return BatchOf(graph, symbols, None, f"{symbols[0]!r} is not a batch: {plan}", None)
    one = resized(graph.inputs, shapes, symbols[0], 1)
    return BatchOf(graph, symbols, plan, "", dict(zip(shapes, one, strict=True)))


def one_sample_shapes(
    model, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> dict[str, tuple[int, ...]] | None:
    """The input shapes of one sample of ``model``, where the one symbolic dim that
    ``input_shapes`` leaves is a batch (what a session compiles and runs in blocks, so
    what tuning measures); None where none or more are left, or it is not a batch."""
    return batch_of(model, input_shapes).one_sample


def first_block(plan: BatchPlan, feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The first block's inputs, every batched one in fresh aligned storage (so that code
    laid out for where an input starts is laid out for where every block's copy does)."""
    block = {}
    for name, array in feed.items():
        batch = plan.inputs[name]
        block[name] = array if batch is None else _copy(_block_of(array, batch, 0))
    return block


def _block_of(array: np.ndarray, batch: Batched, start: int) -> np.ndarray:
    """The samples ``start`` to ``start + BLOCK`` of ``array`` (a view where it can be)."""
    part = _split(array, batch)[_rows(batch, start)]
    shape = list(array.shape)
    shape[batch.axis] = BLOCK * batch.factor
    return part.reshape(shape)


def _split(array: np.ndarray, batch: Batched) -> np.ndarray:
    """A view of ``array`` with the batch's axis split into (outer, samples x rows)."""
    shape, axis = array.shape, batch.axis
    return array.reshape((*shape[:axis], batch.outer, -1, *shape[axis + 1 :]))


def _rows(batch: Batched, start: int) -> tuple[slice, ...]:
    """Samples ``start`` to ``start + BLOCK`` of an array ``_split`` along ``batch``."""
    rows = slice(start * batch.rows, (start + BLOCK) * batch.rows)
    return (slice(None),) * (batch.axis + 1) + (rows,)


def _full(part: np.ndarray, batch: Batched | None, total: int) -> np.ndarray:
    """The output for ``total`` samples, of which ``part`` is the first block's."""
    if batch is None:
        return part
    shape = list(part.shape)
    shape[batch.axis] = total * batch.factor
    return aligned_empty(tuple(shape), part.dtype)


def _copy(part: np.ndarray) -> np.ndarray:
    out = aligned_empty(part.shape, part.dtype)
    out[...] = part
    return out
