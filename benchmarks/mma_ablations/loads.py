"""The fragment kernel's weight access: L2 prefetch-size hints on its loads (`ld.global...L2::128B/256B`): a
16-byte weight load then brings the row's next 1-3 blocks into L2, so the following loads of the
row are L2 hits without holding more registers; the scale/min loads optionally too; and the
blocks16 weight layout (`quant.int4`: one 1 KB chunk per 16 rows x 128 columns, so a warp's load
reads 512 contiguous bytes). Each variant over the profiler's small-M tile list, checked and timed
per Llama-3-8B shape (GPU).
Usage: PYTHONPATH=. python benchmarks/mma_ablations/loads.py [--out DIR] [--m 1,8,16]
"""
import argparse

import gearshift.kernels.int4_mma_gemv as mg
from gearshift.dispatch.strategies import mma_configs

from sweep import sweep

VARIANTS = {"plain": ("plain", 0, False), "l2_128": ("l2_128", 0, False), "l2_256": ("l2_256", 0, False),
            "plain+s256": ("plain", 1, False), "l2_256+s256": ("l2_256", 1, False),
            "blocks16": ("plain", 0, True), "blocks16+l2_128": ("l2_128", 0, True)}


def _apply(v: str) -> dict:
    load, scales, blocks = VARIANTS[v]
    mg.WEIGHT_LOAD.update(name=load, scales=scales)
    return {"layout": "blocks16" if blocks else "rows"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--m", default="1,8,16")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    args = ap.parse_args()
    variants = {v: (lambda v=v: _apply(v)) for v in args.variants.split(",")}
    sweep(variants, lambda: mg.WEIGHT_LOAD.update(name="plain", scales=0), mma_configs(1),
          [int(m) for m in args.m.split(",")], args.out, "mma_loads")


if __name__ == "__main__":
    main()
