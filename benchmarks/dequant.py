"""The int4 -> bf16 dequantizer behind the `dequant_cublas` strategy, and what it costs at large M.

At M >= 1024 the shipped map runs W4A16 as dequantize + cuBLAS, so the gap to cuBLAS on a dense
copy is the dequantizer's time. This script measures it on Llama-3-8B shapes:

1. check: every tile of the sweep against `Int4Weight.dequantize` and against the stop-17 block
   (16 rows x 1 group, the default tile), bit for bit (both layouts, bf16 and fp16, ragged N);
2. dequant alone: every tile of the sweep per shape, GB/s moved (int4 + scales in, bf16 out) and
   the ratio to the copy bandwidth measured in the same run;
3. steps: 32 layers x 4 shapes at each M, per-shape CUDA-graph timings summed: cuBLAS on a dense
   copy, dequant + cuBLAS with the old and the best new tile, the same through an L2-sized scratch
   buffer (`--chunks`), and the shipped map's choice.

Usage on the GPU: PYTHONPATH=. python benchmarks/dequant.py [--ms 512,1024,2048,4096] [--out DIR]
writes DIR/dequant_<device>.json, prints a table last.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gearshift.dispatch.dispatcher import AdaptiveDispatcher  # noqa: E402
from gearshift.dispatch.policy import PolicyMap, device_slug  # noqa: E402
from gearshift.dispatch.profiler import PRESETS, copy_bandwidth, random_store, time_us  # noqa: E402
from gearshift.kernels.dequant import dequant_int4_triton  # noqa: E402
from gearshift.quant.int4 import Int4Weight, quantize_int4  # noqa: E402

OLD_TILE = (16, 1, 4)  # the stop-17 kernel's block (16 rows x 64 bytes, 4 warps), still the default


def tiles():
    return [(bn, gpp, w) for bn, gpp, w in itertools.product((16, 32, 64, 128), (1, 2, 4, 8), (4, 8))
            if bn * gpp * 64 <= 32768]  # bytes in per program


def sub_store(st: Int4Weight, r0: int, r1: int) -> Int4Weight:
    """Rows r0..r1 of a store (multiples of 16 in blocks16: a 16-row block is contiguous)."""
    return Int4Weight(st.qweight[r0:r1], st.scales[r0:r1], st.mins[r0:r1], st.group_size, st.symmetric, st.layout)


def chunked_linear(x, st, tile, rows, buf, y):
    """Dequantize and multiply `rows` weight rows at a time through one reused scratch buffer."""
    n = st.out_features
    for r0 in range(0, n, rows):
        r1 = min(r0 + rows, n)
        w = dequant_int4_triton(sub_store(st, r0, r1), x.dtype, out=buf[: r1 - r0], tile=tile)
        torch.mm(x, w.t(), out=y[:, r0:r1])
    return y


def check(log) -> list[dict]:
    res = []
    for layout, dt, (n, k, g) in itertools.product(("rows", "blocks16"), (torch.bfloat16, torch.float16),
                                                   ((200, 1024, 128), (4096, 4096, 128), (96, 2048, 64), (64, 1024, 256))):
        if layout == "blocks16" and n % 16:
            continue
        torch.manual_seed(n + k)
        st = quantize_int4(torch.randn(n, k), g).to("cuda").to_layout(layout)
        ref = st.dequantize(dt)
        old = dequant_int4_triton(st, dt, tile=OLD_TILE)
        worst_ref, worst_old = 0, 0
        for tile in tiles():
            w = dequant_int4_triton(st, dt, tile=tile)
            worst_ref = max(worst_ref, int((w != ref).sum()))
            worst_old = max(worst_old, int((w != old).sum()))
        d = (old.float() - ref.float()).abs().max().item()
        res.append({"layout": layout, "dtype": str(dt), "shape": [n, k, g], "mismatch_vs_reference": worst_ref,
                    "mismatch_vs_old_tile": worst_old, "old_tile_max_abs_vs_reference": d})
        log(f"check {layout} {dt} {n}x{k} g{g}: {worst_ref} elements differ from the reference "
            f"(max |old - ref| {d:.2e}), {worst_old} from the old tile")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default="512,1024,2048,4096")
    ap.add_argument("--chunks", default="2048,4096", help="weight rows per scratch chunk (L2-sized)")
    ap.add_argument("--policy", default="gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--skip-check", action="store_true")
    args = ap.parse_args()
    t_start = time.time()
    dev_name = torch.cuda.get_device_name()
    out = {"device": dev_name, "torch": torch.__version__, "layout": "blocks16"}

    def log(s):
        print(f"[{time.time() - t_start:6.0f}s] {s}", flush=True)

    if not args.skip_check:
        out["check"] = check(log)
    bw = copy_bandwidth()
    out["copy_bandwidth_GBs"] = bw / 1e9
    log(f"copy bandwidth {bw / 1e9:.0f} GB/s")
    shapes, layers = PRESETS["llama3-8b"]["shapes"], PRESETS["llama3-8b"]["layers"]
    dt = torch.bfloat16

    # 2. dequant alone
    out["dequant"] = {}
    for name, n, k in shapes:
        stores = [random_store("int4", n, k, 128, "cuda", dt, "blocks16") for _ in range(3)]
        bufs = [torch.empty(n, k, device="cuda", dtype=dt) for _ in stores]
        moved = stores[0].nbytes() + n * k * 2
        row = {}
        for tile in tiles():
            us = time_us([lambda s=s, b=b, t=tile: dequant_int4_triton(s, dt, out=b, tile=t) for s, b in zip(stores, bufs)])
            row[str(tile)] = {"us": us, "GBs": moved / us / 1e3, "x_copy": moved / us / 1e3 / (bw / 1e9)}
        best = min(row, key=lambda t: row[t]["us"])
        out["dequant"][name] = {"floor_us": moved / bw * 1e6, "tiles": row, "best": best}
        log(f"dequant {name}: old {row[str(OLD_TILE)]['us']:.1f} us ({row[str(OLD_TILE)]['x_copy']:.2f} of copy), "
            f"best {best} {row[best]['us']:.1f} us ({row[best]['x_copy']:.2f}), floor {moved / bw * 1e6:.1f} us")
        del stores, bufs
    # one tile for every shape: the best sum over the shapes
    sums = {t: sum(out["dequant"][nm]["tiles"][t]["us"] for nm, _, _ in shapes) for t in out["dequant"]["qkv"]["tiles"]}
    common = min(sums, key=sums.get)
    out["common_tile"] = common
    log(f"best single tile {common}: {sums[common]:.1f} us per layer (old {sums[str(OLD_TILE)]:.1f})")
    common = eval(common)  # noqa: S307

    # 3. steps
    pm = PolicyMap.load(args.policy) if Path(args.policy).exists() else None
    disp = AdaptiveDispatcher(pm, autoload=False)
    chunks = [int(c) for c in args.chunks.split(",") if c]
    out["steps"] = {}
    for m in [int(v) for v in args.ms.split(",")]:
        row = {}
        for name, n, k in shapes:
            stores = [random_store("int4", n, k, 128, "cuda", dt, "blocks16") for _ in range(2)]
            dense = [s.dequantize(dt) for s in stores]
            x = torch.randn(m, k, device="cuda", dtype=dt)
            ref = F.linear(x, dense[0])
            y = torch.empty(m, n, device="cuda", dtype=dt)
            variants = {
                "cublas_dense": lambda s, i: F.linear(x, dense[i]),
                "dequant_old": lambda s, i: F.linear(x, dequant_int4_triton(s, dt, tile=OLD_TILE)),
                "dequant_new": lambda s, i: F.linear(x, dequant_int4_triton(s, dt, tile=common)),
                "map": lambda s, i: disp.linear(x, s, None),
            }
            for c in chunks:
                if c < n:
                    buf = torch.empty(c, k, device="cuda", dtype=dt)
                    variants[f"chunk{c}"] = lambda s, i, c=c, buf=buf: chunked_linear(x, s, common, c, buf, y)
            for v, fn in variants.items():
                got = fn(stores[0], 0)
                err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
                if err > 1e-2:
                    raise SystemExit(f"{v} {name} M={m}: rel. error {err:.2e} against cuBLAS on the dense copy")
                us = time_us([lambda s=s, i=i, fn=fn: fn(s, i) for i, s in enumerate(stores)])
                row.setdefault(v, {})[name] = us
            choice = disp.choose(stores[0], None, m)
            row.setdefault("map_choice", {})[name] = choice.strategy if choice else None
            variants.clear()
            torch.cuda.empty_cache()
        for v in list(row):
            if v != "map_choice":
                row[v]["step_ms"] = layers * sum(row[v][nm] for nm, _, _ in shapes if nm in row[v]) / 1000 \
                    if all(nm in row[v] for nm, _, _ in shapes) else None
        out["steps"][str(m)] = row
        log(f"M={m}: " + ", ".join(f"{v} {row[v]['step_ms']:.2f}" for v in row
                                    if v != "map_choice" and row[v].get("step_ms")))

    path = Path(args.out) / f"dequant_{device_slug(dev_name)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    print(f"\nwrote {path}\n")
    print(f"dequant alone, us (x copy bandwidth {bw / 1e9:.0f} GB/s):")
    print("| shape | floor | old tile | best tile | common tile |")
    print("|---|---|---|---|---|")
    for name, _, _ in shapes:
        d = out["dequant"][name]
        t = d["tiles"]
        print(f"| {name} | {d['floor_us']:.1f} | {t[str(OLD_TILE)]['us']:.1f} ({t[str(OLD_TILE)]['x_copy']:.2f}) | "
              f"{d['best']} {t[d['best']]['us']:.1f} ({t[d['best']]['x_copy']:.2f}) | "
              f"{t[str(common)]['us']:.1f} ({t[str(common)]['x_copy']:.2f}) |")
    print("\nsteps, ms per 32 layers:")
    vs = [v for v in next(iter(out["steps"].values())) if v != "map_choice"]
    print("| M | " + " | ".join(vs) + " |")
    print("|---|" + "---|" * len(vs))
    for m, row in out["steps"].items():
        print(f"| {m} | " + " | ".join(f"{row[v]['step_ms']:.2f}" if row.get(v, {}).get("step_ms") else "-"
                                       for v in vs) + " |")


if __name__ == "__main__":
    main()
