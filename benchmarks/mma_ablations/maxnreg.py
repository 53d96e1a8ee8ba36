"""The fragment kernel compiled under a register cap (ptxas .maxnreg): more resident programs per
SM against spills, at M = 1 and 16 over a small tile sweep (GPU).
Usage: PYTHONPATH=. python benchmarks/mma_ablations/maxnreg.py [--out DIR]
"""
import argparse
import itertools

import gearshift.kernels.int4_mma_gemv as mg
from gearshift.kernels.config import TileConfig

from sweep import sweep


class Capped:
    """Stands in for the kernel object: every launch gets maxnreg=cap."""

    def __init__(self, kernel, cap):
        self.kernel, self.cap = kernel, cap

    def __getitem__(self, grid):
        launch = self.kernel[grid]
        return lambda *a, **kw: launch(*a, maxnreg=self.cap, **kw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--caps", default="0,80,72,64", help="0 = no cap")
    ap.add_argument("--m", default="1,16")
    args = ap.parse_args()
    kernel = mg._mma_gemv_kernel

    def use(cap):
        mg._mma_gemv_kernel = Capped(kernel, cap) if cap else kernel

    variants = {f"maxnreg={c or '-'}": (lambda c=c: use(c)) for c in (int(v) for v in args.caps.split(","))}
    cfgs = [TileConfig(16, 0, 128, sk, w, 1, prefetch=pf) for sk, w, pf in
            itertools.product((1, 2, 4, 8), (2, 4), (False, True))]
    sweep(variants, lambda: use(0), cfgs, [int(m) for m in args.m.split(",")], args.out, "mma_maxnreg")


if __name__ == "__main__":
    main()
