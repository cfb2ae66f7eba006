"""Scrape each device's globaldl exporter during a run: CPU, memory and network per device.

The numbers are globaldl's own monitoring: the psutil readings that every worker's exporter
serves (globaldl.monitoring.resources), read over HTTP from the host while the run lasts, the
way Prometheus would. From the first and the last scrape of a device:

* CPU: the worker process's CPU seconds (`globaldl_process_cpu_seconds_total`) over the window,
  as a share of the device's CPU quota. The exporter's `globaldl_device_cpu_utilization_ratio`
  is not used: psutil reads /proc/stat, which is machine-wide, not per emulated device.
* Memory: the worker's resident memory (`globaldl_process_resident_memory_bytes`), peak and
  mean over the scrapes. `globaldl_device_memory_used_bytes` is machine-wide for the same reason.
* Network: the device's bytes sent and received (`globaldl_device_network_*_bytes_total`);
  psutil reads /proc/net/dev, which IS per network namespace, so these are the device's own
  (eth0 and loopback). They include the scrape responses, counted separately.
* Steady traffic: the bytes sent from the first scrape after the first step to the first scrape
  that saw the last step, less the scrape responses inside that window, over the steps made in
  it. The model's initial broadcast (before the first step) and the run's end are outside it;
  the scrapes' own HTTP and TCP headers are not (one scrape a second by default).
"""

from __future__ import annotations

import gzip
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

CPU_SECONDS = "globaldl_process_cpu_seconds_total"
RESIDENT_MEMORY_BYTES = "globaldl_process_resident_memory_bytes"
TRANSMIT_BYTES = "globaldl_device_network_transmit_bytes_total"
RECEIVE_BYTES = "globaldl_device_network_receive_bytes_total"
STEPS = "globaldl_steps_total"
_WANTED = (CPU_SECONDS, RESIDENT_MEMORY_BYTES, TRANSMIT_BYTES, RECEIVE_BYTES, STEPS)
# Scrapes come every ~1 s; a rate over a window under half of that is mostly timing noise.
MIN_RATE_WINDOW_SECONDS = 0.5


def parse_exposition(text: str) -> dict[str, float]:
    """The samples globaldl's resource table needs, from one Prometheus text exposition."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in _WANTED:
                values[sample.name] = float(sample.value)
    return values


@dataclass(frozen=True)
class Scrape:
    """One scrape of one exporter: when (monotonic seconds), what it said, how big it was."""

    seconds: float
    values: Mapping[str, float]
    response_bytes: int


@dataclass
class DeviceScrapes:
    """Every successful scrape of one device's exporter, oldest first."""

    device: str
    url: str
    scrapes: list[Scrape] = field(default_factory=list)
    errors: int = 0

    def resources(self, cpu_cores: float) -> DeviceResources | None:
        """CPU, memory and network over the scraped window; None without any scrape."""
        usable = [s for s in self.scrapes if all(name in s.values for name in _WANTED[:4])]
        if not usable:
            return None
        first, last = usable[0], usable[-1]
        window_seconds = last.seconds - first.seconds
        cpu_seconds = last.values[CPU_SECONDS] - first.values[CPU_SECONDS]
        memory = [s.values[RESIDENT_MEMORY_BYTES] for s in usable]
        steady_steps, steady_bytes = _steady_traffic(usable)
        return DeviceResources(
            device=self.device,
            scrapes=len(usable),
            window_seconds=window_seconds,
            steps=int(last.values.get(STEPS, 0) - first.values.get(STEPS, 0)),
            cpu_seconds=cpu_seconds,
            cpu_percent_of_device=(
                100 * cpu_seconds / (window_seconds * cpu_cores) if window_seconds > 0 else None
            ),
            resident_memory_peak_bytes=max(memory),
            resident_memory_mean_bytes=sum(memory) / len(memory),
            network_transmit_bytes=last.values[TRANSMIT_BYTES] - first.values[TRANSMIT_BYTES],
            network_receive_bytes=last.values[RECEIVE_BYTES] - first.values[RECEIVE_BYTES],
            # A response leaves after the reading it carries: the window's counters hold the
            # responses of every scrape but the last.
            scrape_response_bytes=sum(s.response_bytes for s in usable[:-1]),
            network_transmit_peak_bits_per_second=_peak_rate(usable, TRANSMIT_BYTES),
            steady_steps=steady_steps,
            steady_transmit_bytes=steady_bytes,
        )


