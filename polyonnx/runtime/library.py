"""Compiled models as shared libraries: written by ``polyonnx compile``, loaded back here.

``compile_library`` runs the JIT's pipeline (same schedules, same tuning records) for a
target and writes ``libNAME.so`` and ``NAME.h`` (emit/aot.py). ``LibraryModel`` opens such
a library through its C API with ctypes: no compiling, no llvmlite or islpy at run time,
the library's own checks before native code runs.
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from polyonnx.aligned import aligned_empty
from polyonnx.emit.abi import ONNX_TYPES, Port
from polyonnx.emit.aot import Library, write_library
from polyonnx.errors import InputError, ModelError, RunError
from polyonnx.frontend.batch import BatchPlan
from polyonnx.runtime.blocks import plan_along, resized
from polyonnx.runtime.compiled import emit_program, lower_model, model_schedules
from polyonnx.target import Target, host_target

DTYPES = {number: name for name, number in ONNX_TYPES.items()}
ERROR_RUN = 5
"""NAME_run's status for a bad value met at run time (POLYONNX_ERROR_RUN, capi/header.h)."""
LIBRARY_NAME = re.compile(r"lib([A-Za-z_][A-Za-z0-9_]*)\.so\Z")


def compile_library(
    model,
    directory: str | os.PathLike,
    name: str,
    *,
    target: Target | None = None,
    records=None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    default_threads: int = 0,
    checks: bool = True,
) -> Library:
    """Compile ``model`` for ``target`` (the host by default) into DIR/libNAME.so and
    DIR/NAME.h. ``records`` (tune/apply.py's Records) schedule their kernels on the host,
    as they do for the JIT. ``default_threads``: what NAME_open(0) takes (0: a thread per
    online core). ``checks``: run-time checks of indices and integer divisors
    (runtime/compiled.py's compile_program)."""
    plan, shapes = batch_of(model, input_shapes)
    program = lower_model(model, shapes)
    host = target is None or target == host_target()
    schedules, _ = model_schedules(program, None if host else target, records)
    target = target or host_target()
    native = emit_program(program, schedules, target, profile=False, checks=checks)
    return write_library(native.model, target, directory, name, default_threads, plan)


def batch_of(
    model, input_shapes: Mapping[str, Sequence[int]] | None
) -> tuple[BatchPlan | None, Mapping[str, Sequence[int]] | None]:
    """The batch plan of a model whose one symbolic dim left by ``input_shapes`` is a batch
    (frontend/batch.py), and the input shapes of one sample, which the library is compiled
    for and runs once per sample; (None, ``input_shapes``) for a static model. Any other
    symbolic dims: InputError, saying why they do not run in blocks."""
    from polyonnx.frontend.load import load_graph
    from polyonnx.krnl.lower import supported_ops

    def specialise(shapes):
        return load_graph(model, supported_ops=supported_ops(), input_shapes=shapes)

    graph = specialise(input_shapes)
    if graph.is_static:
        return None, input_shapes
    symbols = list(dict.fromkeys(d for v in graph.inputs for d in v.shape if isinstance(d, str)))
    shapes = {v.name: v.shape for v in graph.inputs}
    why = f"{len(symbols)} symbolic dims are left, a library runs in blocks along one"
    if len(symbols) == 1:
        plan = plan_along(symbols[0], graph.inputs, shapes, specialise)
        if not isinstance(plan, str):
            one = resized(graph.inputs, shapes, symbols[0], 1)
            return plan, dict(zip(shapes, one, strict=True))
        why = f"{symbols[0]!r} is not a batch: {plan}"
    dynamic = {v.name: list(v.shape) for v in graph.inputs if not v.is_static}
    raise InputError(
        f"inputs with symbolic dims need concrete shapes (--shape NAME=D0,D1,...): {dynamic} "
        f"({why})"
    )


def default_name(model) -> str:
    """A library name from the model's file name: a C identifier."""
    stem = Path(os.fspath(model)).stem if isinstance(model, str | os.PathLike) else "model"
    name = re.sub(r"\W", "_", stem, flags=re.ASCII)
    return name if re.match(r"[A-Za-z_]", name) else f"m_{name}"


def library_name(path: str | os.PathLike) -> str:
    """NAME of a path ``.../libNAME.so``."""
    match = LIBRARY_NAME.match(Path(path).name)
    if not match:
        raise ModelError(f"{os.fspath(path)!r} is not named libNAME.so, as polyonnx compile names")
    return match.group(1)


def is_library(model: object) -> bool:
    """Whether ``model`` is a path to a shared library (ELF), not an ONNX file."""
    if not isinstance(model, str | os.PathLike):
        return False
    path = Path(model)
    if path.suffix != ".so" or not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == b"\x7fELF"


