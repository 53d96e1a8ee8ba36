"""The warp-specialized Gluon W4A16 kernel (`kernels/w4a16_wgmma.py`) against cuBLAS bf16 and the
shipped dispatch choice, per Llama-3-8B shape and M, after a correctness pass.

1. check: every config of the sweep on small shapes (both int4 layouts, bf16 and fp16, ragged M)
   against the kernel's torch model (`w4a16_wgmma_emulate`) and the reference.
2. time: CUDA-graph replays over enough weight copies to defeat L2 (as the profiler does), the
   best config per shape, and per-step sums (x32 layers) next to cuBLAS bf16 on a dense copy and
   the shipped map's choice, measured in the same run.

Usage on the GPU: PYTHONPATH=. python benchmarks/tc_ablations/wgmma.py [--ms 128,256,...]
writes $OUT/wgmma.json (or ./wgmma.json), prints a table last.
"""
import argparse, json, os, time

import torch
import torch.nn.functional as F

from gearshift.dispatch.policy import PolicyMap, type_key
from gearshift.dispatch.profiler import PRESETS, fastest, n_copies, random_store, time_configs, time_us
from gearshift.dispatch.strategies import STRATEGIES
from gearshift.kernels.config import TileConfig
from gearshift.kernels.reference import linear_reference
from gearshift.kernels.w4a16_wgmma import w4a16_wgmma, w4a16_wgmma_emulate, wgmma_configs, wgmma_supports

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--ms", default="128,256,512,1024,2048,4096")
ap.add_argument("--layout", default="blocks16", choices=("rows", "blocks16"))
ap.add_argument("--policy", default="gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json")
ap.add_argument("--configs", default=None, help="'bm,bn,warps,stages,a_smem,maxnreg,split,bk;...' instead of wgmma_configs(m)")
ap.add_argument("--skip-check", action="store_true")
ap.add_argument("--tag", default="wgmma")
args = ap.parse_args()
torch.manual_seed(0)
dev = "cuda"
out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "layout": args.layout, "check": [],
       "time": {}}
t_start = time.time()


def configs(m):
    if args.configs:
        return [TileConfig(bm, bn, bk, sk, w, st, a_smem=bool(a), maxnreg=r) for bm, bn, w, st, a, r, sk, bk in
                (tuple(int(v) for v in c.split(",")) for c in args.configs.split(";"))]
    return wgmma_configs(m)


# --- 1. correctness ------------------------------------------------------------------------------
if not args.skip_check:
    worst = 0.0
    for layout in ("rows", "blocks16"):
        for dt in (torch.bfloat16, torch.float16):
            for n, k in ((256, 512), (384, 1024)):
                st = random_store("int4", n, k, 128, dev, layout=layout)
                for m in (1, 64, 100, 300):
                    x = torch.randn(m, k, device=dev, dtype=dt)
                    emu = w4a16_wgmma_emulate(x, st).float()
                    ref = linear_reference(x, st, None).float()
                    for cfg in configs(max(m, 64)):
                        if not wgmma_supports(st, cfg, dt):
                            continue
                        y = w4a16_wgmma(x, st, cfg).float()
                        e_emu = ((y - emu).norm() / emu.norm()).item()
                        e_ref = ((y - ref).norm() / ref.norm()).item()
                        worst = max(worst, e_emu)
                        out["check"].append({"layout": layout, "dtype": str(dt), "n": n, "k": k, "m": m,
                                             "cfg": cfg.key(), "rel_emu": e_emu, "rel_ref": e_ref})
    bad = [c for c in out["check"] if c["rel_emu"] > 5e-3 or c["rel_ref"] > 2e-2 or c["rel_emu"] != c["rel_emu"]]
    print(f"check: {len(out['check'])} runs, worst rel err vs emulation {worst:.2e}, {len(bad)} bad", flush=True)
    for c in bad[:10]:
        print("  BAD", c, flush=True)
    out["check_bad"] = len(bad)

# --- 2. timing -----------------------------------------------------------------------------------
pm = PolicyMap.load(args.policy) if os.path.exists(args.policy) else None
shapes = PRESETS["llama3-8b"]["shapes"]
layers = PRESETS["llama3-8b"]["layers"]
MS = [int(v) for v in args.ms.split(",")]
rows = []
for m in MS:
    step = {"wgmma": 0.0, "cublas": 0.0, "dispatch": 0.0}
    for name, n, k in shapes:
        st0 = random_store("int4", n, k, 128, dev, layout=args.layout)
        copies = [st0] + [random_store("int4", n, k, 128, dev, layout=args.layout) for _ in range(n_copies(st0) - 1)]
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        res = time_configs(configs(m), lambda c, st=st0: wgmma_supports(st, c, x.dtype),
                           lambda s, c: w4a16_wgmma(x, s, c), copies,
                           lambda line: print(f"  {name} M={m} {line}", flush=True))
        ok = {kk: v for kk, v in res.items() if v is not None}
        best = fastest(res)
        dense = [(torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02) for _ in range(max(2, min(8, len(copies) // 4)))]
        t_cub = time_us([lambda w=w: F.linear(x, w) for w in dense])
        del dense
        t_disp = None
        if pm is not None:
            ch = pm.lookup(type_key("w4a16", 128, n, k), m)
            if ch is not None and ch.strategy in STRATEGIES:
                run = STRATEGIES[ch.strategy].run
                t_disp = time_us([lambda s=s: run(x, s, None, ch.config) for s in copies])
                disp_name = ch.strategy + ":" + (ch.config.key() if ch.config else "-")
        out["time"].setdefault(str(m), {})[name] = {"configs": res, "best": best, "best_us": ok.get(best),
                                                    "cublas_us": t_cub, "dispatch_us": t_disp,
                                                    "dispatch": disp_name if t_disp else None}
        step["wgmma"] += layers * (ok.get(best) or float("nan"))
        step["cublas"] += layers * t_cub
        step["dispatch"] += layers * (t_disp or float("nan"))
        print(f"M={m:5d} {name:8s} wgmma {ok.get(best, float('nan')):9.1f} us ({best})  cublas {t_cub:9.1f}  "
              f"dispatch {t_disp or float('nan'):9.1f} ({disp_name if t_disp else '-'})", flush=True)
        del copies, st0
        torch.cuda.empty_cache()
    out["time"][str(m)]["step_ms"] = {kk: v / 1000 for kk, v in step.items()}
    rows.append((m, step))

out["elapsed_s"] = time.time() - t_start
path = os.path.join(os.environ.get("OUT", "."), f"{args.tag}.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1)
print(f"\nper 32-layer step, ms ({out['device']}, int4 {args.layout}):")
print(f"{'M':>6} {'wgmma':>9} {'cuBLAS':>9} {'dispatch':>9} {'wgmma/cuBLAS':>13} {'wgmma/disp':>11}")
for m, s in rows:
    print(f"{m:6d} {s['wgmma'] / 1000:9.3f} {s['cublas'] / 1000:9.3f} {s['dispatch'] / 1000:9.3f} "
          f"{s['wgmma'] / s['cublas']:13.3f} {s['wgmma'] / s['dispatch']:11.3f}")
