"""Sweep the small-M W4A16 kernel (kernels/w4a16_rowgemv.py: w4a16_smallm, 2 <= M <= 16) against
the dispatched W4A16 kernel and torch's int4 kernel on Llama-3-8B linear shapes (GPU).

    python benchmarks/smallm.py --out benchmarks/results
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
    ap.add_argument("--m", default="4,16")
    ap.add_argument("--group", type=int, default=128)
    ap.add_argument("--out", default="benchmarks/results")
    args = ap.parse_args()

    from gearshift.dispatch import get_dispatcher
    from gearshift.dispatch.profiler import n_copies, random_store, time_us
    from gearshift.kernels.library import tinygemm_linear, to_tinygemm
    from gearshift.kernels.reference import linear_reference
    from gearshift.kernels.w4a16_rowgemv import rowgemv_supports, w4a16_smallm

    dev, group = "cuda", args.group
    rows, summary = [], {}
    for m in [int(v) for v in args.m.split(",")]:
        tot = {"smallm": 0.0, "dispatched": 0.0, "tinygemm": 0.0}
        for name, n, k in SHAPES:
            probe = random_store("int4", n, k, group, dev)
            stores = [random_store("int4", n, k, group, dev) for _ in range(n_copies(probe))]
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            ref = linear_reference(x.float(), stores[0], None)
            best = None
            for bn, bk, w, st in itertools.product((16, 32, 64), (256, 512, 1024), (4, 8), (2, 3)):
                if not rowgemv_supports(stores[0], bk):
                    continue
                try:
                    y = w4a16_smallm(x, stores[0], bn, bk, w, st)
                    rel = ((y.float() - ref).norm() / ref.norm()).item()
                    if not rel < 5e-3:
                        print(f"WRONG m{m} {name} bn{bn} bk{bk}: {rel}")
                        continue
                    us = time_us([lambda s=s: w4a16_smallm(x, s, bn, bk, w, st) for s in stores])
                except Exception as e:
                    print(f"skip m{m} {name} bn{bn} bk{bk} w{w} s{st}: {type(e).__name__}")
                    continue
                rows.append({"m": m, "shape": name, "bn": bn, "bk": bk, "warps": w, "stages": st, "us": us})
                if best is None or us < best[0]:
                    best = (us, bn, bk, w, st)
            disp = time_us([lambda s=s: get_dispatcher().linear(x, s, None) for s in stores])
            packed = [to_tinygemm(s) for s in stores]
            tg = time_us([lambda p=p: tinygemm_linear(x, p[0], p[1], group) for p in packed])
            print(f"m{m} {name:8} smallm {best[0]:7.1f} us (bn{best[1]} bk{best[2]} w{best[3]} s{best[4]})  "
                  f"dispatched {disp:7.1f}  tinygemm {tg:7.1f}", flush=True)
            summary[f"m{m} {name}"] = {"smallm_us": best[0], "config": best[1:], "dispatched_us": disp, "tinygemm_us": tg}
            tot["smallm"] += best[0]
            tot["dispatched"] += disp
            tot["tinygemm"] += tg
            del stores, packed
            torch.cuda.empty_cache()
        summary[f"m{m} step_ms_32_layers"] = {k2: v * 32 / 1000 for k2, v in tot.items()}
        print(f"m{m} step ms (32 layers):", {k2: round(v * 32 / 1000, 3) for k2, v in tot.items()}, flush=True)
    doc = {"device": torch.cuda.get_device_name(), "group": group, "rows": rows, "summary": summary}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"smallm_{doc['device'].replace(' ', '_')}.json").write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
