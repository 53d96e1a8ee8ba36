"""The W4A16 wgmma kernel's weight byte tile with and without the TMA swizzle
(`kernels/w4a16_wgmma.SWIZZLE_WEIGHTS`): a correctness pass both ways, then the map's tiles per
Llama-3-8B shape at M = 128 / 256 / 512, the two variants alternated in one process (best of 2).

Usage on the GPU: PYTHONPATH=. python benchmarks/tc_ablations/wgmma_swizzle.py
writes $OUT/w16_swizzle.json (or ./w16_swizzle.json).
"""
import torch, json, os
from gearshift.dispatch.profiler import PRESETS, n_copies, random_store, time_us
from gearshift.kernels import w4a16_wgmma as W
from gearshift.kernels.config import TileConfig
torch.manual_seed(0)
# correctness both ways
st = random_store("int4", 384, 2048, 128, "cuda", layout="blocks16")
for sw in (False, True):
    W.SWIZZLE_WEIGHTS = sw
    worst = 0
    for m in (64, 200):
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        emu = W.w4a16_wgmma_emulate(x, st).float()
        for cfg in W.wgmma_configs(m):
            if W.wgmma_supports(st, cfg, x.dtype):
                y = W.w4a16_wgmma(x, st, cfg).float()
                worst = max(worst, ((y - emu).norm() / emu.norm()).item())
    print("swizzle", sw, "worst rel err vs model", worst, flush=True)
res = {}
cfgs = [TileConfig(128, 64, 64, 1, 4, 4, maxnreg=128), TileConfig(128, 64, 64, 1, 4, 4, a_smem=True, maxnreg=128),
        TileConfig(256, 64, 64, 1, 4, 4, a_smem=True), TileConfig(256, 128, 64, 1, 8, 4),
        TileConfig(128, 64, 128, 1, 4, 3, maxnreg=128)]
for m in (128, 256, 512):
    for name, n, k in PRESETS["llama3-8b"]["shapes"]:
        st0 = random_store("int4", n, k, 128, "cuda", layout="blocks16")
        copies = [st0] + [random_store("int4", n, k, 128, "cuda", layout="blocks16")
                          for _ in range(n_copies(st0) - 1)]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        for cfg in cfgs:
            if not W.wgmma_supports(st0, cfg, x.dtype) or cfg.bm > max(m, 64) * 2:
                continue
            t = {}
            for rep in range(2):
                for sw in (False, True):
                    W.SWIZZLE_WEIGHTS = sw
                    t.setdefault(sw, []).append(time_us([lambda s=s: W.w4a16_wgmma(x, s, cfg) for s in copies]))
            a, b = min(t[False]), min(t[True])
            res[f"{m}/{name}/{cfg.key()}"] = {"plain_us": a, "swizzled_us": b}
            print(f"M={m} {name:8s} {cfg.key():28s} plain {a:8.1f} swizzled {b:8.1f} ratio {b / a:.3f}", flush=True)
        del copies, st0
        torch.cuda.empty_cache()
out_path = os.path.join(os.environ.get("OUT", "."), "w16_swizzle.json")
json.dump({"device": torch.cuda.get_device_name(), "rows": res}, open(out_path, "w"), indent=1)
