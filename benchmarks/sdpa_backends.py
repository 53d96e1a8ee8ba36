"""The model's prefill attention on each torch SDPA backend: the first call of each new shape, and the same
shape again, in a fresh process with a fresh driver JIT cache (what a server meets on a fresh machine).

The call is the model's (`model.attention.cache_attention`'s inputs): q [B, 32, T, 128] bf16, K/V views of a
[16, 8, 2049, 128] cache (8 K/V heads: Llama-3-8B), an additive mask. Backends: "default" (torch's choice,
enable_gqa), "cudnn", "efficient" (enable_gqa: torch 2.11 has no such kernel, recorded as the error),
"efficient_expand" (K/V heads repeated first: what the model runs), "math". Each runs in its own process with
CUDA_CACHE_PATH set to an empty folder, so runtime-compiled kernels are compiled again.
Stop 58's H200 run: cuDNN's first call of a new kind of shape 0.7-1.5 s, of any other new shape 43-68 ms;
efficient_expand 0.1-8.8 ms first calls.

Usage: python benchmarks/sdpa_backends.py [--out DIR] [--backends default,cudnn,efficient,efficient_expand,math]
writes DIR/sdpa_backends_<device>.json, prints a table last.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BACKENDS = ("default", "cudnn", "efficient", "efficient_expand", "math")
FIRST = [(15, 336, 336), (15, 337, 337), (16, 128, 128), (1, 5, 5), (4, 200, 200), (2, 100, 104), (16, 2047, 2047)]
STEADY = [(15, 336, 336), (1, 5, 5), (16, 2047, 2047)]


def child(which: str) -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    heads, kv_heads, dim, capacity = 32, 8, 128, 2049
    ck = torch.randn(16, kv_heads, capacity, dim, device="cuda", dtype=torch.bfloat16)
    cv = torch.randn_like(ck)
    backend = {"default": None, "efficient": [SDPBackend.EFFICIENT_ATTENTION], "math": [SDPBackend.MATH],
               "cudnn": [SDPBackend.CUDNN_ATTENTION], "efficient_expand": [SDPBackend.EFFICIENT_ATTENTION]}[which]

    def call(b, t, upto, reps=1):
        q = torch.randn(b, t, heads, dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        k, v = ck[:b, :, :upto], cv[:b, :, :upto]
        pos = torch.arange(t, device="cuda").view(1, t).expand(b, t) + (upto - t)
        visible = torch.arange(upto, device="cuda").view(1, 1, 1, upto) <= pos.view(b, 1, t, 1)
        mask = torch.zeros(visible.shape, dtype=torch.bfloat16, device="cuda").masked_fill_(~visible, float("-inf"))
        gqa = True
        if which == "efficient_expand":
            k, v, gqa = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1), False
        times = []
        for _ in range(reps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            if backend is None:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
            else:
                with sdpa_kernel(backend):
                    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        exp = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask.float(), enable_gqa=gqa)
        return times, float((out.float() - exp).abs().max())

    res = {"backend": which, "first": [], "steady": []}
    try:
        for b, t, u in FIRST:
            ts, err = call(b, t, u)
            res["first"].append({"b": b, "t": t, "upto": u, "ms": round(ts[0], 2), "max_err_vs_fp32": err})
        for b, t, u in STEADY:
            ts, _ = call(b, t, u, reps=6)
            res["steady"].append({"b": b, "t": t, "upto": u, "ms": round(min(ts[1:]), 3)})
    except RuntimeError as e:
        res["error"] = f"{type(e).__name__}: {str(e)[:300]}"
    res["device"], res["torch"] = torch.cuda.get_device_name(), torch.__version__
    res["cudnn"] = torch.backends.cudnn.version()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results", help="folder for the JSON (default %(default)s)")
    ap.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated, of " + ", ".join(BACKENDS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child)))
        return
    wanted = [b for b in a.backends.split(",") if b]
    bad = [b for b in wanted if b not in BACKENDS]
    if bad:
        raise SystemExit(f"unknown backends {bad}; known: {', '.join(BACKENDS)}")
    runs = []
    for which in wanted:
        with tempfile.TemporaryDirectory() as jit_cache:
            env = {**os.environ, "CUDA_CACHE_PATH": jit_cache}
            p = subprocess.run([sys.executable, __file__, "--child", which], env=env, capture_output=True, text=True)
        if p.returncode:
            raise SystemExit(f"{which}: exit {p.returncode}\n{p.stderr[-3000:]}")
        runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
    device = runs[0]["device"] if runs else "unknown"
    out = Path(a.out) / f"sdpa_backends_{re.sub(r'[^A-Za-z0-9_.-]+', '_', device).strip('_')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": device, "runs": runs}, indent=1))
    print(out)
    print(f"{'backend':>17}  first call of each new shape (ms): " + "  ".join(f"{b}x{t}" for b, t, _ in FIRST))
    for r in runs:
        print(f"{r['backend']:>17}  " + ("  ".join(f"{x['ms']:.1f}" for x in r["first"]) or r.get("error", "")))
    print(f"{'backend':>17}  same shape again (ms): " + "  ".join(f"{b}x{t}" for b, t, _ in STEADY))
    for r in runs:
        print(f"{r['backend']:>17}  " + "  ".join(f"{x['ms']:.3f}" for x in r["steady"]))


if __name__ == "__main__":
    main()
