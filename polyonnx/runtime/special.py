"""An optional tier of code specialised to chosen sizes of a symbolic dim, compiled in
the background: ``InferenceSession(..., specialize={"N": [8, 16]})``.

A session that runs a batch in blocks (runtime/blocks.py) needs no compile per size. Where
code specialised to a size is faster (small models, whose samples are too small to fill a
kernel: docs/measurements.md, 'Batches run in blocks'), a run at a chosen size starts its
compile in a thread and goes on in blocks; the runs after it is ready use it. So no run
waits for a compile.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from polyonnx.aligned import aligned_empty
from polyonnx.errors import ArgumentError, PolyonnxError, describe


def specialize_argument(value: object) -> dict[str, frozenset[int]]:
    """``specialize`` checked: None or a mapping of dim names to sizes (ints >= 1)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ArgumentError(
            f"specialize must map symbolic dim names to lists of sizes, given {describe(value)}"
        )
    checked = {}
    for name, sizes in value.items():
        ok = isinstance(name, str) and isinstance(sizes, Sequence) and not isinstance(sizes, str)
        if not ok or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in sizes
        ):
            raise ArgumentError(
                f"specialize[{name!r}] must be a list of sizes (ints >= 1), given {describe(sizes)}"
            )
        checked[name] = frozenset(sizes)
    return checked


class Specialised:
    """Specialisations compiled in background threads, by feed shapes."""

    def __init__(self, compile_one: Callable[[Mapping[str, np.ndarray]], object]):
        self._compile_one = compile_one
        self._ready: dict[tuple, object] = {}
        self._threads: dict[tuple, threading.Thread] = {}
        self.errors: dict[tuple, str] = {}
        """Shapes whose compile failed, and why (their runs go on in blocks)."""

    def get(self, shapes: tuple):
        """The specialisation of ``shapes`` if it is ready, else None."""
        return self._ready.get(shapes)

    def start(self, feed: Mapping[str, np.ndarray]) -> None:
        """Compile for ``feed``'s shapes in a thread, unless that was started already."""
        shapes = tuple(array.shape for array in feed.values())
        if shapes in self._threads:
            return
        stand_in = {name: aligned_empty(a.shape, a.dtype) for name, a in feed.items()}
        thread = threading.Thread(target=self._run, args=(shapes, stand_in), daemon=True)
        self._threads[shapes] = thread
        thread.start()

    def _run(self, shapes: tuple, feed: Mapping[str, np.ndarray]) -> None:
        try:
            compiled = self._compile_one(feed)
        except PolyonnxError as exc:
            self.errors[shapes] = str(exc)
            return
        if getattr(compiled, "abi", None) is not None and compiled.abi.input_offsets:
            self.errors[shapes] = "its code is laid out for where an input starts"
            return
        self._ready[shapes] = compiled

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the compiles started; whether all have finished."""
        for thread in list(self._threads.values()):
            thread.join(timeout)
        return not any(t.is_alive() for t in self._threads.values())
