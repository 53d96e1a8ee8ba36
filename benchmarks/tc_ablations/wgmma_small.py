"""The few-token scale-after wgmma kernel (`kernels/w4a16_wgmma_small.py`) against the shipped map's
choice, per Llama-3-8B shape and M, after a correctness pass.

1. check: a few configs per token tile on small shapes (both int4 layouts, bf16 and fp16, ragged
   M, split-K, activation codes with token scales): the kernel against its torch model
   (`w4a16_wgmma_small_emulate`) and against the reference.
2. time: CUDA-graph replays over enough weight copies to defeat L2 (as the profiler does): every
   config of the sweep, and the shipped map's W4A16 choice in the same run; per-step sums of the
   per-shape bests. With --w4a8 also the W4A8 path (quantizer + kernel) against the map's W4A8 choice.

Usage on the GPU: PYTHONPATH=. python benchmarks/tc_ablations/wgmma_small.py [--ms 1,2,4,8,16,32]
writes $OUT/<tag>.json (or ./<tag>.json), prints a table last.
"""
import argparse, itertools, json, os, time

import torch

from gearshift.dispatch.policy import PolicyMap, type_key
from gearshift.dispatch.profiler import PRESETS, fastest, n_copies, random_store, time_configs, time_us
from gearshift.dispatch.strategies import STRATEGIES
from gearshift.kernels.act_quant import quantize_act_triton
from gearshift.kernels.config import TileConfig
from gearshift.kernels.reference import linear_reference
from gearshift.kernels.w4a16_wgmma_small import (BMS, small_configs, small_supports, w4a8_wgmma_small,
                                                 w4a16_wgmma_small, w4a16_wgmma_small_emulate)
from gearshift.quant.activations import ActQuantSpec

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--ms", default="1,2,4,8,16,32")
ap.add_argument("--layout", default="blocks16", choices=("rows", "blocks16"))
ap.add_argument("--policy", default="gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json")
ap.add_argument("--sweep", action="store_true", help="a wider tile sweep than small_configs(m)")
ap.add_argument("--w4a8", action="store_true", help="also time the W4A8 path against the map's W4A8 choice")
ap.add_argument("--skip-check", action="store_true")
ap.add_argument("--tag", default="wgmma_small")
args = ap.parse_args()
torch.manual_seed(0)
dev = "cuda"
out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "layout": args.layout, "check": [],
       "time": {}}
t_start = time.time()


def token_tile(m):
    return next(b for b in BMS if b >= m)


