"""Real Horovod: a summable codec runs one allreduce per step; site-by-site sums are right."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from horovod_launch import horovod_python, horovod_train

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
    exchange = dict(result["exchange"])
    assert time.time() - 3600 < exchange.pop("horovod_started_unix_seconds") <= time.time()
    wire = exchange.pop("wire")
    assert exchange == {"combine": "sum", "collectives_per_step": 1, "hierarchy": "none"}
    assert result["weights_identical"], result["weight_digests"]
    traffic = result["traffic"]
    # a ring allreduce of P bytes sends 2 (N - 1) / N P per device (P on two ranks)
    payload_bytes = result["gradient_bytes_wire"] / result["steps"]
    # the declaration the exchange obeyed, one fixed-length round: what the simulator reads
    assert wire["combine"] == "sum" and wire["round_bytes"] == [payload_bytes]
    assert traffic["device_tx_bytes_per_step_model"] == pytest.approx(payload_bytes)
    assert traffic["traffic_ratio_vs_dense"] > 100  # 1% of the kernels, one byte per value
    assert result["compression"]["quantize"] == "intsum"


def test_site_by_site_sums_and_powersgd_rounds_on_four_ranks_in_two_sites_equal_the_flat_ones(
    tmp_path: Path, worker_env: dict[str, str]
) -> None:
    sites = tmp_path / "sites.yaml"
    sites.write_text(SITES)
    probe = Path(__file__).with_name("site_sum_probe.py")
    completed = horovod_python(
        probe, [str(sites), str(tmp_path)], worker_env, ranks=4, hosts=TWO_HOSTS
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
        # PowerSGD's two rounds, each summed site by site: the same average on every rank,
        # and (float sums in another order) the flat ring's
        assert report["powersgd"]["by_site"] == reports[0]["powersgd"]["by_site"]
        assert report["powersgd"]["by_site"] == pytest.approx(
            report["powersgd"]["flat"], rel=1e-4, abs=1e-5
        )
