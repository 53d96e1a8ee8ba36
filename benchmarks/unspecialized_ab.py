"""A/B of the large-M Gluon kernels with M and the stream-K run lengths unspecialized (as shipped) against the
same kernel with Triton's default specialization (an int argument = 1, divisible by 16, or neither, compiled
apart), on Llama-3-8B linear shapes and prefill token counts.

Why: a server meets every prefill token count; each class of (M, per, dpt) was a compile of its own, and one
the warm-up had not met stalled a running batch for 4.4 s (H200, stop 59). This measures what dropping the
specialization costs per call, and counts the compiles each form makes over the token counts.

Usage: python benchmarks/unspecialized_ab.py [--m 300,1000,2047,4995] [--out DIR]
writes DIR/unspecialized_ab_<device>.json, prints a table last.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gearshift.dispatch.policy import device_slug  # noqa: E402
from gearshift.dispatch.profiler import random_store, time_us  # noqa: E402
from gearshift.jsonfile import write_text  # noqa: E402
from gearshift.kernels import w4a16_wgmma as wg  # noqa: E402
from gearshift.kernels.config import TileConfig  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
#: the tile a server compiled mid-batch (BM 256, BN 128, 8 warps in two consumers), plain stream-K and hybrid
CONFIGS = {"sk 256x128": TileConfig(256, 128, 128, 1, 8, 3, stream_k=1),
           "sk-hybrid 256x128": TileConfig(256, 128, 128, 1, 8, 3, stream_k=1, hybrid=True)}


def compiles(kernel) -> int:
    """Variants the kernel holds compiled for this device (-1 where this Triton keeps them elsewhere)."""
    try:
        return len(kernel.device_caches[torch.cuda.current_device()][0])
    except (AttributeError, KeyError, IndexError, TypeError):
        return -1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", default="300,1000,2047,4995", help="token counts (comma-separated)")
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    ms = [int(x) for x in a.m.split(",")]
    shipped = wg.w4a16_wgmma_kernel
    specialized = wg.gluon.jit(shipped.fn)  # the same function, Triton's default specialization
    rows = []
    for name, (n, k) in SHAPES.items():
        store = random_store("int4", n, k, 128, "cuda", layout="blocks16")
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            for cname, cfg in CONFIGS.items():
                if not wg.wgmma_supports(store, cfg, x.dtype):
                    continue
                row = {"shape": name, "n": n, "k": k, "m": m, "config": cname}
                outs = {}
                for form, kern in (("unspecialized", shipped), ("specialized", specialized)):
                    wg.w4a16_wgmma_kernel = kern
                    try:
                        t0 = time.perf_counter()
                        outs[form] = wg.w4a16_wgmma(x, store, cfg)
                        torch.cuda.synchronize()
                        row[f"{form}_first_call_s"] = round(time.perf_counter() - t0, 3)
                        row[f"{form}_us"] = round(time_us([lambda: wg.w4a16_wgmma(x, store, cfg)]), 2)
                    finally:
                        wg.w4a16_wgmma_kernel = shipped
                row["same_output"] = bool(torch.equal(outs["unspecialized"], outs["specialized"]))
                row["ratio"] = round(row["unspecialized_us"] / row["specialized_us"], 4)
                rows.append(row)
                print(json.dumps(row), flush=True)
    import triton

    res = {"device": torch.cuda.get_device_name(), "triton": triton.__version__,
           "compiled_variants": {"unspecialized": compiles(shipped), "specialized": compiles(specialized)},
           "rows": rows}
    out = Path(a.out) / f"unspecialized_ab_{device_slug(res['device'])}.json"
    write_text(out, json.dumps(res, indent=1))
    print(out)
    print(f"compiled variants: {res['compiled_variants']}")
    print(f"{'shape':>8} {'m':>5} {'config':>18} {'unspec us':>10} {'spec us':>10} {'ratio':>7} same")
    for r in rows:
        print(f"{r['shape']:>8} {r['m']:>5} {r['config']:>18} {r['unspecialized_us']:>10} {r['specialized_us']:>10} "
              f"{r['ratio']:>7} {r['same_output']}")


if __name__ == "__main__":
    main()
