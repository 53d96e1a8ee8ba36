"""What Triton's tl.dot reaches at large M on this stack: dense bf16 swap-AB (v0), dense plain
x @ W^T (v1), int4 dequantized as the plain B operand (v2), against cuBLAS, do_bench medians.
Usage on the GPU: PYTHONPATH=. python benchmarks/tc_ablations/ceiling.py; writes $OUT/ceiling.json
(benchmarks/results/tc_ceiling_*.json).
"""
import argparse, json, os, sys
import torch, triton
sys.path.insert(0, os.path.dirname(__file__))
import variants as exp16
from gearshift.quant.int4 import quantize_int4
from triton.testing import do_bench

from gearshift.dispatch.profiler import PRESETS
argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
torch.manual_seed(0)
SHAPES = {name: (n, k) for name, n, k in PRESETS["llama3-8b"]["shapes"]}
CFGS = [(128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 128, 8, 3), (128, 128, 64, 4, 4)]
res = {}
for m in (1024, 4096):
    for name, (n, k) in SHAPES.items():
        st = quantize_int4(torch.randn(n, k, device="cuda") * 0.02, 128)
        wd = st.dequantize(torch.bfloat16)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        ref = x.float() @ wd.float().T
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        res[f"cublas|{name}:{m}"] = do_bench(lambda: torch.matmul(x, wd.T), warmup=10, rep=40, return_mode="median")
        for var in (0, 1, 2):
            for cfg in CFGS:
                bm, bn, bk, w, s = cfg
                bmv, bnv = (bm, bn)
                f = lambda: exp16.ceiling[(triton.cdiv(n, bnv), triton.cdiv(m, bmv))](
                    x, wd, st.qweight, st.scales, st.mins, y, m, n, k, x.stride(0), y.stride(0),
                    G=128, BM=bmv, BN=bnv, BK=bk, VAR=var, GROUP=8, num_warps=w, num_stages=s)
                try:
                    f(); err = ((y.float() - ref).norm() / ref.norm()).item()
                    t = do_bench(f, warmup=10, rep=40, return_mode="median")
                except Exception as e:
                    t, err = None, str(e)[-100:]
                res[f"v{var}|{cfg}|{name}:{m}"] = t
                if err is None or (isinstance(err, float) and err > 1e-2) or isinstance(err, str):
                    print("bad", var, cfg, name, m, err)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "ceiling.json"), "w"), indent=1)
for m in (1024, 4096):
    row = [f"M={m}", "cublas %.2f" % (32 * sum(res[f"cublas|{nm}:{m}"] for nm in SHAPES))]
    for var in (0, 1, 2):
        tot = 0
        for nm in SHAPES:
            ts = [v for kk, v in res.items() if kk.startswith(f"v{var}|") and kk.endswith(f"|{nm}:{m}") and v]
            tot += min(ts) if ts else float("nan")
        row.append(f"v{var} {32 * tot:.2f}")
    print(" | ".join(row))
for cfg in CFGS:
    print(cfg, [f"v{v}:{32*sum(res.get(f'v{v}|{cfg}|{nm}:4096') or float('nan') for nm in SHAPES):.1f}" for v in (0, 1, 2)])
