"""W4A8 / W4A4 on group-32 int4 weights (GGUF Q4_0 / Q4_1, the default SmolLM2 model): what each path costs.

Before stop 55 no fused kernel ran these modes on group 32, so the GPU ran the torch reference (dequantize
every weight per call, then F.linear); QSPEC's drafts on the default model paid that. Now the joined-nibble
`w4a8_pad` tile runs them with K-tiles of 32. This script times, on SmolLM2-135M's linear shapes summed over
its 30 layers (or Llama-3-8B's over 32 with `--shapes llama3-8b`), per M: the dispatcher's pick, `w4a8_pad` at the rule's tile, dequantize + cuBLAS, the torch
reference, and W4A16's pick (the baseline the drafts must beat), each as CUDA-graph replays in one run, and
checks the fused result against the reference. Since stop 56 also the fragment kernel at its default tile
(`fragment`: dequantize-first blocks on groups of 32, up to 64 tokens) and the first `w4a16_tc` / `w4a8_pad` tile
that serves every shape (`tile`: the rules' pick before then).

Usage on the GPU: PYTHONPATH=. python benchmarks/group32_paths.py [--ms 1,4,16,64] [--shapes llama3-8b] [--out DIR]
writes DIR/group32_paths_<device>.json, prints a table last.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gearshift.dispatch.dispatcher import AdaptiveDispatcher  # noqa: E402
from gearshift.dispatch.policy import device_slug  # noqa: E402
from gearshift.dispatch.profiler import PRESETS, random_store, relative_error, time_us  # noqa: E402
from gearshift.dispatch.strategies import MAX_TOKENS as STRATEGY_MAX_TOKENS, STRATEGIES  # noqa: E402
from gearshift.kernels.int4_mma_gemv import mma_config  # noqa: E402
from gearshift.kernels.reference import linear_reference  # noqa: E402
from gearshift.quant.activations import ActQuantSpec  # noqa: E402

#: SmolLM2-135M: hidden 576, 9 query / 3 KV heads of 64, intermediate 1536; (name, N, K) with fused qkv, gate_up
SHAPES = [("qkv", 960, 576), ("o", 576, 576), ("gate_up", 3072, 576), ("down", 576, 1536)]
LAYERS = 30
MODES = {"w4a16": None, "w4a8": ActQuantSpec("int8"), "w4a4": ActQuantSpec("int4")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default="1,4,8,16,32,64", help="token counts (comma-separated)")
    ap.add_argument("--shapes", default="smollm2", choices=["smollm2", *PRESETS],
                    help="whose linear shapes: SmolLM2-135M's (default) or a profiler preset's (llama3-8b)")
    ap.add_argument("--layout", default="blocks16", choices=["blocks16", "rows"],
                    help="int4 byte order (the engine's on GPU: blocks16; stop 55's runs: rows)")
    ap.add_argument("--out", default="benchmarks/results", help="folder for the JSON")
    a = ap.parse_args()
    dev = torch.device("cuda")
    d = AdaptiveDispatcher(None, autoload=False)  # no map has group-32 shapes: the rules pick
    shapes, layers = (SHAPES, LAYERS) if a.shapes == "smollm2" else (PRESETS[a.shapes]["shapes"],
                                                                      PRESETS[a.shapes]["layers"])
    stores = {name: random_store("int4", n, k, 32, dev, layout=a.layout) for name, n, k in shapes}
    rows, worst = [], 0.0
    for m in (int(v) for v in a.ms.split(",")):
        xs = {name: torch.randn(m, k, device=dev, dtype=torch.bfloat16) for name, _, k in shapes}
        for mode, act in MODES.items():
            paths = {"pick": lambda st, x: d.linear(x, st, act),
                     "dequant_cublas": lambda st, x: STRATEGIES["dequant_cublas"].run(x, st, act, None),
                     "reference": lambda st, x: linear_reference(x, st, act)}
            frag = "w4a16_mma" if act is None else "w4a8_mma"
            if m <= STRATEGY_MAX_TOKENS[frag] and all(  # the fragment kernel at its default tile (dequantize-first
                    STRATEGIES[frag].supports(stores[nm], act, mma_config(n, k, m)) for nm, n, k in shapes):  # blocks)
                paths["fragment"] = lambda st, x, frag=frag: STRATEGIES[frag].run(
                    x, st, act, mma_config(st.out_features, st.in_features, x.shape[0]))
            # the tile strategy the rules fall back on above 16 tokens (the pick before stop 56 there)
            tile = "w4a16_tc" if act is None else "w4a8_pad"
            cfg = next((c for c in STRATEGIES[tile].configs(m)
                        if all(STRATEGIES[tile].supports(stores[nm], act, c) for nm, _, _ in shapes)), None)
            if cfg is not None:
                paths["tile"] = lambda st, x, tile=tile, cfg=cfg: STRATEGIES[tile].run(x, st, act, cfg)
            row = {"m": m, "mode": mode, "picks": {}}
            for name, _, _ in shapes:
                st, x = stores[name], xs[name]
                c = d.choose(st, act, m)
                row["picks"][name] = f"{c.strategy}:{c.config.key() if c.config else ''}"
                ref = linear_reference(x.float(), st, act)
                for path in ("pick", "fragment"):
                    if path in paths:
                        err = relative_error(paths[path](st, x).float(), ref)
                        worst = max(worst, err)
                        row.setdefault("rel_err", {})[f"{name}:{path}"] = err
                for path, f in paths.items():
                    us = time_us([lambda f=f, st=st, x=x: f(st, x)])
                    row[path] = row.get(path, 0.0) + us * layers / 1000.0  # ms per step of all layers
            rows.append(row)
    base = {r["m"]: r["pick"] for r in rows if r["mode"] == "w4a16"}
    for r in rows:
        r["pick_over_w4a16"] = r["pick"] / base[r["m"]]
    name = torch.cuda.get_device_name()
    tag = "" if a.shapes == "smollm2" else f"_{a.shapes}"
    out = Path(a.out) / f"group32_paths{tag}_{device_slug(name)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": name, "torch": torch.__version__, "layers": layers, "shapes": shapes,
                               "layout": a.layout,
                               "worst_rel_err_vs_reference": worst, "rows": rows}, indent=1))
    print(f"{name}; {a.shapes}: ms per {layers}-layer step (linears only); fused vs reference worst rel err "
          f"{worst:.2e}")
    print(f"{'M':>4} {'mode':>6} {'pick':>8} {'fragment':>9} {'tile':>8} {'dq+cuBLAS':>10} {'reference':>10} "
          f"{'pick/w4a16':>10}  picks")
    for r in rows:
        picks = ",".join(sorted({p.split(':')[0] for p in r["picks"].values()}))
        frag = f"{r['fragment']:9.3f}" if "fragment" in r else f"{'-':>9}"
        tile = f"{r['tile']:8.3f}" if "tile" in r else f"{'-':>8}"
        print(f"{r['m']:>4} {r['mode']:>6} {r['pick']:8.3f} {frag} {tile} {r['dequant_cublas']:10.3f} "
              f"{r['reference']:10.3f} {r['pick_over_w4a16']:10.2f}  {picks}")


if __name__ == "__main__":
    main()
