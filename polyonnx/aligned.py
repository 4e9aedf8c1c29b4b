"""Arrays whose data starts on a cache line, for native code to read and write.

numpy aligns big arrays to 16 bytes only. A GEMM's 16-float tile rows of C (and B read in
place) then straddle two cache lines at every vector load and store. The arena, the output
arrays a model allocates and its constants start at ALIGN bytes instead, which measured
faster for both outputs and constants (docs/measurements.md, '64-byte aligned arrays').
"""

from __future__ import annotations

import numpy as np

ALIGN = 64
"""Bytes: a cache line."""


def aligned_empty(shape: tuple[int, ...], dtype) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts at an ALIGN-byte boundary:
    a view of a bigger byte array (its ``base``)."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(size + ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start : start + size].view(dtype).reshape(shape)


def aligned(array: np.ndarray) -> np.ndarray:
    """``array`` if it is C-contiguous and starts at ALIGN bytes, else a copy that does
    (read-only if ``array`` is); arrays of strings or objects, which no byte view can
    hold, only made contiguous."""
    array = np.asarray(array)
    if array.dtype.kind not in "biufc":
        # (ascontiguousarray would make 0-d arrays 1-d)
        return array if array.flags.c_contiguous else array.copy(order="C")
    if array.flags.c_contiguous and (array.size == 0 or array.ctypes.data % ALIGN == 0):
        return array
    copy = aligned_empty(array.shape, array.dtype)
    copy[...] = array
    copy.flags.writeable = array.flags.writeable
    return copy