def _steady_traffic(scrapes: list[Scrape]) -> tuple[int | None, float | None]:
    """Steps and bytes sent between the first scrape after step 1 and the first at the last step.

    (None, None) when fewer than two steps fall in that window.
    """
    steps = [int(scrape.values.get(STEPS, 0)) for scrape in scrapes]
    started = next((index for index, count in enumerate(steps) if count >= 1), None)
    if started is None:
        return None, None
    ended = steps.index(max(steps))
    if steps[ended] - steps[started] < 2:
        return None, None
    sent = scrapes[ended].values[TRANSMIT_BYTES] - scrapes[started].values[TRANSMIT_BYTES]
    # As in resources(): the responses of the window's scrapes but its last are in the counters.
    responses = sum(scrape.response_bytes for scrape in scrapes[started:ended])
    return steps[ended] - steps[started], sent - responses


def _peak_rate(scrapes: list[Scrape], counter: str) -> float | None:
    """The highest rate of `counter` (bytes) between two consecutive scrapes, in bit/s.

    Scrapes closer than half the scrape interval are skipped: a late and an early scrape would
    make a short window and an inflated rate.
    """
    rates = [
        (later.values[counter] - earlier.values[counter]) * 8 / (later.seconds - earlier.seconds)
        for earlier, later in zip(scrapes, scrapes[1:], strict=False)
        if later.seconds - earlier.seconds >= MIN_RATE_WINDOW_SECONDS
    ]
    return max(rates, default=None)


@dataclass(frozen=True)
class DeviceResources:
    """One device's resources during a run, from its exporter (see the module docstring).

    `cpu_percent_of_device` is None when the window is too short (a single scrape).
    `scrape_response_bytes` is what the scrapes inside the window made the device send.
    """

    device: str
    scrapes: int
    window_seconds: float
    steps: int
    cpu_seconds: float
    cpu_percent_of_device: float | None
    resident_memory_peak_bytes: float
    resident_memory_mean_bytes: float
    network_transmit_bytes: float
    network_receive_bytes: float
    scrape_response_bytes: int
    # The device's busiest window between two scrapes: what its link delivered at best.
    network_transmit_peak_bits_per_second: float | None = None
    # The steady window (module docstring): steps made in it, bytes sent less the scrapes'.
    steady_steps: int | None = None
    steady_transmit_bytes: float | None = None

    @property
    def steady_transmit_bytes_per_step(self) -> float | None:
        """What the device sent per step in the steady window; None without one."""
        if self.steady_steps is None or self.steady_transmit_bytes is None:
            return None
        return self.steady_transmit_bytes / self.steady_steps

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return dict(self.__dict__)


class ExporterScraper:
    """Scrape a set of exporters every `interval_seconds` from a background thread.

    Example:
        >>> with ExporterScraper({"gdlx-1": "http://10.78.0.2:9400/metrics"}) as scraper:
        ...     run_training()                                        # doctest: +SKIP
        >>> scraper.devices["gdlx-1"].resources(cpu_cores=0.5)        # doctest: +SKIP

    """

    def __init__(
        self,
        urls: Mapping[str, str],
        interval_seconds: float = 1.0,
        request_timeout_seconds: float = 2.0,
    ) -> None:
        if not interval_seconds > 0:
            raise ValueError(f"interval_seconds must be > 0, got {interval_seconds!r}")
        self.interval_seconds = interval_seconds
        self.request_timeout_seconds = request_timeout_seconds
        self.devices = {name: DeviceScrapes(name, url) for name, url in urls.items()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="exporter-scraper", daemon=True)

    def __enter__(self) -> ExporterScraper:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start scraping in the background."""
        self._thread.start()

    def stop(self) -> None:
        """Stop scraping and wait for the thread (bounded)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.request_timeout_seconds * len(self.devices) + 5)

    def scrape_once(self) -> None:
        """Scrape every exporter once.

        An unreachable one (not started yet, or already gone) counts an error.
        """
        for device in self.devices.values():
            # gzip shrinks the ~25 kB exposition (phase histograms) about sevenfold: the scrapes
            # share the device's shaped uplink with the training they measure.
            request = urllib.request.Request(device.url, headers={"Accept-Encoding": "gzip"})
            try:
                with urllib.request.urlopen(
                    request, timeout=self.request_timeout_seconds
                ) as response:
                    body = response.read()
                    compressed = response.headers.get("Content-Encoding") == "gzip"
                text = (gzip.decompress(body) if compressed else body).decode(
                    "utf-8", errors="replace"
                )
            except (urllib.error.URLError, OSError, ValueError, EOFError):
                device.errors += 1
                continue
            values = parse_exposition(text)
            device.scrapes.append(Scrape(time.monotonic(), values, len(body)))

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.scrape_once()
            self._stop.wait(max(0.0, self.interval_seconds - (time.monotonic() - started)))
