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
    program = lower_model(model, input_shapes)
    host = target is None or target == host_target()
    schedules, _ = model_schedules(program, None if host else target, records)
    target = target or host_target()
    native = emit_program(program, schedules, target, profile=False, checks=checks)
    return write_library(native.model, target, directory, name, default_threads)


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
        for fn, (restype, argtypes) in _SIGNATURES.items():
            self._fn[fn].restype, self._fn[fn].argtypes = restype, argtypes
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
        return Port(name, dtype, tuple(int(dims[d]) for d in range(rank)), i)

    def memory(self):
        """Not reported by a library's API."""
        return None

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Inputs must be C-contiguous arrays; the library checks their dims again."""
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
                array = results[port.name] = aligned_empty(port.shape, port.dtype)
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
}
"""The C API's functions (without the NAME_ prefix): return type and argument types."""
