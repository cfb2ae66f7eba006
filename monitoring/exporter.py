"""A worker's Prometheus exporter: training metrics and device resources, served over HTTP(S)."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry

from globaldl.monitoring.metrics import LABEL_NAMES, TrainingMetrics
from globaldl.monitoring.resources import DeviceResourceCollector
from globaldl.monitoring.server import MetricsServer


class PrometheusExporter:
    """A TrainingObserver that serves what it observes at `url` until `close`.

    Each exporter owns its registry, so several can live in one process (as in tests).
    """

    def __init__(self, metrics: TrainingMetrics, server: MetricsServer) -> None:
        self.metrics = metrics
        self.server = server

    @property
    def url(self) -> str:
        """Where Prometheus scrapes this worker, e.g. http://127.0.0.1:9400/metrics."""
        return self.server.url

    @property
    def port(self) -> int:
        """The bound port (the chosen one when started with port 0)."""
        return self.server.port

    def observe_step(
        self,
        phase_seconds: Mapping[str, float],
        examples: int,
        gradient_bytes_raw: int,
        gradient_bytes_wire: int,
        loss: float,
        skipped: bool = False,
    ) -> None:
        """Record one training step (see TrainingMetrics.observe_step)."""
        self.metrics.observe_step(
            phase_seconds, examples, gradient_bytes_raw, gradient_bytes_wire, loss, skipped=skipped
        )

    def observe_round(
        self,
        phase_seconds: Mapping[str, float],
        gradient_bytes_raw: int,
        gradient_bytes_wire: int,
        rounds: int = 1,
        skipped: bool = False,
    ) -> None:
        """Record a round's end (see TrainingMetrics.observe_round)."""
        self.metrics.observe_round(
            phase_seconds, gradient_bytes_raw, gradient_bytes_wire, rounds=rounds, skipped=skipped
        )

    def observe_epoch(self, epoch: int, val_loss: float, val_accuracy: float) -> None:
        """Record the validation that closed `epoch`."""
        self.metrics.observe_epoch(epoch, val_loss, val_accuracy)

    def close(self) -> None:
        """Serve one last scrape (if Prometheus scrapes regularly), stop, free the port.

        The last steps of a run come after its last regular scrape; waiting for the next one
        (at most twice the scrape interval, 30 s at most) lets their counts reach Prometheus.
        Safe to call twice.
        """
        self.server.close()


def start_exporter(
    *,
    port: int,
    addr: str = "127.0.0.1",
    rank: int,
    device: str,
    run_id: str,
    certfile: str | None = None,
    keyfile: str | None = None,
    basic_auth: tuple[str, str] | None = None,
) -> PrometheusExporter:
    """Start serving this worker's metrics at ADDR:PORT and return the observer that feeds them.

    `port` 0 picks a free port (read it back from `.port`). With `certfile` and `keyfile` the
    endpoint speaks TLS only; with `basic_auth=(user, password)` it answers 401 to anyone else.
    Raises MetricsPortInUseError naming the port and address when the port is taken, and
    ValueError for bad labels, ports or TLS files.
    """
    registry = CollectorRegistry(auto_describe=True)
    metrics = TrainingMetrics(registry, run_id=run_id, rank=rank, device=device)
    registry.register(DeviceResourceCollector(LABEL_NAMES, metrics.label_values))
    server = MetricsServer(
        registry, port=port, addr=addr, certfile=certfile, keyfile=keyfile, basic_auth=basic_auth
    )
    return PrometheusExporter(metrics, server)
