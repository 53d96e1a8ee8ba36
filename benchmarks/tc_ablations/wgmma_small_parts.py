import json, os, torch
from gearshift.dispatch.profiler import n_copies, random_store, time_us
from gearshift.kernels.config import TileConfig
from gearshift.kernels.w4a16_wgmma_small import w4a16_wgmma_small
res = {}
for name, n, k, m, cfgs in (("gate_up", 28672, 4096, 1, [(8, 64, 4, 4, 64, 1, 1), (8, 64, 4, 4, 64, 1, 2), (8, 64, 4, 4, 96, 1, 1), (8, 128, 8, 4, 0, 1, 1)]),
                            ("down", 4096, 14336, 1, [(8, 64, 4, 4, 96, 4, 1), (8, 64, 4, 4, 64, 4, 2)]),
                            ("qkv", 6144, 4096, 1, [(8, 64, 4, 4, 64, 4, 1)])):
    st0 = random_store("int4", n, k, 128, "cuda", layout="blocks16")
    copies = [st0] + [random_store("int4", n, k, 128, "cuda", layout="blocks16") for _ in range(n_copies(st0) - 1)]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    for bm, bn, w, stg, r, sk, gps in cfgs:
        cfg = TileConfig(bm, bn, 128 * gps, sk, w, stg, maxnreg=r)
        row = {}
        for ab in (0, 1, 2, "ones"):
            kw = {"warp_sums": False} if ab == "ones" else {"ablate": ab}
            row[ab] = time_us([lambda s=s: w4a16_wgmma_small(x, s, cfg, **kw) for s in copies])
        res[f"{name}:{cfg.key()}"] = row
        print(f"{name:8s} {cfg.key():24s} " + " ".join(f"{ab}:{v:6.1f}" for ab, v in row.items()), flush=True)
    # pure read of the same bytes (torch copy of the packed weights) for reference
    t_copy = time_us([lambda s=s: s.qweight.clone() for s in copies])
    print(f"{name:8s} clone of qweight (read+write) {t_copy:6.1f} us, bytes {st0.nbytes()/1e6:.1f} MB", flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "ablate_small.json"), "w"), indent=1)
