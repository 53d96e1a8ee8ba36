"""A small program for Nsight Compute: runs the dispatched W4A16 kernel of one Llama-3-8B shape at
the given token counts (policy map configs), a few times each, so `ncu` can read the hardware
counters of the last launches (GPU).

    ncu --clock-control none --kernel-name regex:'mma_gemv|w4a16' --launch-skip 3 --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats python benchmarks/mma_ablations/ncu_target.py --m 1
"""
import argparse

import torch

from gearshift.dispatch.dispatcher import AdaptiveDispatcher
from gearshift.dispatch.profiler import random_store

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="gate_up", choices=sorted(SHAPES))
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--reps", type=int, default=4)
    ap.add_argument("--layout", default="blocks16", choices=("rows", "blocks16"),
                    help="int4 byte order (the engine's GPU default is blocks16, which the map was profiled on)")
    a = ap.parse_args()
    n, k = SHAPES[a.shape]
    store = random_store("int4", n, k, 128, "cuda", layout=a.layout)
    disp = AdaptiveDispatcher()
    x = torch.randn(a.m, k, device="cuda", dtype=torch.bfloat16)
    for _ in range(a.reps):
        disp.linear(x, store, None)
    torch.cuda.synchronize()
    print(a.shape, a.m, disp.choose(store, None, a.m))


if __name__ == "__main__":
    main()
