import json, os, torch
from gearshift.dispatch.profiler import n_copies, random_store, time_us
from gearshift.kernels.config import TileConfig
from gearshift.kernels.w4a16_wgmma_small import w4a16_wgmma_small, w4a16_wgmma_small_emulate, small_configs
from gearshift.dispatch.policy import PolicyMap, type_key
torch.manual_seed(0)
st = random_store("int4", 384, 2048, 128, "cuda", layout="blocks16")
worst = 0
for m in (1, 5, 8, 16, 29):
    x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
    emu = w4a16_wgmma_small_emulate(x, st).float()
    for cfg in small_configs(m):
        y = w4a16_wgmma_small(x, st, cfg, halves=True).float()
        worst = max(worst, ((y - emu).norm() / emu.norm()).item())
print("halves check worst", worst, flush=True)
pm = PolicyMap.load("gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json")
res = {}
for name, n, k in (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)):
    st0 = random_store("int4", n, k, 128, "cuda", layout="blocks16")
    copies = [st0] + [random_store("int4", n, k, 128, "cuda", layout="blocks16") for _ in range(n_copies(st0) - 1)]
    for m in (1, 16, 32):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        cfgs = small_configs(m)
        ch = pm.lookup(type_key("w4a16", 128, n, k), m)
        if ch.strategy == "w4a16_wgmma_small" and all(c.key() != ch.config.key() for c in cfgs):
            cfgs = [ch.config] + cfgs
        best = {}
        for hv in (False, True):
            ts = {c.key(): time_us([lambda s=s, c=c: w4a16_wgmma_small(x, s, c, halves=hv) for s in copies]) for c in cfgs}
            b = min(ts, key=ts.get)
            best[hv] = (ts[b], b)
        res[f"{name}:{m}"] = {"one_chain": best[False], "halves": best[True]}
        print(f"{name:8s} M={m:3d} one chain {best[False][0]:6.1f} ({best[False][1]})  halves {best[True][0]:6.1f} ({best[True][1]})", flush=True)
    del copies, st0
    torch.cuda.empty_cache()
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "halves.json"), "w"), indent=1)
