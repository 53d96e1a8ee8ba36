"""The int8-wgmma W4A8 kernel (`kernels/w4a8_wgmma.py`) against the shipped W4A8 dispatch choice and
cuBLAS bf16, per Llama-3-8B shape and M, after a correctness pass.

1. check: every config on small shapes (both int4 layouts, int8 and int4 codes, ragged M): the
   kernel on quantized codes against its torch model (`w4a8_int8_wgmma_emulate`), and the whole
   path (quantizer + kernel) against the reference.
2. time: CUDA-graph replays over enough weight copies to defeat L2 (as the profiler does): every
   config on pre-quantized codes, the best one with the quantizer in front (what the engine runs),
   the shipped map's W4A8 choice and cuBLAS bf16 on a dense copy, in the same run; per-step sums.

Usage on the GPU: PYTHONPATH=. python benchmarks/tc_ablations/int8_wgmma.py [--ms 128,256,...]
writes $OUT/<tag>.json (or ./<tag>.json), prints a table last.
"""
import argparse, json, os, time

import torch
import torch.nn.functional as F

from gearshift.dispatch.policy import PolicyMap, type_key
from gearshift.dispatch.profiler import PRESETS, fastest, n_copies, random_store, time_configs, time_us
from gearshift.dispatch.strategies import STRATEGIES
from gearshift.kernels.act_quant import quantize_act_triton
from gearshift.kernels.config import TileConfig
from gearshift.kernels.reference import linear_reference
from gearshift.kernels.w4a8_wgmma import (int8_wgmma_codes, int8_wgmma_configs, int8_wgmma_supports,
                                          w4a8_int8_wgmma, w4a8_int8_wgmma_emulate)
from gearshift.quant.activations import ActQuantSpec

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--ms", default="128,256,512,1024,4096")
ap.add_argument("--layout", default="blocks16", choices=("rows", "blocks16"))
ap.add_argument("--policy", default="gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json")
ap.add_argument("--configs", default=None,
                help="'bm,bn,warps,stages,maxnreg,split;...' instead of int8_wgmma_configs(m)")
ap.add_argument("--skip-check", action="store_true")
ap.add_argument("--tag", default="int8_wgmma")
args = ap.parse_args()
torch.manual_seed(0)
dev = "cuda"
ACT = ActQuantSpec("int8")
out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "layout": args.layout, "check": [],
       "time": {}}
t_start = time.time()


def configs(m):
    if args.configs:
        return [TileConfig(bm, bn, 128, sk, w, st, maxnreg=r) for bm, bn, w, st, r, sk in
                (tuple(int(v) for v in c.split(",")) for c in args.configs.split(";"))]
    return int8_wgmma_configs(m)


# --- 1. correctness ------------------------------------------------------------------------------
if not args.skip_check:
    worst = 0.0
    for layout in ("rows", "blocks16"):
        for act in (ACT, ActQuantSpec("int4")):
            for n, k in ((256, 1024), (384, 2048)):
                st = random_store("int4", n, k, 128, dev, layout=layout)
                for m in (1, 64, 100, 300):
                    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                    codes, scales, sums = quantize_act_triton(x, act, group_sums=128, sums_by_group=True)
                    emu = w4a8_int8_wgmma_emulate(codes, scales, st, torch.float32)
                    ref = linear_reference(x.float(), st, act).float()
                    for cfg in configs(max(m, 64)):
                        if not int8_wgmma_supports(st, act, cfg):
                            continue
                        try:
                            y = int8_wgmma_codes(codes, scales, sums, st, cfg, torch.float32)
                            y2 = w4a8_int8_wgmma(x, st, act, cfg).float()
                        except Exception as e:
                            print(f"  {cfg.key()} m={m}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                            out["check"].append({"cfg": cfg.key(), "m": m, "error": str(e)[:300],
                                                 "rel_emu": float("nan"), "rel_ref": float("nan")})
                            continue
                        e_emu = ((y - emu).norm() / emu.norm()).item()
                        e_ref = ((y2 - ref).norm() / ref.norm()).item()
                        worst = max(worst, e_emu)
                        out["check"].append({"layout": layout, "act": act.dtype, "n": n, "k": k, "m": m,
                                             "cfg": cfg.key(), "rel_emu": e_emu, "rel_ref": e_ref})
    bad = [c for c in out["check"] if not (c["rel_emu"] <= 1e-5 and c["rel_ref"] <= 3e-2)]
    print(f"check: {len(out['check'])} runs, worst rel err vs emulation {worst:.2e}, {len(bad)} bad", flush=True)
    for c in bad[:10]:
        print("  BAD", c, flush=True)
    out["check_bad"] = len(bad)

