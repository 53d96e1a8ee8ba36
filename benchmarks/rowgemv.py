"""Sweep the single-token W4A16 GEMV (kernels/w4a16_rowgemv.py) against the dispatched W4A16
kernel and torch's int4 kernel at M = 1 on Llama-3-8B linear shapes (GPU).

Times are CUDA-graph replays over enough weight copies to exceed L2 (dispatch.profiler.time_us).
Prints the best tile per shape and the 32-layer step sums; writes JSON.

    python benchmarks/rowgemv.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch

from gearshift.dispatch.profiler import PRESETS

SHAPES = PRESETS["llama3-8b"]["shapes"]  # (name, N, K) of the Llama-3-8B linears


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--groups", default="128,-1")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--bn", default="4,8,16,32")
    ap.add_argument("--bk", default="256,512,1024,2048")
    ap.add_argument("--warps", default="2,4,8")
    ap.add_argument("--stages", default="2,3,4")
    args = ap.parse_args()
    global BN_LIST, BK_LIST, WARPS, STAGES
    BN_LIST, BK_LIST, WARPS, STAGES = ([int(v) for v in a.split(",")] for a in (args.bn, args.bk, args.warps, args.stages))

    from gearshift.dispatch import get_dispatcher
    from gearshift.dispatch.profiler import n_copies, random_store, time_us
    from gearshift.kernels.library import tinygemm_linear, to_tinygemm
    from gearshift.kernels.reference import linear_reference
    from gearshift.kernels.w4a16_rowgemv import rowgemv_supports, w4a16_rowgemv

    dev = "cuda"
    rows = []
    summary = {}
    for group in [int(g) for g in args.groups.split(",")]:
        tot = {"rowgemv_best": 0.0, "dispatched": 0.0, "tinygemm": 0.0, "floor_bytes": 0}
        for name, n, k in SHAPES:
            stores = [random_store("int4", n, k, group, dev) for _ in range(n_copies(random_store("int4", n, k, group, dev)))]
            x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
            ref = linear_reference(x.float(), stores[0], None)
            best = None
            for bn, bk, w, st in itertools.product(BN_LIST, BK_LIST, WARPS, STAGES):
                if not rowgemv_supports(stores[0], bk):
                    continue
                try:
                    y = w4a16_rowgemv(x, stores[0], bn, bk, w, st)
                    rel = ((y.float() - ref).norm() / ref.norm()).item()
                    if not rel < 5e-3:
                        print(f"WRONG {name} g{group} bn{bn} bk{bk}: rel {rel}")
                        continue
                    us = time_us([lambda s=s: w4a16_rowgemv(x, s, bn, bk, w, st) for s in stores])
                except Exception as e:  # resource limits for big tiles
                    print(f"skip {name} bn{bn} bk{bk} w{w} s{st}: {type(e).__name__}")
                    continue
                rows.append({"shape": name, "group": group, "bn": bn, "bk": bk, "warps": w, "stages": st, "us": us})
                if best is None or us < best[0]:
                    best = (us, bn, bk, w, st)
            disp = time_us([lambda s=s: get_dispatcher().linear(x, s, None) for s in stores])
            tg = None
            if group in (32, 64, 128, 256):
                packed = [to_tinygemm(s) for s in stores]
                tg = time_us([lambda p=p: tinygemm_linear(x, p[0], p[1], group) for p in packed])
            nbytes = stores[0].nbytes()
            print(f"g{group} {name:8} best rowgemv {best[0]:7.1f} us (bn{best[1]} bk{best[2]} w{best[3]} s{best[4]})"
                  f"  dispatched {disp:7.1f}  tinygemm {tg if tg is None else round(tg, 1)}"
                  f"  floor {nbytes / 3.0e12 * 1e6:6.1f}", flush=True)
            summary[f"g{group} {name}"] = {"rowgemv_us": best[0], "config": best[1:], "dispatched_us": disp,
                                            "tinygemm_us": tg, "bytes": nbytes}
            tot["rowgemv_best"] += best[0]
            tot["dispatched"] += disp
            tot["tinygemm"] += tg or 0.0
            tot["floor_bytes"] += nbytes
            del stores
            torch.cuda.empty_cache()
        summary[f"g{group} step_ms_32_layers"] = {k2: (v * 32 / 1000 if k2 != "floor_bytes" else v * 32)
                                                  for k2, v in tot.items()}
    doc = {"device": torch.cuda.get_device_name(), "rows": rows, "summary": summary}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rowgemv_{doc['device'].replace(' ', '_')}.json").write_text(json.dumps(doc, indent=1))
    for key, v in summary.items():
        if "step_ms" in key:
            print(key, {k2: round(x, 3) if isinstance(x, float) else x for k2, x in v.items()})


if __name__ == "__main__":
    main()
