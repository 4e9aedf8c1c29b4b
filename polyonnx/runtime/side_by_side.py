"""A batch's samples run side by side: ``groups`` of them at once on the worker pool.

Each group has its own copy of the model's slots, with its own arena and error record;
constants are shared. emit/samples.py's pool body runs the groups. Where a sample's code
cannot fill the threads by itself (its parallel loops split little work), this runs the
batch as fast as code specialised to it (docs/measurements.md, 'Samples side by side').
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np

from polyonnx.aligned import ALIGN, aligned_empty
from polyonnx.emit.module import ENTRY
from polyonnx.emit.pool import POOL_RUN
from polyonnx.emit.samples import FIELDS, SAMPLES
from polyonnx.emit.threads import pool_runtime

POOL_TYPE = ctypes.CFUNCTYPE(
    None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int32
)


def pool_available() -> bool:
    """Whether this process has the worker pool (so groups can run at once)."""
    return pool_runtime() is not None


class SideBySide:
    """``groups`` copies of ``model``'s slots (a CompiledModel), each with its own arena
    and error record; the slots of inputs and outputs are set per sample."""

    def __init__(self, model, groups: int, poison: bool):
        abi = model.abi
        self.groups = groups
        self._model = model
        self._arenas = [
            aligned_empty((max(abi.arena_bytes, ALIGN),), np.uint8) for _ in range(groups)
        ]
        if poison:  # as the model's own arena
            for arena in self._arenas:
                arena.fill(0xFF)
        self._errors = np.zeros((groups, 2), np.int64)
        self._slots = (ctypes.c_void_p * (abi.slot_count * groups))()
        jit = pool_runtime()
        self._run = POOL_TYPE(jit.address(POOL_RUN))
        self._body = jit.address(SAMPLES)
        self._entry = model.jit.address(ENTRY)

    def run(self, slots, ports: Sequence[tuple[int, int, int]], count: int):
        """Run ``count`` samples from the model's ``slots``, ``ports`` (slot, the first
        sample's address, step in bytes) moved along; the (site, value) of the first
        failed check of any group, else None."""
        abi = self._model.abi
        n = abi.slot_count
        for g in range(self.groups):
            self._slots[g * n : (g + 1) * n] = slots[:n]
            self._slots[g * n + abi.arena_slot] = self._arenas[g].ctypes.data
            self._slots[g * n + abi.error_slot] = self._errors[g].ctypes.data
        self._errors[:] = 0
        columns = np.array(ports, np.int64).reshape(-1, 3).T.copy()
        values = {
            "entry": self._entry,
            "slots": ctypes.addressof(self._slots),
            "slot_count": n,
            "count": count,
            "groups": self.groups,
            "ports": len(ports),
            "indices": columns[0].ctypes.data,
            "bases": columns[1].ctypes.data,
            "steps": columns[2].ctypes.data,
            "error_slot": abi.error_slot,
        }
        ctx = np.array([values[name] for name in FIELDS], np.int64)
        self._run(self._body, ctx.ctypes.data, 0, self.groups, self.groups)
        failed = np.flatnonzero(self._errors[:, 0])
        if failed.size:
            site, value = self._errors[failed[0]]
            return int(site), int(value)
        return None
