import json, os, torch
from gearshift.dispatch.profiler import n_copies, random_store, time_us
from gearshift.kernels.config import TileConfig
from gearshift.kernels.w4a16_wgmma_small import w4a16_wgmma_small, w4a16_wgmma_small_emulate, small_supports
from gearshift.dispatch.policy import PolicyMap, type_key
from gearshift.dispatch.strategies import STRATEGIES
torch.manual_seed(0)
CF = [(8, 64, 4, 4, 64, 1, 1), (8, 64, 4, 4, 96, 1, 1), (8, 64, 4, 4, 64, 2, 1), (8, 64, 4, 4, 64, 4, 1), (8, 64, 4, 4, 96, 4, 1),
      (8, 64, 4, 4, 64, 1, 2), (8, 64, 4, 2, 64, 1, 4), (8, 64, 4, 8, 64, 1, 1), (8, 64, 4, 3, 64, 4, 2), (8, 64, 4, 4, 64, 8, 1), (8, 64, 4, 6, 64, 2, 1)]
cfgs = [TileConfig(bm, bn, 128 * g, sk, w, st, maxnreg=r) for bm, bn, w, st, r, sk, g in CF]
worst = 0
for layout in ("rows", "blocks16"):
    st = random_store("int4", 384, 2048, 128, "cuda", layout=layout)
    for m in (1, 5, 8):
        x = torch.randn(m, 2048, device="cuda", dtype=torch.bfloat16)
        emu = w4a16_wgmma_small_emulate(x, st).float()
        for c in cfgs:
            if not small_supports(st, c, x.dtype):
                continue
            y = w4a16_wgmma_small(x, st, c, sync_mma=True).float()
            worst = max(worst, ((y - emu).norm() / emu.norm()).item())
print("sync_mma check worst rel err vs model", worst, flush=True)
pm = PolicyMap.load("gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json")
res = {}
tot = {}
for name, n, k in (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)):
    st0 = random_store("int4", n, k, 128, "cuda", layout="blocks16")
    copies = [st0] + [random_store("int4", n, k, 128, "cuda", layout="blocks16") for _ in range(n_copies(st0) - 1)]
    for m in (1, 8):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ts = {c.key(): time_us([lambda s=s, c=c: w4a16_wgmma_small(x, s, c, sync_mma=True) for s in copies]) for c in cfgs if small_supports(st0, c, x.dtype)}
        b = min(ts, key=ts.get)
        ch = pm.lookup(type_key("w4a16", 128, n, k), m)
        run = STRATEGIES[ch.strategy].run
        td = time_us([lambda s=s: run(x, s, None, ch.config) for s in copies])
        res[f"{name}:{m}"] = {"sync_mma": ts, "best": b, "dispatch_us": td}
        tot.setdefault(m, [0, 0]); tot[m][0] += 32 * ts[b]; tot[m][1] += 32 * td
        print(f"{name:8s} M={m} sync_mma {ts[b]:6.1f} ({b})  dispatch {td:6.1f} ({ch.strategy})", flush=True)
    del copies, st0
    torch.cuda.empty_cache()
for m, (a, d) in tot.items():
    print(f"step M={m}: sync_mma {a/1000:.3f} ms  dispatch {d/1000:.3f} ms  ratio {a/d:.3f}")
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "syncmma.json"), "w"), indent=1)