def configs(m):
    if not args.sweep:
        return small_configs(m)
    bm = token_tile(m)
    res = []
    for (bn, w, regs), gps, sk in itertools.product(((64, 4, 64), (64, 4, 96), (128, 8, 0), (128, 8, 80)),
                                                   (1, 2, 4), (1, 2, 4, 8)):
        if w == 8 and gps == 4:
            continue
        for depth in ((4, 8) if gps == 1 else (8,)):  # groups in flight per CTA
            res.append(TileConfig(bm, bn, 128 * gps, sk, w, depth // gps, maxnreg=regs))
    return res


# --- 1. correctness ------------------------------------------------------------------------------
if not args.skip_check:
    worst = 0.0
    for layout, dt in (("rows", torch.bfloat16), ("blocks16", torch.bfloat16), ("blocks16", torch.float16)):
        for n, k in ((256, 1024), (384, 2048)):
            st = random_store("int4", n, k, 128, dev, layout=layout)
            for m in (1, 3, 8, 13, 16, 32):
                x = torch.randn(m, k, device=dev, dtype=dt)
                emu = w4a16_wgmma_small_emulate(x.float(), st).float()
                ref = linear_reference(x.float(), st, None).float()
                for cfg in small_configs(m)[:6]:
                    if not small_supports(st, cfg, dt):
                        continue
                    try:
                        y = w4a16_wgmma_small(x.float().to(dt), st, cfg).float()
                    except Exception as e:
                        print(f"  {cfg.key()} m={m}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                        out["check"].append({"cfg": cfg.key(), "m": m, "error": str(e)[:300],
                                             "rel_emu": float("nan"), "rel_ref": float("nan")})
                        continue
                    e_emu = ((y - emu).norm() / emu.norm()).item()
                    e_ref = ((y - ref).norm() / ref.norm()).item()
                    worst = max(worst, e_emu)
                    out["check"].append({"layout": layout, "dtype": str(dt), "n": n, "k": k, "m": m,
                                         "cfg": cfg.key(), "rel_emu": e_emu, "rel_ref": e_ref})
            for act in (ActQuantSpec("int8"), ActQuantSpec("int4")):  # codes with token scales
                x = torch.randn(5, k, device=dev, dtype=dt)
                ref = linear_reference(x.float(), st, act).float()
                codes, scales = quantize_act_triton(x, act, codes_dtype=dt)
                emu = w4a16_wgmma_small_emulate(codes, st, scales).float()
                cfg = small_configs(5)[0]
                y = w4a8_wgmma_small(x, st, act, cfg).float()
                e_emu = ((y - emu).norm() / emu.norm()).item()
                worst = max(worst, e_emu)
                out["check"].append({"layout": layout, "dtype": str(dt), "act": act.dtype, "n": n, "k": k, "m": 5,
                                     "cfg": cfg.key(), "rel_emu": e_emu,
                                     "rel_ref": ((y - ref).norm() / ref.norm()).item()})
    bad = [c for c in out["check"] if not (c["rel_emu"] <= 2e-3 and c["rel_ref"] <= 3e-2)]
    print(f"check: {len(out['check'])} runs, worst rel err vs emulation {worst:.2e}, {len(bad)} bad", flush=True)
    for c in bad[:10]:
        print("  BAD", c, flush=True)
    out["check_bad"] = len(bad)

# --- 2. timing -----------------------------------------------------------------------------------
pm = PolicyMap.load(args.policy) if os.path.exists(args.policy) else None
shapes = PRESETS["llama3-8b"]["shapes"]
layers = PRESETS["llama3-8b"]["layers"]
rows = []


def dispatch_time(mode, x, copies, n, k, m, act):
    if pm is None:
        return None, None
    ch = pm.lookup(type_key(mode, 128, n, k), m)
    if ch is None or ch.strategy not in STRATEGIES:
        return None, None
    run = STRATEGIES[ch.strategy].run
    return (time_us([lambda s=s: run(x, s, act, ch.config) for s in copies]),
            ch.strategy + ":" + (ch.config.key() if ch.config else "-"))


for m in [int(v) for v in args.ms.split(",")]:
    step = {"small": 0.0, "dispatch": 0.0, "small_w4a8": 0.0, "dispatch_w4a8": 0.0}
    for name, n, k in shapes:
        st0 = random_store("int4", n, k, 128, dev, layout=args.layout)
        copies = [st0] + [random_store("int4", n, k, 128, dev, layout=args.layout) for _ in range(n_copies(st0) - 1)]
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        res = time_configs(configs(m), lambda c, st=st0: small_supports(st, c, x.dtype),
                           lambda s, c: w4a16_wgmma_small(x, s, c), copies,
                           lambda line: print(f"  {name} M={m} {line}", flush=True))
        ok = {kk: v for kk, v in res.items() if v is not None}
        best = fastest(res)
        t_disp, disp_name = dispatch_time("w4a16", x, copies, n, k, m, None)
        rec = {"configs": res, "best": best, "small_us": ok.get(best), "dispatch_us": t_disp, "dispatch": disp_name,
               "floor_bytes": st0.nbytes()}
        step["small"] += layers * (ok.get(best) or float("nan"))
        step["dispatch"] += layers * (t_disp or float("nan"))
        line = (f"M={m:3d} {name:8s} small {ok.get(best, float('nan')):7.1f} us ({best})  "
                f"dispatch {t_disp or float('nan'):7.1f} ({disp_name})")
        if args.w4a8 and best is not None:
            act = ActQuantSpec("int8")
            cfg = next(c for c in configs(m) if c.key() == best)
            t8 = time_us([lambda s=s: w4a8_wgmma_small(x, s, act, cfg) for s in copies])
            t8d, d8 = dispatch_time("w4a8", x, copies, n, k, m, act)
            rec.update({"small_w4a8_us": t8, "dispatch_w4a8_us": t8d, "dispatch_w4a8": d8})
            step["small_w4a8"] += layers * t8
            step["dispatch_w4a8"] += layers * (t8d or float("nan"))
            line += f"  | w4a8 small {t8:7.1f} dispatch {t8d or float('nan'):7.1f} ({d8})"
        out["time"].setdefault(str(m), {})[name] = rec
        print(line, flush=True)
        del copies, st0
        torch.cuda.empty_cache()
    out["time"][str(m)]["step_ms"] = {kk: v / 1000 for kk, v in step.items()}
    rows.append((m, step))

out["elapsed_s"] = time.time() - t_start
path = os.path.join(os.environ.get("OUT", "."), f"{args.tag}.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1)
print(f"\nper 32-layer step, ms ({out['device']}, int4 {args.layout}; per-shape bests):")
print(f"{'M':>4} {'small':>8} {'dispatch':>9} {'ratio':>7}" + (f" {'w4a8 sm':>8} {'w4a8 map':>9} {'ratio':>7}"
                                                              if args.w4a8 else ""))
for m, s in rows:
    line = f"{m:4d} {s['small'] / 1000:8.3f} {s['dispatch'] / 1000:9.3f} {s['small'] / s['dispatch']:7.3f}"
    if args.w4a8:
        line += (f" {s['small_w4a8'] / 1000:8.3f} {s['dispatch_w4a8'] / 1000:9.3f} "
                 f"{s['small_w4a8'] / s['dispatch_w4a8']:7.3f}")
    print(line)
