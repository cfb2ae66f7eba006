"""Real Horovod: summable codecs run one allreduce per step; the site hierarchy sums correctly."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from horovod_launch import BIN, horovod_train

pytestmark = pytest.mark.horovod

TWO_HOSTS = "localhost:2,127.0.0.1:2"  # two host names on this machine, no ssh needed
SITES = "sites:\n  north: [localhost]\n  south: ['127.0.0.1']\n"
FEW_STEPS = ["--epochs", "1", "--max-steps-per-epoch", "6"]


def test_shared_topk_intsum_runs_one_allreduce_per_step_to_identical_weights(
    tmp_path: Path, worker_env: dict[str, str]
) -> None:
    result, _ = horovod_train(
        tmp_path,
        [*FEW_STEPS, "--prune", "shared-topk", "--density", "0.01", "--quantize", "intsum"],
        worker_env,
        ranks=2,
    )
    assert result["exchange"] == {"combine": "sum", "collectives_per_step": 1, "hierarchy": "none"}
    assert result["weights_identical"], result["weight_digests"]
    traffic = result["traffic"]
    # a ring allreduce of P bytes sends 2 (N - 1) / N P per device (P on two ranks)
    payload_bytes = result["gradient_bytes_wire"] / result["steps"]
    assert traffic["device_tx_bytes_per_step_model"] == pytest.approx(payload_bytes)
    assert traffic["traffic_ratio_vs_dense"] > 100  # 1% of the kernels, one byte per value
    assert result["compression"]["quantize"] == "intsum"


def test_powersgd_summed_site_by_site_on_two_sites_ends_identical(
    tmp_path: Path, worker_env: dict[str, str]
) -> None:
    sites = tmp_path / "sites.yaml"
    sites.write_text(SITES)
    result, _ = horovod_train(
        tmp_path / "run",
        [*FEW_STEPS, "--prune", "powersgd", "--quantize", "fp16"]
        + ["--hierarchy", "sites", "--sites-file", str(sites)],
        worker_env,
        ranks=4,
        hosts=TWO_HOSTS,
    )
    # two rounds (P, Q), each summed in the site, among the two leaders, then sent back
    assert result["exchange"] == {"combine": "sum", "collectives_per_step": 6, "hierarchy": "sites"}
    assert result["weights_identical"], result["weight_digests"]
    assert result["val_accuracy"] > 0.2  # six steps of LeNet learn something (chance: 0.1)


def test_the_site_by_site_sum_equals_horovods_flat_sum(
    tmp_path: Path, worker_env: dict[str, str]
) -> None:
    sites = tmp_path / "sites.yaml"
    sites.write_text(SITES)
    probe = Path(__file__).with_name("site_sum_probe.py")
    completed = subprocess.run(
        [str(BIN / "horovodrun"), "-np", "4", "-H", TWO_HOSTS, "--gloo"]
        + [str(BIN / "python"), str(probe), str(sites), str(tmp_path)],
        env=worker_env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(4)]
    assert [r["site"] for r in reports] == ["north", "north", "south", "south"]
    assert [r["leader"] for r in reports] == [0, 0, 2, 2]
    assert {r["collectives_per_step"] for r in reports} == {3}
    for report in reports:
        assert report["int64"]["by_site"] == report["int64"]["flat"]  # integers: exactly
        assert report["float32"]["by_site"] == pytest.approx(report["float32"]["flat"])
        assert report["int64"]["by_site"] == reports[0]["int64"]["by_site"]
