"""Mid-M W4A16 tile sweep: the tl.dot kernel (packed-PTX dequant, deterministic split-K) over the
profiler's configs and a wider list, against cuBLAS bf16, on the Llama-3-8B shapes.
Timed like the profiler (CUDA-graph replays over enough weight copies to defeat L2).
Usage on the GPU: PYTHONPATH=. python benchmarks/tc_ablations/midm.py [--ms 16,64,...] [--plain];
writes $OUT/midm.json, prints per-step ms (best tile per shape, x32 layers).
"""
import argparse, json, os, sys, time
import torch
import triton
sys.path.insert(0, os.path.dirname(__file__))
import plain_b
from gearshift.kernels.tiles import tile_buffers
from gearshift.dispatch.profiler import PRESETS, n_copies, random_store, time_us
from gearshift.dispatch.strategies import a16_configs
from gearshift.kernels.config import TileConfig, block_m_for
from gearshift.kernels.w4a16 import w4a16_linear, w4a16_reference

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--ms", default="16,32,64,128,256,512,1024,4096")
ap.add_argument("--tag", default="midm")
ap.add_argument("--sweep", default=None, help="override the wide sweep: 'bn,bk,split,warps,stages;...'")
ap.add_argument("--no-profiler-configs", action="store_true", help="time only the wide sweep")
ap.add_argument("--plain", action="store_true", help="also time plain_b.py (weight as the B operand) on the sweep")
args = ap.parse_args()
torch.manual_seed(0)
dev = "cuda"
SHAPES = {name: (n, k) for name, n, k in PRESETS["llama3-8b"]["shapes"]}
MS = [int(m) for m in args.ms.split(",")]
SWEEP = [(64, 128, 1, 4, 3), (64, 128, 2, 4, 3), (64, 128, 4, 4, 3), (64, 128, 8, 4, 3), (64, 64, 4, 4, 4),
         (64, 128, 2, 4, 4), (32, 128, 4, 4, 3), (128, 128, 1, 8, 3), (128, 128, 2, 8, 3), (128, 64, 1, 4, 4),
         (128, 64, 2, 4, 4), (128, 128, 1, 4, 3), (128, 128, 2, 4, 3), (128, 128, 4, 4, 3), (256, 64, 1, 8, 3),
         (128, 128, 4, 8, 3)]
if args.sweep:
    SWEEP = [tuple(int(v) for v in item.split(",")) for item in args.sweep.split(";")]


def sweep(m):
    bms = sorted({block_m_for(m, 64), block_m_for(m, 128)} | ({256} if m >= 256 else set()))
    out = []
    for bm in bms:
        for bn, bk, sk, w, st in SWEEP:
            if bm == 256 and not (bk == 64 and w == 8):
                continue
            if bm >= 128 and sk > 1 and m >= 512:
                continue
            out.append(TileConfig(bm, bn, bk, sk, w, st, False, True))
    return out


def plain_linear(x2, store, cfg):
    m, k = x2.shape
    n = store.out_features
    y = torch.empty((m, n), device=x2.device, dtype=x2.dtype)
    grid = (triton.cdiv(n, cfg.bn), triton.cdiv(m, cfg.bm), cfg.split_k)
    ws, cnt = tile_buffers(y, cfg.split_k, grid)
    plain_b.w4a16_plain_b[grid](x2, store.qweight, store.scales, store.mins, y, ws, cnt, m, n, k, x2.stride(0),
                                y.stride(0), G=store.group_size, BM=cfg.bm, BN=cfg.bn, BK=cfg.bk,
                                SPLIT_K=cfg.split_k, num_warps=cfg.warps, num_stages=cfg.stages)
    return y


def timed(label, fn_of_store, stores, x, ref):
    try:
        y = fn_of_store(stores[0])
        err = ((y.float() - ref).norm() / ref.norm()).item()
        return err, time_us([lambda s=s: fn_of_store(s) for s in stores])
    except Exception as e:  # a tile that does not fit (shared memory) or compile
        print("fail", label, str(e)[-160:], flush=True)
        return None, None


res = {"device": torch.cuda.get_device_name(), "t": {}, "err": {}}
t0 = time.time()
for name, (n, k) in SHAPES.items():
    st0 = random_store("int4", n, k, 128, dev)
    stores = [st0] + [random_store("int4", n, k, 128, dev) for _ in range(n_copies(st0) - 1)]
    dense = [s.dequantize(torch.bfloat16) for s in stores[:4]]
    for m in MS:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        ref = w4a16_reference(x, st0).float()
        res["t"][f"cublas|{name}|{m}"] = time_us([lambda d=d: torch.matmul(x, d.T) for d in dense])
        for label, fn, cfgs in (("cur", w4a16_linear, [] if args.no_profiler_configs else a16_configs(m)),
                                ("wide", w4a16_linear, sweep(m)),
                                ("plain", plain_linear, [c for c in sweep(m) if c.bm >= 64] if args.plain else [])):
            for cfg in cfgs:
                err, t = timed((label, cfg.key()), lambda s, cfg=cfg, fn=fn: fn(x, s, cfg), stores, x, ref)
                res["t"][f"{label}|{cfg.key()}|{name}|{m}"] = t
                res["err"][f"{label}|{cfg.key()}|{name}|{m}"] = err
        print(f"{name} M={m} {time.time() - t0:.0f}s", flush=True)
    del stores, dense
    torch.cuda.empty_cache()
    json.dump(res, open(os.path.join(os.environ.get("OUT", "."), args.tag + ".json"), "w"), indent=1)


def step(label, m):
    tot = 0.0
    for name in SHAPES:
        ts = [(v, kk) for kk, v in res["t"].items() if kk.startswith(label + "|") and kk.endswith(f"|{name}|{m}") and v]
        if not ts:
            return None, None
        tot += min(ts)[0]
    return 32 * tot / 1000.0, None


print("M | cublas | profiler configs | wide sweep | plain B operand   [ms per 32-layer step]")
for m in MS:
    row = [step(lbl, m)[0] for lbl in ("cublas", "cur", "wide", "plain")]
    print(f"{m} | " + " | ".join("-" if v is None else f"{v:.2f}" for v in row))
for lbl in ("cur", "wide", "plain"):
    e = [v for kk, v in res["err"].items() if kk.startswith(lbl + "|") and v is not None]
    print(lbl, "max rel err", max(e) if e else None)
for name in SHAPES:
    for m in MS:
        best = min(((v, kk) for kk, v in res["t"].items() if not kk.startswith("cublas|")
                    and kk.endswith(f"|{name}|{m}") and v), default=(None, None))
        print("best", name, m, best)
