"""Waiting for a quiet process before a timed run.

After a parallel run, a runtime's idle worker threads spin for a while on the cores the
next contender's threads need: onnxruntime's for about 60 ms (a whole core, measured
after light SqueezeNet on 2 threads), OpenBLAS's likewise, polyonnx's pool for ~2 ms. A
2-thread run started in that window runs at about its 1-thread speed. Timing code calls
``wait_until_quiet()`` before each contender's turn (the tuner's model latency, and every
benchmark of perf/).
"""

from __future__ import annotations

import time

WINDOW_S = 0.005
BUSY_SHARE = 0.25
LIMIT_S = 0.5


def wait_until_quiet(
    window: float = WINDOW_S, share: float = BUSY_SHARE, limit: float = LIMIT_S
) -> bool:
    """Sleep until the process's threads use under ``share`` of a core over ``window``
    seconds; False if they still did after ``limit`` seconds."""
    deadline = time.perf_counter() + limit
    while True:
        cpu, wall = time.process_time(), time.perf_counter()
        time.sleep(window)
        if time.process_time() - cpu < share * (time.perf_counter() - wall):
            return True
        if time.perf_counter() > deadline:
            return False
