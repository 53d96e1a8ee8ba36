"""A/B of a large-M Gluon kernel with M and the stream-K run lengths unspecialized (as shipped) against the
same kernel with Triton's default specialization (an int argument = 1, divisible by 16, or neither, compiled
apart), on Llama-3-8B linear shapes and prefill token counts: the W4A16 wgmma kernel, or W4A8's progressive
int8 kernel on activation codes (`--kernel w4a8_progressive`).

Why: a server meets every prefill token count; each class of (M, per, dpt) was a compile of its own, and one
the warm-up had not met stalled a running batch for 4.4 s (H200, stop 59). This measures what dropping the
specialization costs per call, and counts the compiles each form makes over the token counts.

Usage: python benchmarks/unspecialized_ab.py [--kernel w4a16|w4a8_progressive] [--m 300,1000,2047,4995]
    [--policy MAP.json] [--shapes qkv,o,gate_up,down] [--rounds 3] [--sustain 0.3] [--dump-ptx DIR] [--out DIR]
--policy adds each shape's pick in that map at each M (where it is this kernel's strategy) to the fixed tiles.
The two forms are timed alternately (ABBA...), each after --sustain seconds of its own replays, so that
neither always runs on a cooler GPU. A token count that is not a multiple of 16 compiles the same code in
both forms, so its ratio is the noise.
Writes DIR/unspecialized_ab_<device>.json (w4a16) or unspecialized_ab_w4a8_progressive_<device>.json, prints a
table last.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gearshift.dispatch.policy import PolicyMap, device_slug, load_map_file, type_key  # noqa: E402
from gearshift.dispatch.profiler import random_store, time_us  # noqa: E402
from gearshift.jsonfile import write_text  # noqa: E402
from gearshift.kernels import w4a8_progressive as wp  # noqa: E402
from gearshift.kernels import w4a16_wgmma as wg  # noqa: E402
from gearshift.kernels.config import TileConfig  # noqa: E402
from gearshift.quant.activations import ActQuantSpec  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
#: the tile a server compiled mid-batch (BM 256, BN 128, 8 warps in two consumers), plain stream-K and hybrid
CONFIGS = {"sk 256x128": TileConfig(256, 128, 128, 1, 8, 3, stream_k=1),
           "sk-hybrid 256x128": TileConfig(256, 128, 128, 1, 8, 3, stream_k=1, hybrid=True)}
INT8 = ActQuantSpec("int8")


class Form:
    """One kernel under test: its module attribute (swapped for the specialized twin), the store and inputs it
    runs on, and its call."""

    def __init__(self, name: str):
        self.name = name
        self.module, self.attr, self.mode = ((wg, "w4a16_wgmma_kernel", "w4a16") if name == "w4a16" else
                                             (wp, "w4a8_progressive_kernel", "w4a8"))
        self.strategy = "w4a16_wgmma" if name == "w4a16" else "w4a8_progressive"
        self.shipped = getattr(self.module, self.attr)

    def store(self, n: int, k: int):
        return random_store("int4" if self.name == "w4a16" else "int4p", n, k, 128, "cuda", layout="blocks16")

    def inputs(self, m: int, k: int):
        if self.name == "w4a16":
            return (torch.randn(m, k, device="cuda", dtype=torch.bfloat16),)
        codes = torch.randint(-127, 128, (m, k), device="cuda", dtype=torch.int8)
        return codes, torch.rand(m, device="cuda") * 1e-2 + 1e-3

    def supports(self, store, cfg: TileConfig) -> bool:
        if self.name == "w4a16":
            return wg.wgmma_supports(store, cfg, torch.bfloat16)
        return wp.progressive_supports(store, INT8, cfg)

    def call(self, inputs, store, cfg: TileConfig):
        if self.name == "w4a16":
            return wg.w4a16_wgmma(inputs[0], store, cfg)
        return wp.progressive_codes(inputs[0], inputs[1], store, cfg, torch.bfloat16)


def compiled_variants(kernel) -> dict | None:
    """The variants the kernel holds compiled for this device, by specialization key (None where this Triton
    keeps them elsewhere)."""
    try:
        return kernel.device_caches[torch.cuda.current_device()][0]
    except (AttributeError, KeyError, IndexError, TypeError):
        return None


def compiles(kernel) -> int:
    """How many variants the kernel holds compiled for this device (-1: unknown)."""
    compiled = compiled_variants(kernel)
    return -1 if compiled is None else len(compiled)


def dump_ptx(folder: Path, kernels: dict) -> None:
    """Each variant the kernels hold compiled, as PTX files named by form and compile order."""
    folder.mkdir(parents=True, exist_ok=True)
    for form, kernel in kernels.items():
        compiled = compiled_variants(kernel)
        if compiled is None:
            print(f"{form}: this Triton keeps its compiled kernels elsewhere; no PTX written")
            continue
        for i, (key, ck) in enumerate(compiled.items()):
            (folder / f"{form}_{i}.ptx").write_text(f"// {key}\n" + ck.asm.get("ptx", ""))


def tiles(form: Form, pm: PolicyMap | None, n: int, k: int, m: int) -> dict[str, TileConfig]:
    """The fixed tiles and, with a map, its pick for this shape and M where that is the kernel under test."""
    out = dict(CONFIGS)
    choice = pm.lookup(type_key(form.mode, 128, n, k), m) if pm is not None else None
    if choice is not None and choice.strategy == form.strategy and choice.config is not None:
        out["map " + choice.config.key()] = choice.config
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel", choices=("w4a16", "w4a8_progressive"), default="w4a16")
    ap.add_argument("--m", default="300,1000,2047,4995", help="token counts (comma-separated)")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="which of the Llama-3-8B linears (comma-separated)")
    ap.add_argument("--policy", default=None, help="a policy map whose picks join the fixed tiles")
    ap.add_argument("--rounds", type=int, default=3, help="alternating timings of each variant (median kept)")
    ap.add_argument("--sustain", type=float, default=0.3,
                    help="seconds each timing first replays its calls for (the clocks a long prefill settles at)")
    ap.add_argument("--dump-ptx", default=None, metavar="DIR",
                    help="write each compiled variant's PTX there (to see what the specialization changes)")
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    ms = [int(x) for x in a.m.split(",")]
    form = Form(a.kernel)
    pm = load_map_file(a.policy) if a.policy else None
    specialized = wg.gluon.jit(form.shipped.fn)  # the same function, Triton's default specialization
    rows = []
    for name in a.shapes.split(","):
        if name not in SHAPES:
            ap.error(f"unknown shape {name!r}: choose from {', '.join(SHAPES)}")
        n, k = SHAPES[name]
        store = form.store(n, k)
        for m in ms:
            inputs = form.inputs(m, k)
            for cname, cfg in tiles(form, pm, n, k, m).items():
                if not form.supports(store, cfg):
                    continue
                row = {"shape": name, "n": n, "k": k, "m": m, "config": cname}
                outs, times = {}, {}
                variants = (("unspecialized", form.shipped), ("specialized", specialized))
                try:
                    for variant, kern in variants:  # compiles both before either is timed
                        setattr(form.module, form.attr, kern)
                        t0 = time.perf_counter()
                        outs[variant] = form.call(inputs, store, cfg)
                        torch.cuda.synchronize()
                        row[f"{variant}_first_call_s"] = round(time.perf_counter() - t0, 3)
                    for r in range(a.rounds):  # alternating (ABBA...), each after sustain_s of its own replays
                        for variant, kern in (variants if r % 2 == 0 else variants[::-1]):
                            setattr(form.module, form.attr, kern)
                            us = time_us([lambda: form.call(inputs, store, cfg)], sustain_s=a.sustain)
                            times.setdefault(variant, []).append(round(us, 2))
                finally:
                    setattr(form.module, form.attr, form.shipped)
                for variant, ts in times.items():
                    row[f"{variant}_us"] = statistics.median(ts)
                    row[f"{variant}_rounds_us"] = ts
                row["same_output"] = bool(torch.equal(outs["unspecialized"], outs["specialized"]))
                row["ratio"] = round(row["unspecialized_us"] / row["specialized_us"], 4)
                rows.append(row)
                print(json.dumps(row), flush=True)
    import triton

    res = {"device": torch.cuda.get_device_name(), "triton": triton.__version__, "kernel": a.kernel,
           "policy": a.policy, "rounds": a.rounds, "sustain_s": a.sustain,
           "compiled_variants": {"unspecialized": compiles(form.shipped), "specialized": compiles(specialized)},
           "rows": rows}
    if a.dump_ptx:
        dump_ptx(Path(a.dump_ptx), {"unspecialized": form.shipped, "specialized": specialized})
    tag = "" if a.kernel == "w4a16" else f"{a.kernel}_"
    out = Path(a.out) / f"unspecialized_ab_{tag}{device_slug(res['device'])}.json"
    write_text(out, json.dumps(res, indent=1))
    print(out)
    print(f"compiled variants: {res['compiled_variants']}")
    ratios = [r["ratio"] for r in rows]
    if ratios:
        print(f"unspecialized / specialized over {len(ratios)} cells: median {statistics.median(ratios):.4f}, "
              f"{min(ratios):.4f}-{max(ratios):.4f}")
    print(f"{'shape':>8} {'m':>5} {'config':>30} {'unspec us':>10} {'spec us':>10} {'ratio':>7} same")
    for r in rows:
        print(f"{r['shape']:>8} {r['m']:>5} {r['config']:>30} {r['unspecialized_us']:>10} {r['specialized_us']:>10} "
              f"{r['ratio']:>7} {r['same_output']}")


if __name__ == "__main__":
    main()
