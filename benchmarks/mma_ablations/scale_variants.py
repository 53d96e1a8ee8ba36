"""The fragment kernel with its per-block scale loads replaced (group 0 only, or constants), one
variant per process because Triton caches the kernel by source (GPU timing only).
Usage: for v in full scales_g0 scales_const; do PYTHONPATH=. python benchmarks/mma_ablations/scale_variants.py $v; done
"""
import torch, triton, triton.language as tl
import gearshift.kernels.int4_mma_gemv as mg
from gearshift.kernels.config import TileConfig
from gearshift.dispatch.profiler import n_copies, random_store, time_us

@triton.jit
def _scales_cached(s_ptr, mn_ptr, offs, g, ROWS: tl.constexpr, HINT: tl.constexpr):
    sa = tl.load(s_ptr + offs[0])
    ma = tl.load(mn_ptr + offs[0])
    sb = tl.load(s_ptr + offs[1])
    mb = tl.load(mn_ptr + offs[1])
    return sa, ma, sb, mb, sa, ma, sb, mb

@triton.jit
def _scales_const(s_ptr, mn_ptr, offs, g, ROWS: tl.constexpr, HINT: tl.constexpr):
    one = (offs[0] * 0 + 1).to(tl.float16)
    return one, one, one, one, one, one, one, one

import sys
dev = "cuda"
orig = mg._load_scales
choice = sys.argv[1]
for n, k in ((28672, 4096), (4096, 4096)):
    probe = random_store("int4", n, k, 128, dev)
    stores = [probe] + [random_store("int4", n, k, 128, dev) for _ in range(n_copies(probe) - 1)]
    x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
    for name, fn in [v for v in (("full", orig), ("scales_g0", _scales_cached), ("scales_const", _scales_const)) if v[0] == choice]:
        mg._load_scales = fn
        mg._mma_gemv_kernel.cache.clear() if hasattr(mg._mma_gemv_kernel, "cache") else None
        try:
            mg._mma_gemv_kernel.device_caches.clear()
        except Exception:
            pass
        for sk in ((2,) if n > 5000 else (8,)):
            for pf in (False, True):
                cfg = TileConfig(16, 0, 128, sk, 4, 1, prefetch=pf)
                us = time_us([lambda s=s: mg.mma_gemv(x, s, cfg) for s in stores])
                print(f"{n}x{k} {name:12} split{sk} depth{2 if pf else 1}: {us:6.1f} us", flush=True)
