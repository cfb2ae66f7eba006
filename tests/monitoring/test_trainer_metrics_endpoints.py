"""The real trainer's endpoints: both ranks of a live `horovodrun -np 2` run serve valid metrics."""

import subprocess
import sys
from pathlib import Path

import pytest
from monitoring_support import free_port_pair, samples, scrape, wait_for

pytestmark = [pytest.mark.horovod]

BIN = Path(sys.executable).parent
PHASES_SEEN = {"data_load", "compute", "exchange"}


def _scrape_once_phases_show(url: str) -> str | None:
    text = scrape(url)
    return text if PHASES_SEEN <= _phases_observed(text) else None


def _phases_observed(text: str) -> set[str]:
    return {
        dict(labels)["phase"]
        for (name, labels), value in samples(text).items()
        if name == "globaldl_step_phase_seconds_count" and value > 0
    }


def test_both_ranks_serve_step_phases_that_pass_promtool_during_a_real_run(
    tmp_path: Path, worker_env: dict[str, str]
) -> None:
    base_port = free_port_pair()
    command = [
        str(BIN / "horovodrun"),
        "-np",
        "2",
        "-H",
        "localhost:2",
        "--gloo",
        str(BIN / "globaldl"),
        "train",
        "--model",
        "lenet",
        "--dataset",
        "mnist",
        # Two epochs (about 10 s of steps here) outlast the two scrapes with promtool's checks.
        "--epochs",
        "2",
        "--metrics-port",
        str(base_port),
        "--summary",
        str(tmp_path / "s.json"),
    ]
    log_path = tmp_path / "horovodrun.log"
    log = log_path.open("w")
    worker = subprocess.Popen(command, env=worker_env, stdout=log, stderr=subprocess.STDOUT)
    try:
        for port in (base_port, base_port + 1):
            url = f"http://127.0.0.1:{port}/metrics"
            text = wait_for(
                lambda url=url: _scrape_once_phases_show(url),
                timeout_seconds=240,
                what=f"step phases on {url}",
            )
            checked = subprocess.run(
                ["promtool", "check", "metrics"],
                input=text,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert checked.returncode == 0, checked.stdout + checked.stderr
            assert "globaldl_gradient_bytes_total{" in text and 'kind="wire"' in text
            rank = str(port - base_port)
            assert any(dict(labels).get("rank") == rank for _, labels in samples(text))
        assert worker.wait(timeout=600) == 0, log_path.read_text()[-4000:]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=30)
        log.close()


def test_train_metrics_endpoint_requires_the_basic_auth_of_its_credentials_file(
    tmp_path: Path, worker_env: dict[str, str]
) -> None:
    """One worker (no horovodrun: a run of one rank) with --metrics-basic-auth-file."""
    import base64
    import urllib.error

    from monitoring_support import free_port

    credentials = tmp_path / "metrics-auth"
    credentials.write_text("scraper:hunter2\n")
    port = free_port()
    command = [
        str(BIN / "globaldl"), "train", "--model", "lenet", "--dataset", "digits", "--epochs", "30",
        "--metrics-port", str(port), "--metrics-basic-auth-file", str(credentials),
    ]  # fmt: skip
    worker = subprocess.Popen(
        command, env=worker_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}/metrics"
    token = base64.b64encode(b"scraper:hunter2").decode()
    try:
        text = wait_for(
            lambda: scrape(url, headers={"Authorization": f"Basic {token}"}),
            timeout_seconds=240,
            what=f"an authenticated scrape of {url}",
        )
        assert "globaldl_" in text
        for headers in ({}, {"Authorization": "Basic " + base64.b64encode(b"x:y").decode()}):
            with pytest.raises(urllib.error.HTTPError) as refused:
                scrape(url, headers=headers)
            assert refused.value.code == 401
    finally:
        worker.kill()
        worker.wait(timeout=30)
