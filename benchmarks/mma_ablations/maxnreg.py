"""The fragment kernel compiled under a register cap (ptxas .maxnreg): more resident programs per
SM against spills. Checked against the torch reference, timed per Llama-3-8B shape at M = 1 and 16
over a small tile sweep (GPU).
Usage: PYTHONPATH=. python benchmarks/mma_ablations/maxnreg.py [--out DIR]
"""
import argparse
import itertools
import json
from pathlib import Path

import torch

import gearshift.kernels.int4_mma_gemv as mg
from gearshift.dispatch.profiler import n_copies, random_store, time_us
from gearshift.kernels.config import TileConfig
from gearshift.kernels.reference import linear_reference

SHAPES = (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336))


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
    ap.add_argument("--caps", default="0,80,72,64")
    ap.add_argument("--m", default="1,16")
    args = ap.parse_args()
    caps = [int(c) for c in args.caps.split(",")]
    kernel = mg._mma_gemv_kernel
    cfgs = [TileConfig(16, 0, 128, sk, w, 1, prefetch=pf) for sk, w, pf in
            itertools.product((1, 2, 4, 8), (2, 4), (False, True))]
    rows, best = [], {}
    for name, n, k in SHAPES:
        probe = random_store("int4", n, k, 128, "cuda")
        stores = [probe] + [random_store("int4", n, k, 128, "cuda") for _ in range(n_copies(probe) - 1)]
        for m in (int(v) for v in args.m.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = linear_reference(x.float(), stores[0], None)
            for cap in caps:
                mg._mma_gemv_kernel = Capped(kernel, cap) if cap else kernel
                for cfg in cfgs:
                    if not mg.mma_gemv_supports(stores[0], cfg, m):
                        continue
                    y = mg.mma_gemv(x, stores[0], cfg)
                    rel = ((y.float() - ref).norm() / ref.norm()).item()
                    assert rel < 3e-3, (name, m, cap, cfg.key(), rel)
                    us = time_us([lambda s=s: mg.mma_gemv(x, s, cfg) for s in stores])
                    rows.append(dict(shape=name, m=m, maxnreg=cap, config=cfg.to_dict(), us=us))
                    if (name, m, cap) not in best or us < best[(name, m, cap)][0]:
                        best[(name, m, cap)] = (us, cfg.key())
            mg._mma_gemv_kernel = kernel
        del stores
        torch.cuda.empty_cache()
    dev = torch.cuda.get_device_name()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"mma_maxnreg_{dev.replace(' ', '_')}.json").write_text(json.dumps({"device": dev, "rows": rows}, indent=1))
    for m in sorted({r["m"] for r in rows}):
        for cap in caps:
            tot = sum(best[(s, m, cap)][0] for s, _, _ in SHAPES) * 32 / 1000
            print(f"M={m:2} maxnreg={cap or '-':>3}: " + "  ".join(f"{s} {best[(s, m, cap)][0]:5.1f} {best[(s, m, cap)][1]}"
                                                              for s, _, _ in SHAPES) + f"  step {tot:.3f}")


if __name__ == "__main__":
    main()
