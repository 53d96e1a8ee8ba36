"""One launch per case for Nsight Compute (GPU): the kernels whose gaps the stop-24 record leaves.

Each case builds its inputs, runs its kernel once to compile and warm up, then once more; profile
the second launch (`--launch-skip 1 --launch-count 1`). `ncu_run.sh` runs every case under ncu and
exports the details and per-instruction (SASS) pages as CSV.

    PYTHONPATH=. python benchmarks/tc_ablations/ncu_cases.py --case gate_up1024_dp
    PYTHONPATH=. python benchmarks/tc_ablations/ncu_cases.py --list
"""
import argparse

import torch

import gearshift.kernels.w4a16_wgmma as W
from gearshift.dispatch.profiler import PRESETS, random_store
from gearshift.kernels.config import TileConfig
from gearshift.kernels.int4_mma_gemv import mma_gemv
from gearshift.quant.int4 import BLOCKS16

SHAPES = {name: (n, k) for name, n, k in PRESETS["llama3-8b"]["shapes"]}
BIG = TileConfig(256, 128, 128, 1, 8, 3)  # the map's 256 x 128 two-consumer tile at M >= 256

# name -> (shape, M, what runs): "dp"/"sk<programs>" = w4a16_wgmma with BIG, "cublas" = bf16 on a
# dense copy, "mma" = the fragment kernel with the shipped map's M = 1 tile, "prog_dp"/"prog_hybrid" =
# w4a8_progressive (int4-prog store, int8 codes) with BIG as a grid / as a hybrid stream-K launch (stop 28:
# the hybrid's whole tiles ran 1.06x slower on gate_up at M = 4096, 27 waves)
CASES = {
    "gate_up1024_dp": ("gate_up", 1024, "dp"),
    "gate_up1024_cublas": ("gate_up", 1024, "cublas"),
    "down256_dp": ("down", 256, "dp"),
    "down256_sk32": ("down", 256, "sk32"),
    "qkv1_mma": ("qkv", 1, TileConfig(16, 0, 128, 1, 8, 1, prefetch=True, kwarps=4)),
    "o1_mma": ("o", 1, TileConfig(16, 0, 128, 1, 8, 1, prefetch=True, kwarps=8)),
    "gate_up1_mma": ("gate_up", 1, TileConfig(16, 0, 128, 1, 8, 1, kwarps=4)),
    "gate_up4096_prog_dp": ("gate_up", 4096, "prog_dp"),
    "gate_up4096_prog_hybrid": ("gate_up", 4096, "prog_hybrid"),
}


def runner(name: str):
    shape, m, what = CASES[name]
    n, k = SHAPES[shape]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    if what == "cublas":
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        return lambda: x @ w.t()
    if what.startswith("prog"):
        from gearshift.kernels.act_quant import quantize_act_triton
        from gearshift.kernels.w4a8_progressive import progressive_codes
        from gearshift.quant.activations import ActQuantSpec

        store = random_store("int4p", n, k, 128, "cuda", layout=BLOCKS16)
        codes, scales = quantize_act_triton(x, ActQuantSpec("int8"))
        cfg = BIG if what == "prog_dp" else TileConfig(256, 128, 128, 1, 8, 3, stream_k=1, hybrid=True)
        return lambda: progressive_codes(codes, scales, store, cfg, torch.bfloat16)
    store = random_store("int4", n, k, 128, "cuda", layout=BLOCKS16)
    if isinstance(what, TileConfig):
        return lambda: mma_gemv(x, store, what)
    if what.startswith("sk"):
        programs = int(what[2:])
        W.sm_count = lambda d: programs  # the launcher's program count: whole-tile runs
        cfg = TileConfig(256, 128, 128, 1, 8, 3, stream_k=1)
    else:
        cfg = BIG
    return lambda: W.w4a16_wgmma(x, store, cfg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=sorted(CASES))
    ap.add_argument("--list", action="store_true", help="print the case names and exit")
    a = ap.parse_args()
    if a.list or not a.case:
        print(" ".join(CASES))
        return
    f = runner(a.case)
    for _ in range(2):
        f()
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
