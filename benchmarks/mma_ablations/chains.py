"""The fragment kernel with its block's MMAs spread over 1, 2 or 4 accumulator chains (shorter
dependent HMMA chains, a few more registers), at M = 1, 8, 16 over a small tile sweep (GPU).
Usage: PYTHONPATH=. python benchmarks/mma_ablations/chains.py [--out DIR]
"""
import argparse
import itertools

import gearshift.kernels.int4_mma_gemv as mg
from gearshift.kernels.config import TileConfig

from sweep import sweep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--chains", default="1,2,4")
    ap.add_argument("--m", default="1,8,16")
    args = ap.parse_args()
    base = dict(mg.MMA_ASM)
    variants = {}
    for c in (int(v) for v in args.chains.split(",")):
        asm = {(dt, rows, tiles): mg._mma_asm(dt, magic, rows, tiles, c) for dt, magic in (("bf16", 0x4300), ("f16", 0x6400))
               for rows in mg.ROWS_PER_WARP for tiles in (1, 2)}
        variants[f"chains={c}"] = lambda asm=asm: mg.MMA_ASM.update(asm)
    cfgs = [TileConfig(16, 0, 128, sk, w, 1) for sk, w in itertools.product((1, 2, 4, 8), (2, 4))]
    sweep(variants, lambda: mg.MMA_ASM.update(base), cfgs, [int(m) for m in args.m.split(",")], args.out,
          "mma_chains")


if __name__ == "__main__":
    main()
