"""Under horovodrun: the hierarchical exchange's sum against Horovod's flat allreduce.

Usage: python site_sum_probe.py SITES_FILE OUT_DIR
Each rank finds its site in SITES_FILE (by the host name Horovod launched it under), builds
the site process sets, sums a rank-dependent int64 and float32 payload site by site and
flat, and writes OUT_DIR/rank-R.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import tensorflow as tf

import globaldl  # noqa: F401  (legacy Keras before TensorFlow)
from globaldl.compression import Combine, WireSpec
from globaldl.exchange import Exchange, collectives_per_step
from globaldl.sites import load_site_map, own_names


def main() -> None:
    sites_file, out_dir = Path(sys.argv[1]), Path(sys.argv[2])
    exchange = Exchange(dynamic_process_sets=True)
    site = load_site_map(sites_file).site_of(own_names())
    hierarchy = exchange.use_sites(site)
    rank = exchange.rank
    report: dict[str, object] = {"rank": rank, "site": site, "leader": hierarchy.leader}
    for dtype in ("int64", "float32"):
        payload = tf.cast(tf.range(1000) * (rank + 1) + 7 * rank, dtype)
        spec = WireSpec(Combine.SUM, dtype, (1000 * payload.dtype.size,))
        by_site = exchange.exchange_payload(payload, spec).payload
        flat = exchange.sum_across_ranks(payload, f"flat_{dtype}")
        report[dtype] = {"by_site": by_site.numpy().tolist(), "flat": flat.numpy().tolist()}
        report["collectives_per_step"] = collectives_per_step(spec, hierarchy)
    (out_dir / f"rank-{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
