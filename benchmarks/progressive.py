"""W4A8 / W4A4 on the int8 tensor cores with int8-exact int4 groups (`kernels/w4a8_progressive.py`)
against what the engine runs today, per Llama-3-8B shape and summed over a 32-layer step.

Per (shape, M), all in one process, CUDA-graph replays over enough weight copies to exceed L2
(`profiler.time_us`):
- every `progressive_configs(M)` tile of the new kernel on stores with row units, quantizer
  included (what the engine runs), after a bit-for-bit check against its torch model;
- the shipped map's W4A8 choice on plain int4 stores (the current W4A8 path), the same for W4A16;
- cuBLAS bf16 on a dense copy (the "bf16 path" of the issue's W4A8 target: >= 1.6x at M >= 256).

Usage on the GPU: PYTHONPATH=. python benchmarks/progressive.py [--ms 64,...] [--modes w4a8,w4a4]
[--out DIR]; writes DIR/progressive_<device>.json (with a policy map of the per-shape timings that
`policy_merge.py` can take) and prints a table last.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gearshift.dispatch.dispatcher import AdaptiveDispatcher  # noqa: E402
from gearshift.dispatch.policy import (M_BUCKETS, Choice, PolicyMap, candidate_name, device_slug,  # noqa: E402
                                       parse_candidate, type_key)
from gearshift.dispatch.profiler import PRESETS, copy_bandwidth, n_copies, random_store, time_us  # noqa: E402
from gearshift.kernels.act_quant import quantize_act_triton  # noqa: E402
from gearshift.kernels.w4a8_progressive import (progressive_codes, progressive_configs,  # noqa: E402
                                                progressive_supports, w4a8_progressive, w4a8_progressive_emulate)
from gearshift.quant.modes import MODES  # noqa: E402

LAYERS = 32


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ms", default="64,128,256,512,1024,2048,4096")
    ap.add_argument("--modes", default="w4a8,w4a4", help="activation modes with int8 codes")
    ap.add_argument("--layout", default="blocks16", choices=["rows", "blocks16"])
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cuda")
    device = torch.cuda.get_device_name()
    ms = [int(v) for v in a.ms.split(",")]
    modes = a.modes.split(",")
    shapes = PRESETS["llama3-8b"]["shapes"]
    shipped = AdaptiveDispatcher()  # the bundled map for this device
    res = {"device": device, "torch": torch.__version__, "time": time.strftime("%Y-%m-%d %H:%M:%S"),
           "layout": a.layout, "copy_bw_Bps": copy_bandwidth(), "shapes": {}, "checks": 0}
    pm = PolicyMap(device, M_BUCKETS, meta={"dtype": "bfloat16", "int4_layout": a.layout,
                                            "source": "benchmarks/progressive.py (stores with row units)"})
    t_start = time.time()
    for name, n, k in shapes:
        prog = [random_store("int4p", n, k, 128, dev, layout=a.layout)]
        prog += [random_store("int4p", n, k, 128, dev, layout=a.layout) for _ in range(n_copies(prog[0]) - 1)]
        plain = [random_store("int4", n, k, 128, dev, layout=a.layout) for _ in range(len(prog))]
        dense = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(max(2, len(prog) // 4))]
        per_shape = res["shapes"].setdefault(name, {"n": n, "k": k})
        for m in ms:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            row = per_shape.setdefault(str(m), {})
            row["cublas_bf16"] = time_us([lambda w=w: F.linear(x, w) for w in dense])
            c16 = shipped.choose(plain[0], None, m)
            row["w4a16_map"] = time_us([lambda s=s: shipped.linear(x, s, None) for s in plain])
            row["w4a16_map_choice"] = c16.strategy if c16 else None
            for mode in modes:
                act = MODES[mode].act
                cm = shipped.choose(plain[0], act, m)
                row[f"{mode}_map"] = time_us([lambda s=s: shipped.linear(x, s, act) for s in plain])
                row[f"{mode}_map_choice"] = cm.strategy if cm else None
                codes, scales = quantize_act_triton(x, act)
                cands = {}
                for cfg in progressive_configs(m):
                    if not progressive_supports(prog[0], act, cfg):
                        continue
                    y = progressive_codes(codes, scales, prog[0], cfg, torch.float32)
                    emu = w4a8_progressive_emulate(codes, scales, prog[0], torch.float32, cfg.split_k)
                    res["checks"] += 1
                    if not torch.equal(y, emu):  # never timed nor put in the map; the run fails at the end
                        diff = (y - emu).abs().max().item()
                        bad = f"{name} M={m} {mode} {cfg}: kernel != model (max diff {diff:.3g})"
                        res.setdefault("failed", []).append(bad)
                        print("FAILED", bad, flush=True)
                        continue
                    cands[candidate_name("w4a8_progressive", cfg)] = time_us(
                        [lambda s=s, c=cfg: w4a8_progressive(x, s, act, c) for s in prog])
                best = min(cands, key=cands.get)
                row[f"{mode}_progressive"] = cands[best]
                row[f"{mode}_progressive_tile"] = best.split("@", 1)[1]
                key = type_key(mode, 128, n, k)
                # the map's candidates for the merge: the new kernel's tiles plus today's pick, so that
                # plain stores keep a timed alternative (AdaptiveDispatcher._best_served)
                if cm is not None:
                    cands[candidate_name(cm.strategy, cm.config)] = row[f"{mode}_map"]
                pm.timings.setdefault(key, {})[str(m)] = cands
                if m in pm.buckets:
                    us, c = min((v, c) for c, v in cands.items())
                    pm.set(key, m, Choice(*parse_candidate(c), us))
            print(f"{name} M={m}: " + " ".join(f"{k2}={v:.1f}" for k2, v in row.items() if isinstance(v, float)),
                  flush=True)
        del prog, plain, dense
        torch.cuda.empty_cache()
    # step sums
    steps = {}
    for m in ms:
        cols = [c for c in res["shapes"][shapes[0][0]][str(m)] if isinstance(res["shapes"][shapes[0][0]][str(m)][c], float)]
        steps[str(m)] = {c: round(LAYERS * sum(res["shapes"][nm][str(m)][c] for nm, _, _ in shapes) / 1000, 3)
                         for c in cols}
    res["steps_ms"] = steps
    res["elapsed_s"] = round(time.time() - t_start, 1)
    slug = device_slug(device)
    (out / f"progressive_{slug}.json").write_text(json.dumps(res, indent=1))
    pm.save(out / f"progressive_policy_{slug}.json")
    failed = res.get("failed", [])
    print(f"\n{device}, {res['checks'] - len(failed)} of {res['checks']} kernel-vs-model checks passed; "
          "ms per 32-layer step")
    hdr = ["M", "cublas_bf16", "w4a16_map"] + [f"{md}_{w}" for md in modes for w in ("map", "progressive")]
    print(" | ".join(hdr) + " | bf16 / progressive (" + modes[0] + ")")
    for m in ms:
        r = steps[str(m)]
        print(" | ".join([str(m)] + [f"{r[h]:.2f}" for h in hdr[1:]]) + f" | {r['cublas_bf16'] / r[modes[0] + '_progressive']:.2f}x")
    if failed:
        raise SystemExit(f"{len(failed)} tiles differ from the model: " + "; ".join(failed))


if __name__ == "__main__":
    main()
