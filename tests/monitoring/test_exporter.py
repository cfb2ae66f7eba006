import socket
import ssl
import statistics
import subprocess
import threading
import time
import urllib.error
from base64 import b64encode

import psutil
import pytest
from monitoring_support import samples, scrape

import globaldl
from globaldl.monitoring import (
    PHASES,
    MetricsPortInUseError,
    NullObserver,
    TrainingObserver,
    start_exporter,
)

STEP = {"data_load": 0.020, "compute": 0.050, "compress": 0.004, "exchange": 0.030, "apply": 0.002}
LABELS = {"run": "r-test", "rank": "3", "device": "edge-a"}


def value(scraped, name, **extra_labels):
    return scraped[(name, frozenset({**LABELS, **extra_labels}.items()))]


@pytest.fixture()
def exporter():
    observer = start_exporter(port=0, rank=3, device="edge-a", run_id="r-test")
    yield observer
    observer.close()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    """A self-signed certificate for 127.0.0.1 made with openssl, and its key."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


def feed(observer, steps=4):
    for step in range(steps):
        observer.observe_step(STEP, 32, 1000, 100, loss=1.0 / (step + 1), skipped=step == 2)


def test_scrape_reports_observed_steps_with_run_rank_and_device_labels(exporter):
    feed(exporter)
    exporter.observe_epoch(2, val_loss=0.3, val_accuracy=0.875)
    scraped = samples(scrape(exporter.url))

    assert value(scraped, "globaldl_steps_total") == 4
    assert value(scraped, "globaldl_skipped_steps_total") == 1
    assert value(scraped, "globaldl_examples_total") == 4 * 32
    assert value(scraped, "globaldl_gradient_bytes_total", kind="raw") == 4 * 1000
    assert value(scraped, "globaldl_gradient_bytes_total", kind="wire") == 4 * 100
    for phase in PHASES:  # a phase the trainer did not report (decompress) still counts its steps
        assert value(scraped, "globaldl_step_phase_seconds_count", phase=phase) == 4
        assert value(scraped, "globaldl_step_phase_seconds_sum", phase=phase) == pytest.approx(
            4 * STEP.get(phase, 0.0)
        )
    # 0.050 s of compute falls in the 0.05 bucket (le is inclusive), not in 0.025.
    assert value(scraped, "globaldl_step_phase_seconds_bucket", phase="compute", le="0.05") == 4
    assert value(scraped, "globaldl_step_phase_seconds_bucket", phase="compute", le="0.025") == 0
    assert value(scraped, "globaldl_step_seconds_sum") == pytest.approx(4 * sum(STEP.values()))
    assert value(scraped, "globaldl_loss") == pytest.approx(0.25)
    assert value(scraped, "globaldl_epoch") == 2
    assert value(scraped, "globaldl_validation_loss") == pytest.approx(0.3)
    assert value(scraped, "globaldl_validation_accuracy_ratio") == pytest.approx(0.875)
    assert value(scraped, "globaldl_run_info", version=globaldl.__version__) == 1
    assert value(scraped, "globaldl_run_start_time_seconds") == pytest.approx(time.time(), abs=60)


def test_the_first_step_is_exported_apart_once_it_ran_and_never_overwritten(exporter):
    def first_step_series(scraped):
        return {labels for name, labels in scraped if name == "globaldl_first_step_phase_seconds"}

    assert not first_step_series(samples(scrape(exporter.url)))  # no false 0 before it
    exporter.observe_step({"compute": 3.0, "exchange": 7.0}, 32, 1000, 100, loss=1.0)
    feed(exporter)
    scraped = samples(scrape(exporter.url))
    assert len(first_step_series(scraped)) == len(PHASES)
    assert value(scraped, "globaldl_first_step_phase_seconds", phase="exchange") == 7.0
    assert value(scraped, "globaldl_first_step_phase_seconds", phase="compute") == 3.0
    assert value(scraped, "globaldl_first_step_phase_seconds", phase="data_load") == 0.0
    # It is counted in the phase sums too: the report subtracts it.
    assert value(scraped, "globaldl_step_phase_seconds_sum", phase="exchange") == pytest.approx(
        7.0 + 4 * STEP["exchange"]
    )


def test_device_resources_come_from_psutil_at_scrape_time(exporter):
    scraped = samples(scrape(exporter.url))
    assert 0.0 <= value(scraped, "globaldl_device_cpu_utilization_ratio") <= 1.0
    assert value(scraped, "globaldl_device_cpus") == psutil.cpu_count()
    assert value(scraped, "globaldl_device_memory_total_bytes") == psutil.virtual_memory().total
    assert 0 < value(scraped, "globaldl_device_memory_used_bytes") < psutil.virtual_memory().total
    assert value(scraped, "globaldl_process_resident_memory_bytes") > 10e6  # this Python process
    assert value(scraped, "globaldl_process_cpu_seconds_total") > 0
    assert value(scraped, "globaldl_device_disk_read_bytes_total") >= 0
    assert value(scraped, "globaldl_process_disk_read_bytes_total") >= 0
    sent_before = value(scraped, "globaldl_device_network_transmit_bytes_total")
    # The scrape itself crosses the loopback interface, so the next reading has grown.
    rescraped = samples(scrape(exporter.url))
    assert value(rescraped, "globaldl_device_network_transmit_bytes_total") > sent_before
    assert value(rescraped, "globaldl_device_network_receive_bytes_total") > 0


def test_every_series_is_a_globaldl_series_with_run_rank_and_device(exporter):
    feed(exporter)
    scraped = samples(scrape(exporter.url))
    assert len(scraped) > 100
    for name, labels in scraped:
        assert name.startswith("globaldl_"), name
        assert LABELS.items() <= dict(labels).items(), (name, labels)
        # Bounded cardinality: no label beyond these (le for buckets, phase, kind, version).
        assert set(dict(labels)) <= {"run", "rank", "device", "phase", "kind", "le", "version"}


def test_real_scrape_passes_promtool_check_metrics(exporter):
    feed(exporter)
    exporter.observe_epoch(1, 0.5, 0.5)
    checked = subprocess.run(
        ["promtool", "check", "metrics"],
        input=scrape(exporter.url).encode(),
        capture_output=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout.decode() + checked.stderr.decode()
    assert checked.stdout.decode().strip() == ""  # no lint findings at all


def test_port_in_use_raises_an_error_naming_port_and_address(exporter):
    with pytest.raises(
        MetricsPortInUseError,
        match=rf"metrics port {exporter.port} on address 127\.0\.0\.1 is already in use",
    ):
        start_exporter(port=exporter.port, rank=0, device="edge-b", run_id="r-test")
    with socket.socket() as holder:  # a port held by some other program
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(OSError, match=rf"metrics port {port} on address 127\.0\.0\.1"):
            start_exporter(port=port, rank=0, device="edge-b", run_id="r-test")


def test_close_frees_the_port_and_can_be_called_twice():
    observer = start_exporter(port=0, rank=0, device="edge-a", run_id="r-test")
    port = observer.port
    observer.close()
    observer.close()
    with pytest.raises(urllib.error.URLError):
        scrape(f"http://127.0.0.1:{port}/metrics")
    again = start_exporter(port=port, rank=0, device="edge-a", run_id="r-test")
    again.close()


def test_close_waits_for_one_last_scrape_so_the_final_steps_reach_prometheus():
    observer = start_exporter(port=0, rank=3, device="edge-a", run_id="r-test")
    bodies: list[str] = []
    stop = threading.Event()

    def scrape_regularly():  # a stand-in for Prometheus, every 0.3 s until the port closes
        while not stop.is_set():
            try:
                bodies.append(scrape(observer.url))
            except (urllib.error.URLError, ConnectionError):
                return
            time.sleep(0.3)

    scraper = threading.Thread(target=scrape_regularly, daemon=True)
    scraper.start()
    try:
        deadline = time.monotonic() + 10
        while len(bodies) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        feed(observer, steps=5)  # the run's last steps, after its last regular scrape
        started = time.monotonic()
        observer.close()
        closing_seconds = time.monotonic() - started
    finally:
        stop.set()
        scraper.join(timeout=10)
    assert value(samples(bodies[-1]), "globaldl_steps_total") == 5
    assert closing_seconds < 2 * 0.3 + 0.6 + 1.0  # twice the interval, shutdown poll, slack


def test_close_does_not_wait_when_nothing_scrapes():
    observer = start_exporter(port=0, rank=3, device="edge-a", run_id="r-test")
    scrape(observer.url)  # one scrape says nothing about an interval
    feed(observer)
    started = time.monotonic()
    observer.close()
    assert time.monotonic() - started < 1.5


def test_tls_endpoint_serves_verified_https_only(certificate):
    cert, key = certificate
    observer = start_exporter(
        port=0, rank=3, device="edge-a", run_id="r-test", certfile=str(cert), keyfile=str(key)
    )
    try:
        feed(observer)
        assert observer.url.startswith("https://127.0.0.1:")
        trusted = ssl.create_default_context(cafile=str(cert))
        assert value(samples(scrape(observer.url, context=trusted)), "globaldl_steps_total") == 4
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            scrape(
                observer.url, context=ssl.create_default_context()
            )  # no trust in a self-signed cert
        with pytest.raises((ConnectionError, urllib.error.URLError)):
            scrape(observer.url.replace("https://", "http://"))
    finally:
        observer.close()


def test_basic_auth_answers_only_the_right_credentials(certificate):
    cert, key = certificate
    observer = start_exporter(
        port=0,
        rank=3,
        device="edge-a",
        run_id="r-test",
        certfile=str(cert),
        keyfile=str(key),
        basic_auth=("prometheus", "s3cret"),
    )
    trusted = ssl.create_default_context(cafile=str(cert))

    def authorization(user, password):
        return {"Authorization": "Basic " + b64encode(f"{user}:{password}".encode()).decode()}

    try:
        feed(observer)
        for headers in (
            {},
            authorization("prometheus", "wrong"),
            authorization("someone", "s3cret"),
        ):
            with pytest.raises(urllib.error.HTTPError) as refused:
                scrape(observer.url, context=trusted, headers=headers)
            assert refused.value.code == 401
            assert refused.value.headers["WWW-Authenticate"].startswith("Basic")
        scraped = samples(
            scrape(observer.url, context=trusted, headers=authorization("prometheus", "s3cret"))
        )
        assert value(scraped, "globaldl_steps_total") == 4
    finally:
        observer.close()


def test_basic_auth_works_without_tls_too():
    observer = start_exporter(
        port=0, rank=3, device="edge-a", run_id="r-test", basic_auth=("u", "p")
    )
    try:
        with pytest.raises(urllib.error.HTTPError, match="401"):
            scrape(observer.url)
        assert "globaldl_steps_total" in scrape(
            observer.url, headers={"Authorization": "Basic " + b64encode(b"u:p").decode()}
        )
    finally:
        observer.close()


def test_steps_never_wait_for_scrapes_or_stalled_clients(certificate):
    cert, key = certificate
    observer = start_exporter(
        port=0, rank=0, device="edge-a", run_id="r-test", certfile=str(cert), keyfile=str(key)
    )
    trusted = ssl.create_default_context(cafile=str(cert))
    # A client that connects and never starts the TLS handshake must hold up nobody.
    stalled = socket.create_connection(("127.0.0.1", observer.port), timeout=5)
    stop = threading.Event()
    scrapes = []

    def scrape_continuously():
        while not stop.is_set():
            scrapes.append(len(scrape(observer.url, context=trusted)))

    scraper = threading.Thread(target=scrape_continuously, daemon=True)
    try:
        scraper.start()
        latencies = []
        for _ in range(2000):
            started = time.perf_counter()
            observer.observe_step(STEP, 32, 1000, 100, loss=0.5)
            latencies.append(time.perf_counter() - started)
        time.sleep(0.2)
    finally:
        stop.set()
        scraper.join(timeout=15)
        stalled.close()
        observer.close()
    assert len(scrapes) >= 3, "the scraper never got through: the stalled client blocked the server"
    assert statistics.median(latencies) < 0.0005, (
        f"median observe_step {statistics.median(latencies) * 1e6:.0f} us"
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"run_id": "bad run"}, "run id 'bad run' is not allowed"),
        ({"run_id": ""}, "run id '' is not allowed"),
        ({"rank": -1}, "rank is -1"),
        ({"device": ""}, "device name '' is not allowed"),
        ({"port": 70000}, "metrics port 70000 is out of range"),
        ({"certfile": "cert.pem"}, "TLS needs both certfile and keyfile"),
        (
            {"certfile": "/nonexistent/c.pem", "keyfile": "/nonexistent/k.pem"},
            "cannot load TLS certificate '/nonexistent/c.pem'",
        ),
        ({"basic_auth": ("a:b", "p")}, "basic-auth username 'a:b'"),
        (
            {"addr": "no-such-host.invalid"},
            "metrics address 'no-such-host.invalid' cannot be resolved",
        ),
    ],
)
def test_bad_exporter_arguments_raise_value_error_naming_them(arguments, message):
    with pytest.raises(ValueError, match=message):
        start_exporter(
            **{"port": 0, "rank": 0, "device": "edge-a", "run_id": "r", **arguments}
        ).close()


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda o: o.observe_step({"forward": 0.1}, 1, 0, 0, 0.0), "unknown phase 'forward'"),
        (
            lambda o: o.observe_step({"compute": -1.0}, 1, 0, 0, 0.0),
            "phase 'compute' took -1.0 seconds",
        ),
        (lambda o: o.observe_step({"compute": 0.1}, -5, 0, 0, 0.0), "examples is -5"),
        (lambda o: o.observe_step({"compute": 0.1}, 1, -1, 0, 0.0), "gradient_bytes_raw is -1"),
        (lambda o: o.observe_epoch(1, 0.1, 1.5), "val_accuracy is 1.5"),
    ],
)
def test_bad_observations_raise_value_error_naming_them(exporter, call, message):
    with pytest.raises(ValueError, match=message):
        call(exporter)


def test_exporter_and_null_observer_both_satisfy_the_trainer_contract(exporter):
    assert isinstance(exporter, TrainingObserver)
    null = NullObserver()
    assert isinstance(null, TrainingObserver)
    null.observe_step(STEP, 32, 1000, 100, 0.5, skipped=True)
    null.observe_epoch(1, 0.1, 0.9)
    null.close()


def test_rounds_are_counted_and_their_sync_seconds_ride_on_the_next_step(exporter):
    sync = {"compress": 0.01, "exchange": 0.5, "apply": 0.02}
    exporter.observe_step(STEP, 32, 0, 0, loss=1.0)
    exporter.observe_round(sync, 1000, 10, rounds=1)
    exporter.observe_round(sync, 1000, 10, rounds=0, skipped=False)  # overlap: none completed
    exporter.observe_step(STEP, 32, 0, 0, loss=1.0)
    exporter.observe_round(sync, 1000, 10, rounds=1, skipped=True)
    exporter.observe_epoch(1, val_loss=0.3, val_accuracy=0.5)  # flushes the last round's seconds
    scraped = samples(scrape(exporter.url))
    assert value(scraped, "globaldl_rounds_total") == 2
    assert value(scraped, "globaldl_skipped_rounds_total") == 1
    assert value(scraped, "globaldl_steps_total") == 2
    assert value(scraped, "globaldl_gradient_bytes_total", kind="wire") == 30
    # Two steps and one flush: the histogram's count stays per step (plus the epoch's flush),
    # its sum holds all three round ends.
    assert value(scraped, "globaldl_step_phase_seconds_count", phase="exchange") == 3
    assert value(scraped, "globaldl_step_phase_seconds_sum", phase="exchange") == pytest.approx(
        2 * STEP["exchange"] + 3 * sync["exchange"]
    )
    null = NullObserver()
    null.observe_round(sync, 1000, 10)
