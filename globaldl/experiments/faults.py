"""Kill and revive devices during a run, when its output reaches each fault's trigger line."""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from globaldl.experiments.spec import Fault
from globaldl.fleet.fleet import Fleet


class FaultInjector:
    """Kills and revives devices during a run when its output reaches the faults' triggers."""

    POLL_SECONDS = 0.2

    def __init__(
        self,
        faults: Sequence[Fault],
        log_path: Path,
        fleet: Fleet,
        prefix: str,
        process: subprocess.Popen[bytes],
    ) -> None:
        self.faults = list(faults)
        self.log_path = log_path
        self.fleet = fleet
        self.prefix = prefix
        self.process = process
        self.done: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="faults", daemon=True)

    def start(self) -> None:
        """Watch the run's output in the background."""
        self._thread.start()

    def stop(self) -> list[dict[str, Any]]:
        """Stop watching; return what was done: action, device, and unix times."""
        self._stop.set()
        self._thread.join(timeout=120)
        return self.done

    def _run(self) -> None:
        position = 0
        for fault in self.faults:
            pattern = re.compile(fault.after_line)
            while True:
                if self._stop.is_set() or self.process.poll() is not None:
                    return
                text = self.log_path.read_bytes()[position:].decode(errors="replace")
                match = pattern.search(text)
                if match:
                    position += len(text[: match.end()].encode())
                    break
                time.sleep(self.POLL_SECONDS)
            if self._stop.wait(fault.delay_seconds):
                return
            name = f"{self.prefix}-{fault.device}"
            record: dict[str, Any] = {"action": fault.action, "device": name, "at": time.time()}
            try:
                outcome = getattr(self.fleet, fault.action)(name)
                if outcome is not None:  # a measurement
                    record["result"] = outcome
            except Exception as error:  # recorded; the run's own outcome tells the rest
                record["error"] = str(error)
            record["done_at"] = time.time()
            self.done.append(record)
