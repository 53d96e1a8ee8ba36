"""Sweep the small-M W4A16 kernels on Llama-3-8B linear shapes: the CUDA-core split-K GEMV
(kernels/int4_gemv.py, M = 1) and the register-fragment tensor-core kernel (kernels/int4_mma_gemv.py,
M <= 8), against the single-token GEMV dispatched before (kernels/w4a16_rowgemv.py), the Triton
`tl.dot` kernel (w4a16_tc, M >= 2) and torch's int4 kernel (tinygemm).

Times are CUDA-graph replays over enough distinct weight copies to exceed L2
(dispatch.profiler.time_us). Every timed tile is first checked against the torch reference, and
the best tile per shape is checked to give bit-identical output on repeated runs. Writes
int4_gemv_<device>.json; prints per-shape bests and the 32-layer step sums last.

    python benchmarks/int4_gemv.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch

from gearshift.dispatch.profiler import PRESETS

SHAPES = PRESETS["llama3-8b"]["shapes"]  # (name, N, K) of the Llama-3-8B linears


def ints(s: str) -> list[int]:
    return [int(v) for v in s.split(",") if v]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--bn", default="16,32,64")
    ap.add_argument("--bk", default="128")
    ap.add_argument("--split", default="1,2,4,8")
    ap.add_argument("--warps", default="1,2,4")
    ap.add_argument("--prefetch", default="0,1")
    ap.add_argument("--tag", default="")
    ap.add_argument("--m", default="1", help="token counts")
    ap.add_argument("--families", default="int4_gemv,mma_gemv")
    ap.add_argument("--mma-warps", default="1,2,4")
    ap.add_argument("--mma-split", default="1,2,4,8,16")
    ap.add_argument("--mma-rows", default="8,16", help="weight rows per warp")
    args = ap.parse_args()

    from gearshift.dispatch.dispatcher import AdaptiveDispatcher
    from gearshift.dispatch.profiler import copy_bandwidth, n_copies, random_store, time_us
    from gearshift.dispatch.strategies import rowgemv_config
    from gearshift.kernels.config import TileConfig
    from gearshift.kernels.int4_gemv import int4_gemv, int4_gemv_supports
    from gearshift.kernels.int4_mma_gemv import mma_gemv, mma_gemv_supports
    from gearshift.kernels.library import tinygemm_linear, to_tinygemm
    from gearshift.kernels.reference import linear_reference
    from gearshift.kernels.w4a16_rowgemv import w4a16_rowgemv

    dev, group = "cuda", args.group
    m_list, families = ints(args.m), args.families.split(",")
    bw = copy_bandwidth()  # measured in the same run: floor = bytes / it
    fam_cfgs = {
        "int4_gemv": [TileConfig(1, bn, bk, sk, w, 2, prefetch=bool(pf)) for bn, bk, sk, w, pf in itertools.product(
            ints(args.bn), ints(args.bk), ints(args.split), ints(args.warps), ints(args.prefetch))],
        "mma_gemv": [TileConfig(rows, 0, 128, sk, w, 1, prefetch=bool(pf)) for rows, sk, w, pf in
                     itertools.product(ints(args.mma_rows), ints(args.mma_split), ints(args.mma_warps),
                                       ints(args.prefetch))],
    }
    runners = {"int4_gemv": (int4_gemv, lambda st, c, m: m == 1 and int4_gemv_supports(st, c)),
               "mma_gemv": (mma_gemv, lambda st, c, m: mma_gemv_supports(st, c, m))}
    rows, summary = [], {}
    tot: dict[str, float] = {}
    disp = AdaptiveDispatcher(autoload=False)  # what ran before this kernel: the built-in rule, no map
    for name, n, k in SHAPES:
        probe = random_store("int4", n, k, group, dev)
        stores = [probe] + [random_store("int4", n, k, group, dev) for _ in range(n_copies(probe) - 1)]
        packed = [to_tinygemm(s) for s in stores]
        floor = stores[0].nbytes() / bw * 1e6
        for m in m_list:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            ref = linear_reference(x.float(), stores[0], None)
            res = {"floor_us": floor}
            for fam in families:
                run, ok = runners[fam]
                best = None
                for cfg in fam_cfgs[fam]:
                    if not ok(stores[0], cfg, m):
                        continue
                    try:
                        y = run(x, stores[0], cfg)
                        rel = ((y.float() - ref).norm() / ref.norm()).item()
                        if not rel < 5e-3:
                            print(f"WRONG {fam} {name} M={m} {cfg.key()}: rel {rel}", flush=True)
                            continue
                        us = time_us([lambda s=s: run(x, s, cfg) for s in stores])
                    except Exception as e:  # resource limits, compile errors: report, go on
                        print(f"skip {fam} {name} {cfg.key()}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                        continue
                    rows.append({"family": fam, "shape": name, "m": m, "config": cfg.to_dict(), "us": us,
                                 "rel_err": rel})
                    if best is None or us < best[0]:
                        best = (us, cfg)
                if best is not None:
                    ys = [run(x, stores[0], best[1]) for _ in range(20)]
                    res[fam] = {"us": best[0], "config": best[1].to_dict(),
                                "reproducible": all(torch.equal(ys[0], t) for t in ys)}
            if m == 1:
                rc = rowgemv_config(n, k, group)
                res["rowgemv"] = {"us": time_us([lambda s=s: w4a16_rowgemv(x, s, rc.bn, rc.bk, rc.warps, rc.stages)
                                                 for s in stores])}
            else:
                res["dispatch_before"] = {"us": time_us([lambda s=s: disp.linear(x, s, None) for s in stores])}
            res["tinygemm"] = {"us": time_us([lambda p=p: tinygemm_linear(x, p[0], p[1], group) for p in packed])}
            summary[f"{name} M={m}"] = res
            print(f"{name:8} M={m:<2} " + "  ".join(f"{kk} {v['us']:6.1f}" for kk, v in res.items() if kk != "floor_us")
                  + f"  floor {floor:5.1f} us", flush=True)
            for kk, v in res.items():
                if kk != "floor_us":
                    tot[f"M={m} {kk}"] = tot.get(f"M={m} {kk}", 0.0) + v["us"] * 32 / 1000
            tot[f"M={m} floor"] = tot.get(f"M={m} floor", 0.0) + floor * 32 / 1000
        del stores, packed
        torch.cuda.empty_cache()
    summary["step_ms_32_layers"] = tot
    doc = {"device": torch.cuda.get_device_name(), "copy_bandwidth_Bps": bw, "group": group, "rows": rows,
           "summary": summary}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"int4_gemv_{doc['device'].replace(' ', '_')}{args.tag}.json").write_text(json.dumps(doc, indent=1))
    print(f"copy bandwidth {bw / 1e12:.3f} TB/s; 32-layer step, ms (x floor):")
    for m in m_list:
        fl = tot[f"M={m} floor"]
        print(f"  M={m}: " + "  ".join(f"{kk.split(' ', 1)[1]} {v:.3f} ({v / fl:.2f}x)" for kk, v in tot.items()
                                      if kk.startswith(f"M={m} ")))


if __name__ == "__main__":
    main()
