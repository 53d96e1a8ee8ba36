"""Relative error of a mode's strategies (default W4A8 int8) against the torch reference, per tile
config, on Llama-3-8B shapes (GPU). Found the stop-13 precision bug: the error grew with the K tiles per
program (5e-3 at split 1) until the int32 -> fp32 constant was subtracted per tile.

    python benchmarks/w4a8_split_error.py [--m 16,64,128]
"""
import argparse

import torch

from gearshift.dispatch.profiler import random_store
from gearshift.dispatch.strategies import strategies_for
from gearshift.kernels.reference import linear_reference
from gearshift.quant.modes import MODES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", default="16,64,128")
    ap.add_argument("--mode", default="w4a8", help="w4a8, w4a8fp8, w4a4, w8a8, w8a16, w4a16")
    a = ap.parse_args()
    act = MODES[a.mode].act
    fmt = "int8" if a.mode.startswith("w8") else "int4"
    torch.manual_seed(0)
    for n, k in ((28672, 4096), (4096, 4096)):
        st = random_store(fmt, n, k, 128 if fmt == "int4" else 0, "cuda")
        for m in (int(v) for v in a.m.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = linear_reference(x.float(), st, act)
            rounding = ((ref.to(torch.bfloat16).float() - ref).norm() / ref.norm()).item()
            cells = []
            for s in strategies_for(a.mode):
                name = s.name
                for cfg in s.configs(m)[:8]:
                    if s.supports(st, act, cfg):
                        y = s.run(x, st, act, cfg)
                        err = ((y.float() - ref).norm() / ref.norm()).item()
                        cells.append(f"{name}:{cfg.key() if cfg else '-'}={err:.2e}")
            print(f"{n}x{k} M={m} (bf16 rounding of the reference {rounding:.2e}): " + " ".join(cells), flush=True)


if __name__ == "__main__":
    main()
