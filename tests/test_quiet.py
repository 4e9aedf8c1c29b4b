"""wait_until_quiet: a timed run starts once the process's other threads stop using CPU."""

from __future__ import annotations

import threading
import time

from polyonnx.quiet import wait_until_quiet


def _spin(seconds: float) -> tuple[threading.Thread, float]:
    """A thread that keeps a core busy for ``seconds``; returns it and when it stops."""
    stop = time.perf_counter() + seconds
    started = threading.Event()

    def busy() -> None:
        started.set()
        while time.perf_counter() < stop:
            pass

    thread = threading.Thread(target=busy, daemon=True)
    thread.start()
    started.wait()
    return thread, stop


def test_waits_for_a_spinning_thread_to_stop():
    # a window of 30 ms, not 5: under the suite's other workers the spinning thread once
    # got no CPU for a whole 5 ms window (3 runnable threads on 2 cores get about 2/3 of
    # a core each over 30 ms, far above the quarter that counts as busy)
    thread, stop = _spin(0.15)
    assert wait_until_quiet(window=0.03, limit=5.0)
    assert time.perf_counter() >= stop
    thread.join()


def test_gives_up_after_the_limit():
    # windows of 30 ms, as above: under the suite's other workers a 5 ms window could
    # catch the spinning thread without a core and call the process quiet
    thread, _ = _spin(1.0)
    begin = time.perf_counter()
    assert not wait_until_quiet(window=0.03, limit=0.2)
    assert time.perf_counter() - begin < 0.6
    thread.join()


def test_an_idle_process_starts_at_once():
    begin = time.perf_counter()
    assert wait_until_quiet()
    assert time.perf_counter() - begin < 0.2