# --- 2. timing -----------------------------------------------------------------------------------
pm = PolicyMap.load(args.policy) if os.path.exists(args.policy) else None
shapes = PRESETS["llama3-8b"]["shapes"]
layers = PRESETS["llama3-8b"]["layers"]
rows = []
for m in [int(v) for v in args.ms.split(",")]:
    step = {"kernel": 0.0, "int8_wgmma": 0.0, "dispatch": 0.0, "cublas": 0.0}
    for name, n, k in shapes:
        st0 = random_store("int4", n, k, 128, dev, layout=args.layout)
        copies = [st0] + [random_store("int4", n, k, 128, dev, layout=args.layout) for _ in range(n_copies(st0) - 1)]
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        codes, scales, sums = quantize_act_triton(x, ACT, group_sums=128, sums_by_group=True)
        res = time_configs(configs(m), lambda c, st=st0: int8_wgmma_supports(st, ACT, c),
                           lambda s, c: int8_wgmma_codes(codes, scales, sums, s, c, x.dtype), copies,
                           lambda line: print(f"  {name} M={m} {line}", flush=True))
        ok = {kk: v for kk, v in res.items() if v is not None}
        best = fastest(res)
        best_cfg = next((c for c in configs(m) if c.key() == best), None)
        t_full = time_us([lambda s=s: w4a8_int8_wgmma(x, s, ACT, best_cfg) for s in copies]) if best_cfg else None
        dense = [(torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02)
                 for _ in range(max(2, min(8, len(copies) // 4)))]
        t_cub = time_us([lambda w=w: F.linear(x, w) for w in dense])
        del dense
        t_disp, disp_name = None, None
        if pm is not None:
            ch = pm.lookup(type_key("w4a8", 128, n, k), m)
            if ch is not None and ch.strategy in STRATEGIES:
                run = STRATEGIES[ch.strategy].run
                t_disp = time_us([lambda s=s: run(x, s, ACT, ch.config) for s in copies])
                disp_name = ch.strategy + ":" + (ch.config.key() if ch.config else "-")
        flop = 2 * m * n * k
        out["time"].setdefault(str(m), {})[name] = {
            "configs": res, "best": best, "kernel_us": ok.get(best), "int8_wgmma_us": t_full,
            "kernel_tops": flop / ok[best] / 1e6 if best else None, "cublas_us": t_cub, "dispatch_us": t_disp,
            "dispatch": disp_name}
        step["kernel"] += layers * (ok.get(best) or float("nan"))
        step["int8_wgmma"] += layers * (t_full or float("nan"))
        step["cublas"] += layers * t_cub
        step["dispatch"] += layers * (t_disp or float("nan"))
        print(f"M={m:5d} {name:8s} kernel {ok.get(best, float('nan')):8.1f} us ({best}, "
              f"{flop / ok[best] / 1e6 if best else float('nan'):.0f} TOPS)  +quant {t_full or float('nan'):8.1f}  "
              f"dispatch {t_disp or float('nan'):8.1f} ({disp_name})  cublas {t_cub:8.1f}", flush=True)
        del copies, st0
        torch.cuda.empty_cache()
    out["time"][str(m)]["step_ms"] = {kk: v / 1000 for kk, v in step.items()}
    rows.append((m, step))

out["elapsed_s"] = time.time() - t_start
path = os.path.join(os.environ.get("OUT", "."), f"{args.tag}.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1)
print(f"\nper 32-layer step, ms ({out['device']}, int4 {args.layout}, W4A8 int8 codes):")
print(f"{'M':>6} {'kernel':>9} {'+quant':>9} {'dispatch':>9} {'cuBLAS':>9} {'bf16/+quant':>12} {'+quant/disp':>12}")
for m, s in rows:
    print(f"{m:6d} {s['kernel'] / 1000:9.3f} {s['int8_wgmma'] / 1000:9.3f} {s['dispatch'] / 1000:9.3f} "
          f"{s['cublas'] / 1000:9.3f} {s['cublas'] / s['int8_wgmma']:12.3f} {s['int8_wgmma'] / s['dispatch']:12.3f}")
