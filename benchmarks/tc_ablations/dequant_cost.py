"""What the in-register dequantization costs `w4a16_wgmma` at mid and large M (GPU).

Each variant runs in its own process (the kernel's `GEARSHIFT_WGMMA_ABLATE` switch is read at
import): 0 the fp32 path (two FMAs and a convert per byte), 1 the packed path (`dequant_bytes_x2`,
one packed FMA per byte; on stores whose scales are not x-dtype values it rounds them, so only its
speed counts there), 2 no scaling (wrong results), 3 no weight-byte loads either (wrong results).
`--fmt int4p` runs int4-prog stores, on which the packed path is exact for bf16 too. Every shape runs the shipped map's W4A16 tile at that M (256 x 128 where the map
picks dequantize + cuBLAS); cuBLAS bf16 on a dense copy runs beside variant 0. Each launch is
checked against the reference first (variants 2 / 3 only report their error).

    python benchmarks/tc_ablations/dequant_cost.py --out $OUT/dequant_cost.json   # all variants
"""
import argparse
import json
import os
import subprocess
import sys

SHAPES = (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336))
MAP = "gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json"


def one_variant(ms: list[int], ablate: int, fmt: str) -> dict:
    import torch

    import gearshift.kernels.w4a16_wgmma as W
    from gearshift.dispatch.profiler import n_copies, random_store, time_us
    from gearshift.kernels.config import TileConfig
    from gearshift.kernels.reference import linear_reference
    from gearshift.quant.int4 import BLOCKS16

    W.PACKED_DEQUANT = "always" if ablate == 1 else "never"
    entries = json.load(open(MAP))["entries"]
    out = {}
    for m in ms:
        for name, n, k in SHAPES:
            e = entries[f"w4a16:g128:{n}x{k}"].get(str(m)) or {}
            cfg = (TileConfig.from_dict(e["config"]) if e.get("strategy") == "w4a16_wgmma"
                   else TileConfig(256, 128, 128, 1, 8, 3))
            probe = random_store(fmt, n, k, 128, "cuda", layout=BLOCKS16)
            stores = [probe] + [random_store(fmt, n, k, 128, "cuda", layout=BLOCKS16)
                                for _ in range(n_copies(probe) - 1)]
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = linear_reference(x.float(), probe, None)
            rel = ((W.w4a16_wgmma(x, probe, cfg).float() - ref).norm() / ref.norm()).item()
            if ablate in (0, 1):
                assert rel < 1e-2, (name, m, ablate, rel)
            row = dict(tile=cfg.key(), rel_err=rel, us=time_us([lambda s=s: W.w4a16_wgmma(x, s, cfg) for s in stores]))
            if ablate == 0:
                dense = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(max(2, len(stores) // 4))]
                row["cublas_us"] = time_us([lambda w=w: x @ w.t() for w in dense])
                del dense
            out[f"{name}:{m}"] = row
            print(f"ablate {ablate} {name:8s} M={m:5d} {cfg.key():28s} {row['us']:8.1f} us  err {rel:.1e}"
                  + (f"  cuBLAS {row['cublas_us']:.1f}" if "cublas_us" in row else ""), flush=True)
            del stores
            torch.cuda.empty_cache()
    return dict(device=torch.cuda.get_device_name(), ablate=ablate, fmt=fmt, rows=out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default="256,512,1024")
    ap.add_argument("--variants", default="0,1,2,3")
    ap.add_argument("--fmt", default="int4", choices=("int4", "int4p"), help="int4p: int4-prog stores (row units)")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)  # child process: one variant
    ap.add_argument("--out", default="dequant_cost.json")
    a = ap.parse_args()
    ms = [int(v) for v in a.ms.split(",")]
    if a.one is not None:
        json.dump(one_variant(ms, a.one, a.fmt), open(a.out, "w"))
        return
    results = []
    for v in (int(v) for v in a.variants.split(",")):
        part = f"{a.out}.part{v}"
        env = dict(os.environ, GEARSHIFT_WGMMA_ABLATE=str(v if v >= 2 else 0))
        subprocess.run([sys.executable, __file__, "--ms", a.ms, "--fmt", a.fmt, "--one", str(v), "--out", part],
                       env=env, check=True)
        results.append(json.load(open(part)))
        os.remove(part)
    json.dump(dict(device=results[0]["device"], variants=results), open(a.out, "w"), indent=1)
    base = results[0]["rows"]
    print(f"\n{'variant':10s}" + "".join(f"{'M=' + str(m):>10s}" for m in ms) + "   (ms per 32-layer step)")
    for r in [{"ablate": "cuBLAS", "rows": {k: {"us": v["cublas_us"]} for k, v in base.items()}}] + results:
        print(f"{str(r['ablate']):10s}" + "".join(
            f"{32e-3 * sum(r['rows'][f'{s}:{m}']['us'] for s, _, _ in SHAPES):10.3f}" for m in ms))


if __name__ == "__main__":
    main()
