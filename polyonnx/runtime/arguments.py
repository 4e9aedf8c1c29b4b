"""Checks of the arguments a session is created with, done up front so that a bad one
fails with an error naming it, what was expected and what was given, never deep inside
(a TypeError from ``os.fspath``, a silent cache in the working directory)."""

from __future__ import annotations

import argparse
import operator
import os
from collections.abc import Mapping

import numpy as np

from polyonnx.errors import ArgumentError, InputError, ModelError, describe

MAX_THREADS = 4096
"""The most threads a session accepts. The worker pool starts at most emit/pool.py's
MAX_WORKERS anyway; a count past this is a mistake (and past 2**31 it would wrap in the
native ``int32`` the runtime hands the models), not a request."""

PathOption = str | os.PathLike | bool | None


def thread_count(threads: object) -> int:
    """``threads``, checked: a positive int (numpy's too, never a bool), or None for one
    thread per core."""
    if threads is None:
        return os.cpu_count() or 1
    if isinstance(threads, bool | np.bool_) or not isinstance(threads, int | np.integer):
        hint = ""
        if type(threads).__name__ == "SessionOptions":
            hint = " (polyonnx's second argument is the thread count, not SessionOptions)"
        raise ArgumentError(
            f"threads must be a positive int or None (one per core), given "
            f"{describe(threads)}{hint}"
        )
    count = operator.index(threads)
    if not 1 <= count <= MAX_THREADS:
        raise ArgumentError(
            f"threads must be between 1 and {MAX_THREADS} (or None: one per core), given {count}"
        )
    return count


def flag(name: str, value: object) -> bool:
    """``value`` as a bool; anything but True, False (numpy's too) is refused, so that
    ``profile="no"`` does not switch profiling on."""
    if not isinstance(value, bool | np.bool_):
        raise ArgumentError(f"{name} must be True or False, given {describe(value)}")
    return bool(value)


def path_option(name: str, value: object, *, directory: bool) -> PathOption:
    """``value`` of an option that takes True, False, None or a path: checked that a path
    is a non-empty str or os.PathLike, and (``directory``) that it is not a file, or (not
    ``directory``) not a directory."""
    if value is None or isinstance(value, bool):
        return value
    if not isinstance(value, str | os.PathLike):
        raise ArgumentError(
            f"{name} must be True, False, None or a path (str or os.PathLike), "
            f"given {describe(value)}"
        )
    path = os.fspath(value)
    if not isinstance(path, str) or not path or "\0" in path:
        raise ArgumentError(f"{name} must be a non-empty path, given {describe(value)}")
    if directory and os.path.exists(path) and not os.path.isdir(path):
        raise ArgumentError(f"{name} must name a directory, and {path!r} is a file")
    if not directory and os.path.isdir(path):
        raise ArgumentError(f"{name} must name a file, and {path!r} is a directory")
    return value


def model_argument(model: object) -> None:
    """Refuse, as ModelError, a model argument of no type polyonnx reads, and a path that
    names a directory (os's "not found" would mislead)."""
    import onnx

    from polyonnx.program import Program

    if isinstance(model, bytes | bytearray | memoryview | onnx.ModelProto | Program):
        return
    if not isinstance(model, str | os.PathLike):
        raise ModelError(
            "the model must be a path (str or os.PathLike), bytes, an onnx.ModelProto, a "
            f"polyonnx.Program or a library of polyonnx compile; given {describe(model)}"
        )
    path = os.fspath(model)
    if not isinstance(path, str) or not path or "\0" in path:
        raise ModelError(f"the model path must be a non-empty str, given {describe(model)}")
    if os.path.isdir(path):
        raise ModelError(f"the model path {path!r} is a directory, not an ONNX model file")


def keywords(given: Mapping[str, object], accepted: Mapping[str, str]) -> None:
    """Refuse keywords not in ``accepted`` (name -> what it is), listing those accepted."""
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        listed = ", ".join(f"{k} ({what})" for k, what in accepted.items())
        raise ArgumentError(f"unknown keyword argument(s) {unknown}; accepted: {listed}")


def input_shapes(shapes: object) -> dict[str, list[int]] | None:
    """``input_shapes`` checked: None, or a mapping of input name (str) to a list or tuple
    (or 1-D integer array) of non-negative int dims; InputError naming the entry if not."""
    if shapes is None:
        return None
    if not isinstance(shapes, Mapping):
        raise InputError(
            f"input_shapes must be a dict of input name -> dims, given {describe(shapes)}"
        )
    checked = {}
    for name, dims in shapes.items():
        if not isinstance(name, str):
            raise InputError(f"input_shapes: input names must be str, given {describe(name)}")
        if isinstance(dims, np.ndarray) and dims.ndim == 1:
            dims = dims.tolist()
        if not isinstance(dims, list | tuple) or not all(_is_dim(d) for d in dims):
            raise InputError(
                f"input_shapes[{name!r}] must be a list of non-negative int dims, "
                f"given {describe(dims)}"
            )
        checked[name] = [int(d) for d in dims]
    return checked


def _is_dim(dim: object) -> bool:
    return isinstance(dim, int | np.integer) and not isinstance(dim, bool) and dim >= 0


# argparse types of the command lines (polyonnx/cli.py, tune/cli.py)


def positive_int(text: str) -> int:
    """argparse's type of counts (--repeat, --runs, --top)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def thread_arg(text: str) -> int:
    """argparse's type of --threads: a positive integer, at most MAX_THREADS."""
    value = positive_int(text)
    if value > MAX_THREADS:
        raise argparse.ArgumentTypeError(f"expected at most {MAX_THREADS} threads, got {text!r}")
    return value


def seed_int(text: str) -> int:
    """argparse's type of --seed: numpy takes non-negative seeds only."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}")
    return value


def shape_arg(text: str) -> tuple[str, list[int]]:
    """argparse's type of --shape NAME=D0,D1,... (non-negative int dims; NAME= is rank 0)."""
    name, sep, dims = text.partition("=")
    try:
        shape = [int(d) for d in dims.split(",")] if dims else []
    except ValueError:
        shape = None
    if not sep or not name or shape is None or any(d < 0 for d in shape):
        raise argparse.ArgumentTypeError(
            f"expected NAME=D0,D1,... with non-negative integer dims, got {text!r}"
        )
    return name, shape
