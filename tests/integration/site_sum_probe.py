"""Under horovodrun: the hierarchical exchange against Horovod's flat allreduce.

Usage: python site_sum_probe.py SITES_FILE OUT_DIR
Each rank finds its site in SITES_FILE (by the host name Horovod launched it under) and
builds the site process sets. It then sums a rank-dependent int64 and float32 payload site by
site and flat, and runs PowerSGD's two rounds (a GradientCompressor on fixed gradients) site
by site and flat. It writes OUT_DIR/rank-R.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

import globaldl  # noqa: F401  (legacy Keras before TensorFlow)
from globaldl.compression import Combine, CompressionConfig, GradientCompressor, WireSpec
from globaldl.exchange import Exchange, collectives_per_step
from globaldl.sites import load_site_map, own_names


def powersgd_average(exchange: Exchange, rank: int, size: int, flat: bool) -> list[float]:
    """One PowerSGD step (two summed rounds) on fixed per-rank gradients; the average."""
    variables = [tf.Variable(tf.zeros([40, 30])), tf.Variable(tf.zeros([6]))]
    compressor = GradientCompressor(
        CompressionConfig(prune="powersgd", dense_below_elements=100),
        variables,
        steps_per_epoch=1,
        rank=rank,
        num_ranks=size,
    )
    rng = np.random.default_rng(rank)
    gradients = [tf.constant(rng.normal(size=v.shape).astype(np.float32)) for v in variables]
    spec = compressor.wire_spec

    def collective(payload: tf.Tensor, round_index: int) -> tf.Tensor:
        if flat:
            return exchange.sum_across_ranks(payload, f"powersgd_flat_{round_index}")
        return exchange.exchange_payload(payload, spec, round_index).payload

    payload, update = compressor.compress(gradients, tf.constant(0, tf.int64))
    summed = collective(payload, 0)
    payload, update = compressor.next_round(1, summed, size, update)
    averaged, _, _ = compressor.decompress_update(collective(payload, 1), None, size, update)
    return np.concatenate([a.numpy().ravel() for a in averaged]).tolist()


def main() -> None:
    sites_file, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    exchange = Exchange(dynamic_process_sets=True)
    site = load_site_map(sites_file).site_of(own_names())
    hierarchy = exchange.use_sites(site)
    rank, size = exchange.rank, exchange.size
    report: dict[str, object] = {"rank": rank, "site": site, "leader": hierarchy.leader}
    for dtype in ("int64", "float32"):
        payload = tf.cast(tf.range(1000) * (rank + 1) + 7 * rank, dtype)
        spec = WireSpec(Combine.SUM, dtype, (1000 * payload.dtype.size,))
        by_site = exchange.exchange_payload(payload, spec).payload
        flat = exchange.sum_across_ranks(payload, f"flat_{dtype}")
        report[dtype] = {"by_site": by_site.numpy().tolist(), "flat": flat.numpy().tolist()}
        report["collectives_per_step"] = collectives_per_step(spec, hierarchy)
    report["powersgd"] = {
        "by_site": powersgd_average(exchange, rank, size, flat=False),
        "flat": powersgd_average(exchange, rank, size, flat=True),
    }
    (out_dir / f"rank-{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
