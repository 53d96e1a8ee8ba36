"""Where a stream-K launch of `w4a16_wgmma` gains and loses (GPU).

For each case the same tile runs one tile per program (data-parallel grid), stream-K on every SM,
and stream-K on a program count whose runs are whole tiles (no partial sums to exchange). The
aligned run against the data-parallel one isolates the cost of the persistent loop; stream-K on
every SM against the aligned run is the even split's gain net of the partial exchange. Every
launch is checked against the reference first. Writes JSON and prints a table.

    PYTHONPATH=. python benchmarks/tc_ablations/stream_k.py --out $OUT/stream_k.json
"""
import argparse
import json

import torch

import gearshift.kernels.w4a16_wgmma as W
from gearshift.dispatch.profiler import n_copies, random_store, time_us
from gearshift.kernels.config import TileConfig
from gearshift.kernels.reference import linear_reference
from gearshift.quant.int4 import BLOCKS16

# (shape, N, K, M, tile (BM, BN, warps, stages, register cap), aligned program count)
CASES = (("gate_up", 28672, 4096, 1024, (256, 128, 8, 3, 0), 128), ("gate_up", 28672, 4096, 512, (256, 128, 8, 3, 0), 112),
         ("gate_up", 28672, 4096, 256, (256, 128, 8, 3, 0), 112), ("down", 4096, 14336, 256, (256, 128, 8, 3, 0), 32),
         ("qkv", 6144, 4096, 256, (128, 128, 8, 3, 0), 96), ("o", 4096, 4096, 256, (128, 64, 4, 3, 128), 128),
         ("qkv", 6144, 4096, 512, (256, 128, 8, 3, 0), 96))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="stream_k.json")
    a = ap.parse_args()
    sm_count = W.sm_count
    sms = sm_count(torch.device("cuda"))
    rows = []
    for shape, n, k, m, (bm, bn, w, st, r), aligned in CASES:
        probe = random_store("int4", n, k, 128, "cuda", layout=BLOCKS16)
        stores = [probe] + [random_store("int4", n, k, 128, "cuda", layout=BLOCKS16) for _ in range(n_copies(probe) - 1)]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = linear_reference(x.float(), probe, None)
        row = dict(shape=shape, m=m, tile=[bm, bn, w, st, r], sms=sms)
        sk = TileConfig(bm, bn, 128, 1, w, st, maxnreg=r, stream_k=1)
        for label, cfg, programs in (("dp", TileConfig(bm, bn, 128, 1, w, st, maxnreg=r), None),
                                     ("sk", sk, sms), ("sk_aligned", sk, aligned)):
            W.sm_count = (lambda d, p=programs: p) if programs else sm_count  # the launcher's program count
            y = W.w4a16_wgmma(x, probe, cfg)
            rel = ((y.float() - ref).norm() / ref.norm()).item()
            assert rel < 3e-3, (shape, m, label, rel)
            row[label] = time_us([lambda s=s: W.w4a16_wgmma(x, s, cfg) for s in stores])
        W.sm_count = sm_count
        rows.append(row)
        print(f"{shape:8s} M={m:5d} {bm}x{bn}: dp {row['dp']:7.1f}  sk {row['sk']:7.1f}  sk aligned ({aligned}) "
              f"{row['sk_aligned']:7.1f} us", flush=True)
        del stores
        torch.cuda.empty_cache()
    json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
