"""The build's fourth Horovod edit: telling rank 0 of a host change cannot stall the driver.

Horovod's elastic driver notifies rank 0's worker while it holds the lock every re-formation
waits for; when rank 0's device has vanished, the connect hangs (on the fleet: ~400 s). The
driver object here is a stand-in holding only what the notification reads, and the client a
stand-in that blocks like that connect: the method under test is the installed Horovod's own.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from horovod.runner.elastic.driver import ElasticDriver


def test_notifying_an_unreachable_rank_0_returns_at_once_and_still_notifies() -> None:
    reached, release = threading.Event(), threading.Event()

    class VanishedCoordinator:
        def notify_hosts_updated(self, timestamp: float, update_res: int) -> None:
            reached.set()
            release.wait(30)  # a connect to a vanished device: ~127 s per attempt on Linux

    coordinator = SimpleNamespace(hostname="10.78.0.3", local_rank=0)
    driver = SimpleNamespace(
        _min_num_proc=1,
        _verbose=0,
        host_assignments={"10.78.0.3": [coordinator]},
        _get_host_assignments=lambda hosts: ({"10.78.0.2": []}, []),
        get_coordinator_info=lambda: coordinator,
        get_worker_client=lambda slot: VanishedCoordinator(),
    )
    driver._notify_coordinator = lambda *args: ElasticDriver._notify_coordinator(driver, *args)
    hosts = SimpleNamespace(count_available_slots=lambda: 2)
    started = time.monotonic()
    try:
        ElasticDriver._notify_workers_host_changes(driver, hosts, 1)
        assert time.monotonic() - started < 1.0
        assert reached.wait(5), "rank 0 was never notified"
    finally:
        release.set()
