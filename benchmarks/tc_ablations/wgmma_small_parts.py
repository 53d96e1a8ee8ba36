"""Where the few-token wgmma kernel (`kernels/w4a16_wgmma_small.py`) spends its time: the same tiles
with parts removed (`ablate` bits; timing only, the results are wrong), against a device copy of
the same packed bytes. Llama-3-8B shapes at one token, CUDA-graph replays over enough weight
copies to defeat L2.

    ablate 0: the kernel; 1: the consumers only wait and hand slots back (the TMA stream alone);
    2: no widening and no wgmma (bytes, scales and the fp32 epilogue stay); 4: no activation
    tiles; 5 = 1 + 4; 6 = 2 + 4.

Usage on the GPU: PYTHONPATH=. python benchmarks/tc_ablations/wgmma_small_parts.py
writes $OUT/wgmma_small_parts.json (or ./), prints a table.
"""
import json, os

import torch

from gearshift.dispatch.profiler import n_copies, random_store, time_us
from gearshift.kernels.config import TileConfig
from gearshift.kernels.w4a16_wgmma_small import w4a16_wgmma_small

ABLATE = (0, 1, 2, 4, 5, 6)
#: (name, N, K, tokens, tiles as (BM, BN, warps, stages, register cap, split-K, groups per stage))
CASES = (("gate_up", 28672, 4096, 1, [(8, 64, 4, 4, 64, 1, 1), (8, 64, 4, 4, 64, 1, 2), (8, 64, 4, 4, 96, 1, 1),
                                       (8, 128, 8, 4, 0, 1, 1)]),
         ("down", 4096, 14336, 1, [(8, 64, 4, 4, 96, 4, 1), (8, 64, 4, 4, 64, 4, 2)]),
         ("qkv", 6144, 4096, 1, [(8, 64, 4, 4, 64, 4, 1)]))

res = {"device": torch.cuda.get_device_name(), "ablate": {}, "copy_us": {}}
for name, n, k, m, tiles in CASES:
    st0 = random_store("int4", n, k, 128, "cuda", layout="blocks16")
    copies = [st0] + [random_store("int4", n, k, 128, "cuda", layout="blocks16") for _ in range(n_copies(st0) - 1)]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    for bm, bn, w, stg, r, sk, gps in tiles:
        cfg = TileConfig(bm, bn, 128 * gps, sk, w, stg, maxnreg=r)
        row = {ab: time_us([lambda s=s, ab=ab: w4a16_wgmma_small(x, s, cfg, ablate=ab) for s in copies])
               for ab in ABLATE}
        res["ablate"][f"{name}:{cfg.key()}"] = row
        print(f"{name:8s} {cfg.key():24s} " + " ".join(f"{ab}:{v:6.1f}" for ab, v in row.items()), flush=True)
    res["copy_us"][name] = time_us([lambda s=s: s.qweight.clone() for s in copies])  # reads and writes the bytes
    print(f"{name:8s} clone of the packed bytes (read + write) {res['copy_us'][name]:6.1f} us", flush=True)
    del copies, st0
    torch.cuda.empty_cache()
with open(os.path.join(os.environ.get("OUT", "."), "wgmma_small_parts.json"), "w") as f:
    json.dump(res, f, indent=1)
