"""How much of a policy map's per-shape W4A8 / W4A4 times is the activation quantizer (GPU).

Why: the profiler times every candidate as `strategy.run` on bf16 inputs, so a quantized-activation
candidate's time includes its own quantizer launch. In the engine, a producer (RMSNorm, SwiGLU) hands
qkv, gate_up and down their codes, and no quantizer runs. For each Llama-3-8B shape and M, the map's pick
is timed three ways over enough weight copies to exceed L2: as the profiler times it (bf16 inputs), on
codes made beforehand (the engine's form), and the map's W4A16 pick on the same inputs for reference.
The outputs of the first two are checked to be bit-identical.

Usage: python benchmarks/quantizer_share.py [--policy MAP] [--mode w4a8] [--m 4,16] [--int4-prog] [--out DIR]
writes DIR/quantizer_share_<device>_<mode>.json, prints a table last.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gearshift.dispatch.dispatcher import AdaptiveDispatcher  # noqa: E402
from gearshift.dispatch.policy import device_slug, load_map_file  # noqa: E402
from gearshift.dispatch.profiler import PRESETS, n_copies, random_store, time_us  # noqa: E402
from gearshift.dispatch.strategies import STRATEGIES  # noqa: E402
from gearshift.jsonfile import write_text  # noqa: E402
from gearshift.kernels.act_quant import quantize_for  # noqa: E402
from gearshift.quant.modes import MODES  # noqa: E402


def label(choice) -> str:
    """A map choice as strategy@tile key."""
    return f"{choice.strategy}@{choice.config.key() if choice.config else '-'}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default="gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json")
    ap.add_argument("--mode", default="w4a8", choices=("w4a8", "w4a4"))
    ap.add_argument("--m", default="4,16", help="token counts (comma-separated)")
    ap.add_argument("--int4-prog", action="store_true", help="int4 stores with row units (--quantize int4-prog)")
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("quantizer_share.py times CUDA kernels: no GPU here")
    d = AdaptiveDispatcher(load_map_file(a.policy), autoload=False)
    act = MODES[a.mode].act
    fmt = "int4p" if a.int4_prog else "int4"
    rows = []
    for name, n, k in PRESETS["llama3-8b"]["shapes"]:
        probe = random_store(fmt, n, k, 128, "cuda", layout="blocks16")
        stores = [probe] + [random_store(fmt, n, k, 128, "cuda", layout="blocks16") for _ in range(n_copies(probe) - 1)]
        for m in (int(v) for v in a.m.split(",")):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            pick, pick16 = d.choose(probe, act, m), d.choose(probe, None, m)
            spec = d.codes_for(probe, act, m, x.dtype)
            if pick is None or pick16 is None or spec is None:
                raise SystemExit(f"{name} M={m}: the map has no {a.mode} / w4a16 pick taking codes here")
            strat = STRATEGIES[pick.strategy]
            codes = quantize_for(x, act, spec)
            y_profiled = strat.run(x, probe, act, pick.config)
            y_codes = d.linear(x, probe, act, codes=codes)
            if not torch.equal(y_profiled, y_codes):
                raise SystemExit(f"{name} M={m}: the pick on codes gives other bits than on bf16 inputs")
            row = {"shape": name, "n": n, "k": k, "m": m, "pick": label(pick), "map_us": pick.us,
                   "profiled_us": time_us([lambda s=s: strat.run(x, s, act, pick.config) for s in stores]),
                   "codes_us": time_us([lambda s=s: d.linear(x, s, act, codes=codes) for s in stores]),
                   "w4a16_pick": label(pick16),
                   "w4a16_us": time_us([lambda s=s: d.linear(x, s, None) for s in stores])}
            rows.append(row)
            print(json.dumps(row), flush=True)
        del stores, probe
        torch.cuda.empty_cache()
    dev = torch.cuda.get_device_name()
    out = Path(a.out) / f"quantizer_share_{device_slug(dev)}_{a.mode}.json"
    write_text(out, json.dumps({"device": dev, "policy": a.policy, "mode": a.mode, "int4_prog": a.int4_prog,
                                "rows": rows}, indent=1))
    print(out)
    print(f"{'shape':>8} {'m':>3} {'profiled us':>11} {'on codes':>9} {'quantizer':>9} {'w4a16 us':>9}")
    for r in rows:
        print(f"{r['shape']:>8} {r['m']:>3} {r['profiled_us']:>11.2f} {r['codes_us']:>9.2f} "
              f"{r['profiled_us'] - r['codes_us']:>9.2f} {r['w4a16_us']:>9.2f}")


if __name__ == "__main__":
    main()
