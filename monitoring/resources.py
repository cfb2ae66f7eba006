"""The device's resources (CPU, memory, network, disk) read from psutil when Prometheus scrapes."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import psutil
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# psutil.cpu_percent(None) measures since its previous call in this process, so concurrent
# scrapes (or two exporters in one process) take turns to keep each reading a whole interval.
_CPU_PERCENT_LOCK = threading.Lock()


class DeviceResourceCollector(Collector):
    """A Prometheus collector that reads psutil at scrape time, so training steps pay nothing.

    Device-wide figures (CPU utilisation, memory, network, disk) are the same on every rank of a
    device: dashboards aggregate them with `max by (device)`. Process figures (CPU seconds,
    resident memory, bytes read from storage) belong to this worker. Network bytes include the
    loopback interface, because ranks on one device exchange gradients over it.
    """

    def __init__(self, label_names: Sequence[str], label_values: Sequence[str]) -> None:
        if len(label_names) != len(label_values):
            raise ValueError(
                f"label_names {list(label_names)} and label_values {list(label_values)} "
                "differ in length"
            )
        self._label_names = list(label_names)
        self._label_values = list(label_values)
        self._process = psutil.Process()
        with _CPU_PERCENT_LOCK:
            psutil.cpu_percent(interval=None)  # the first reading only starts the interval

    def _gauge(self, name: str, documentation: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, documentation, labels=self._label_names)
        family.add_metric(self._label_values, value)
        return family

    def _counter(self, name: str, documentation: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, documentation, labels=self._label_names)
        family.add_metric(self._label_values, value)
        return family

    def collect(self) -> Iterator[Metric]:
        """Yield the current readings (called by prometheus-client on every scrape)."""
        with _CPU_PERCENT_LOCK:
            cpu_percent = psutil.cpu_percent(interval=None)
        yield self._gauge(
            "globaldl_device_cpu_utilization_ratio",
            "Share of the device's CPU time spent busy since the previous scrape (0 to 1).",
            cpu_percent / 100.0,
        )
        yield self._gauge(
            "globaldl_device_cpus",
            "Logical CPUs of the device.",
            psutil.cpu_count(logical=True) or 1,
        )
        with self._process.oneshot():
            process_cpu = self._process.cpu_times()
            resident_bytes = self._process.memory_info().rss
            process_io = (
                self._process.io_counters() if hasattr(self._process, "io_counters") else None
            )
        yield self._counter(
            "globaldl_process_cpu_seconds_total",
            "CPU seconds (user + system) used by this worker process.",
            process_cpu.user + process_cpu.system,
        )
        yield self._gauge(
            "globaldl_process_resident_memory_bytes",
            "Resident memory of this worker process.",
            resident_bytes,
        )
        memory = psutil.virtual_memory()
        yield self._gauge(
            "globaldl_device_memory_used_bytes",
            "Memory in use on the device (total minus available).",
            memory.total - memory.available,
        )
        yield self._gauge(
            "globaldl_device_memory_total_bytes", "Memory of the device.", memory.total
        )
        network = psutil.net_io_counters()
        if network is not None:
            yield self._counter(
                "globaldl_device_network_transmit_bytes_total",
                "Bytes sent by the device on all interfaces, loopback included.",
                network.bytes_sent,
            )
            yield self._counter(
                "globaldl_device_network_receive_bytes_total",
                "Bytes received by the device on all interfaces, loopback included.",
                network.bytes_recv,
            )
        disk = psutil.disk_io_counters()
        if disk is not None:
            yield self._counter(
                "globaldl_device_disk_read_bytes_total",
                "Bytes read from the device's disks (input I/O of every process).",
                disk.read_bytes,
            )
        if process_io is not None:
            yield self._counter(
                "globaldl_process_disk_read_bytes_total",
                "Bytes this worker process read from storage (its input I/O, page cache excluded).",
                process_io.read_bytes,
            )
