"""A finished epoch's iterator is destroyed on the release thread, not the caller's."""

from __future__ import annotations

import threading
import time

from globaldl.pipelines.release import THREAD_NAME, release_in_background


class SlowToDestroy:
    """Stands in for a tf.data iterator whose destruction waits (0.5 s here)."""

    def __init__(self, destroyed: list[str], done: threading.Event) -> None:
        self.destroyed, self.done = destroyed, done

    def __del__(self) -> None:
        time.sleep(0.5)
        self.destroyed.append(threading.current_thread().name)
        self.done.set()


def test_the_callers_thread_does_not_wait_for_the_destruction():
    destroyed: list[str] = []
    done = threading.Event()
    holder = [SlowToDestroy(destroyed, done)]
    started = time.perf_counter()
    release_in_background(holder)
    assert time.perf_counter() - started < 0.2
    assert done.wait(timeout=10)
    assert destroyed == [THREAD_NAME]
    assert holder == []


def test_a_release_after_the_thread_went_idle_starts_it_again():
    from globaldl.pipelines import release

    destroyed: list[str] = []
    first, second = threading.Event(), threading.Event()
    release_in_background([SlowToDestroy(destroyed, first)])
    assert first.wait(timeout=10)
    # The thread ends once it has waited IDLE_SECONDS for more.
    deadline = time.monotonic() + 10
    while release._worker is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert release._worker is None
    release_in_background([SlowToDestroy(destroyed, second)])
    assert second.wait(timeout=10)
    assert destroyed == [THREAD_NAME, THREAD_NAME]
