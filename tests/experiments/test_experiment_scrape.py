"""Scraping a real globaldl exporter: resources over the window, gzip, unreachable targets."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Iterator

import pytest

from globaldl.experiments.scrape import (
    CPU_SECONDS,
    RECEIVE_BYTES,
    RESIDENT_MEMORY_BYTES,
    STEPS,
    TRANSMIT_BYTES,
    DeviceScrapes,
    ExporterScraper,
    Scrape,
    parse_exposition,
)
from globaldl.monitoring import PHASES, PrometheusExporter, start_exporter


@pytest.fixture()
def exporter() -> Iterator[PrometheusExporter]:
    observer = start_exporter(port=0, rank=0, device="dev-1", run_id="scrape-test")
    try:
        yield observer
    finally:
        observer.server.close(linger_cap_seconds=0)


def _busy(seconds: float) -> None:
    deadline = time.process_time() + seconds
    while time.process_time() < deadline:
        pass


def test_scraper_turns_two_scrapes_into_cpu_memory_network_and_steps(
    exporter: PrometheusExporter,
) -> None:
    scraper = ExporterScraper({"dev-1": exporter.url}, interval_seconds=0.05)
    scraper.scrape_once()
    _busy(0.3)
    for _ in range(3):
        exporter.observe_step(dict.fromkeys(PHASES, 0.01), 16, 400, 40, 1.0)
    scraper.scrape_once()
    resources = scraper.devices["dev-1"].resources(cpu_cores=1.0)
    assert resources is not None
    assert resources.scrapes == 2 and resources.steps == 3
    assert resources.cpu_seconds >= 0.25  # at least most of the busy loop
    assert resources.cpu_percent_of_device is not None and resources.cpu_percent_of_device > 0
    # This process's resident memory, as psutil sees it (the test process holds numpy etc.).
    assert resources.resident_memory_peak_bytes > 10 * 2**20
    # The first scrape's response crossed loopback before the second reading.
    assert resources.network_transmit_bytes > 0
    # Half the quota means twice the share of it.
    half = scraper.devices["dev-1"].resources(cpu_cores=0.5)
    assert half is not None and half.cpu_percent_of_device == pytest.approx(
        2 * resources.cpu_percent_of_device
    )


def test_scraper_thread_scrapes_repeatedly_until_stopped(exporter: PrometheusExporter) -> None:
    with ExporterScraper({"dev-1": exporter.url}, interval_seconds=0.05) as scraper:
        time.sleep(0.6)
    count = len(scraper.devices["dev-1"].scrapes)
    assert count >= 3
    time.sleep(0.2)
    assert len(scraper.devices["dev-1"].scrapes) == count  # stopped means stopped


def test_scrapes_ask_for_gzip_and_count_the_compressed_bytes(exporter: PrometheusExporter) -> None:
    scraper = ExporterScraper({"dev-1": exporter.url})
    scraper.scrape_once()
    scrape = scraper.devices["dev-1"].scrapes[0]
    with urllib.request.urlopen(exporter.url) as response:
        plain = response.read()
    assert scrape.response_bytes < len(plain) / 3
    assert scrape.values[RESIDENT_MEMORY_BYTES] > 0 and CPU_SECONDS in scrape.values


def test_an_unreachable_exporter_counts_errors_and_yields_no_resources() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    scraper = ExporterScraper(
        {"gone": f"http://127.0.0.1:{port}/metrics"}, request_timeout_seconds=0.5
    )
    scraper.scrape_once()
    assert scraper.devices["gone"].errors == 1
    assert scraper.devices["gone"].resources(cpu_cores=1.0) is None


def test_parse_exposition_reads_only_the_resource_samples() -> None:
    text = (
        "# TYPE globaldl_process_cpu_seconds_total counter\n"
        'globaldl_process_cpu_seconds_total{run="r",rank="0",device="d"} 12.5\n'
        "# TYPE globaldl_loss gauge\n"
        'globaldl_loss{run="r",rank="0",device="d"} 0.3\n'
    )
    assert parse_exposition(text) == {CPU_SECONDS: 12.5}


def test_scraper_rejects_a_non_positive_interval() -> None:
    with pytest.raises(ValueError, match="interval_seconds"):
        ExporterScraper({}, interval_seconds=0)


def _scrapes(steps: list[int], sent: list[float], response_bytes: int = 100) -> DeviceScrapes:
    device = DeviceScrapes("dev-1", "http://unused/metrics")
    for index, (count, transmitted) in enumerate(zip(steps, sent, strict=True)):
        values = {
            CPU_SECONDS: float(index),
            RESIDENT_MEMORY_BYTES: 1.0,
            TRANSMIT_BYTES: transmitted,
            RECEIVE_BYTES: 0.0,
            STEPS: float(count),
        }
        device.scrapes.append(Scrape(float(index), values, response_bytes))
    return device


def test_steady_traffic_runs_from_after_the_first_step_to_the_first_scrape_at_the_last() -> None:
    # Scrape 1 sees the broadcast (before step 1) and scrape 5 the run's end: both outside.
    device = _scrapes([0, 0, 1, 3, 5, 5], [0, 900_000, 901_000, 903_200, 905_400, 990_000])
    resources = device.resources(cpu_cores=1.0)
    assert resources is not None
    assert resources.steady_steps == 4
    # Counters of scrape 4 hold the responses of scrapes 2 and 3 (100 bytes each).
    assert resources.steady_transmit_bytes == 905_400 - 901_000 - 200
    assert resources.steady_transmit_bytes_per_step == pytest.approx(4_200 / 4)
    # The whole window keeps everything but the last response.
    assert resources.network_transmit_bytes == 990_000
    assert resources.scrape_response_bytes == 5 * 100


@pytest.mark.parametrize("steps", [[0, 0, 0], [0, 1, 2], [3, 3]])
def test_no_steady_traffic_without_two_steps_inside_the_window(steps: list[int]) -> None:
    resources = _scrapes(steps, [1000.0 * i for i in range(len(steps))]).resources(1.0)
    assert resources is not None
    assert resources.steady_steps is None and resources.steady_transmit_bytes_per_step is None