class LibraryModel:
    """A library written by ``polyonnx compile``, opened with ``threads`` threads."""

    def __init__(self, path: str | os.PathLike, threads: int, name: str | None = None):
        self.path = Path(path).resolve()
        self.name = name or library_name(path)
        try:
            self._lib = ctypes.CDLL(str(self.path), mode=os.RTLD_LOCAL)
            self._fn = {f: getattr(self._lib, f"{self.name}_{f}") for f in _SIGNATURES}
        except (OSError, AttributeError) as exc:
            message = f"cannot load {str(self.path)!r} as a polyonnx library: {exc}"
            raise ModelError(message) from exc
        for fn in _BATCH_SIGNATURES:  # libraries before batches lack them
            found = getattr(self._lib, f"{self.name}_{fn}", None)
            if found is not None:
                self._fn[fn] = found
        for fn, (restype, argtypes) in {**_SIGNATURES, **_BATCH_SIGNATURES}.items():
            if fn in self._fn:
                self._fn[fn].restype, self._fn[fn].argtypes = restype, argtypes
        symbol = self._fn["batch_name"]() if "batch_name" in self._fn else None
        self.batch: str | None = None if symbol is None else symbol.decode()
        """The symbolic dim of any size (-1 in the library's dims), or None."""
        self.inputs = tuple(self._port("input", i) for i in range(self._fn["input_count"]()))
        self.outputs = tuple(self._port("output", i) for i in range(self._fn["output_count"]()))
        self._session = self._fn["open"](max(int(threads), 1))
        if not self._session:
            raise ModelError(f"{self.name}_open failed: {self._fn['error'](None).decode()}")
        self._inputs = (ctypes.c_void_p * len(self.inputs))()
        self._dims = (ctypes.POINTER(ctypes.c_int64) * len(self.inputs))()
        self._given: list = [None] * len(self.inputs)
        """Dims of inputs not of their declared shape, kept alive while they are passed."""
        self._outputs = (ctypes.c_void_p * len(self.outputs))()
        self._bytes = (ctypes.c_size_t * len(self.outputs))()
        self.tuned: tuple[str, ...] = ()

    def _port(self, kind: str, i: int) -> Port:
        rank = self._fn[f"{kind}_rank"](i)
        dims = self._fn[f"{kind}_dims"](i)
        dtype = DTYPES[self._fn[f"{kind}_type"](i)]
        name = self._fn[f"{kind}_name"](i).decode()
        shape = tuple(int(dims[d]) for d in range(rank))
        if -1 in shape:
            one = kind == "input" or self._one_row(i, rank)
            symbol = self.batch if one else f"?{self.batch}"
            shape = tuple(symbol if d == -1 else d for d in shape)
        return Port(name, dtype, shape, i)

    def _one_row(self, i: int, rank: int) -> bool:
        """Whether output ``i`` has one row a sample on its batch's axis (its extent is the
        batch's size; else its dim is unnamed, as a made-up ``?`` name)."""
        dims = (ctypes.c_int64 * max(rank, 1))()
        self._fn["output_dims_for"](i, 1, dims)
        declared = self._fn["output_dims"](i)
        return all(dims[d] == 1 for d in range(rank) if declared[d] == -1)

    def memory(self):
        """Not reported by a library's API."""
        return None

    def samples(self, inputs: Mapping[str, np.ndarray]) -> int:
        """The batch size ``inputs`` give (1 for a library of no batch); the library checks
        that every input gives the same."""
        for port in self.inputs:
            if self.batch in port.shape:
                return inputs[port.name].shape[port.shape.index(self.batch)]
        return 1

    def output_shape(self, port: Port, samples: int) -> tuple[int, ...]:
        """The shape of output ``port`` for a batch of ``samples``."""
        if all(isinstance(d, int) for d in port.shape):
            return port.shape
        dims = (ctypes.c_int64 * max(len(port.shape), 1))()
        self._fn["output_dims_for"](port.slot, samples, dims)
        return tuple(dims[d] for d in range(len(port.shape)))

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Inputs must be C-contiguous arrays; the library checks their dims again."""
        samples = self.samples(inputs)
        for i, port in enumerate(self.inputs):
            array = inputs[port.name]
            self._inputs[i] = array.ctypes.data
            if array.shape != port.shape:  # the library's own dims pointer, else these
                self._given[i] = (ctypes.c_int64 * max(array.ndim, 1))(*array.shape)
                self._dims[i] = ctypes.cast(self._given[i], ctypes.POINTER(ctypes.c_int64))
            else:
                self._dims[i] = self._fn["input_dims"](i)
        results = {}
        for i, port in enumerate(self.outputs):
            array = results.get(port.name)
            if array is None:
                shape = self.output_shape(port, samples)
                array = results[port.name] = aligned_empty(shape, port.dtype)
            self._outputs[i] = array.ctypes.data
            self._bytes[i] = array.nbytes
        code = self._fn["run"](self._session, self._inputs, self._dims, self._outputs, self._bytes)
        if code:
            message = self._fn["error"](self._session).decode(errors="replace")
            if code == ERROR_RUN:
                raise RunError(message)
            raise InputError(f"{self.name}_run: {message}")
        return results

    def close(self) -> None:
        if getattr(self, "_session", None):
            self._fn["close"](self._session)
            self._session = None

    def __del__(self) -> None:
        self.close()


_P = ctypes.c_void_p
_SIGNATURES = {
    "open": (_P, [ctypes.c_int]),
    "close": (None, [_P]),
    "error": (ctypes.c_char_p, [_P]),
    "input_count": (ctypes.c_int, []),
    "output_count": (ctypes.c_int, []),
    "input_name": (ctypes.c_char_p, [ctypes.c_int]),
    "output_name": (ctypes.c_char_p, [ctypes.c_int]),
    "input_type": (ctypes.c_int, [ctypes.c_int]),
    "output_type": (ctypes.c_int, [ctypes.c_int]),
    "input_rank": (ctypes.c_int, [ctypes.c_int]),
    "output_rank": (ctypes.c_int, [ctypes.c_int]),
    "input_dims": (ctypes.POINTER(ctypes.c_int64), [ctypes.c_int]),
    "output_dims": (ctypes.POINTER(ctypes.c_int64), [ctypes.c_int]),
    "run": (ctypes.c_int, [_P, _P, _P, _P, _P]),
    "run_output_dims": (ctypes.c_int, [_P, ctypes.c_int, _P]),
}
"""The C API's functions (without the NAME_ prefix): return type and argument types."""
_BATCH_SIGNATURES = {
    "batch_name": (ctypes.c_char_p, []),
    "output_dims_for": (ctypes.c_int, [ctypes.c_int, ctypes.c_int64, ctypes.c_void_p]),
}
"""The functions of a library of a batch, which older libraries lack."""
