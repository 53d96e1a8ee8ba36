"""Clocks and power of whole large-M steps, and what they do to the profiler's timings (GPU; stop 47).

For each M: the 128 Llama-3-8B linears of one 32-layer step (distinct random weights, CUDA graph) under
the policy map (W4A16 on plain int4, and with --modes w4a8 W4A8 as the engine runs it) and as cuBLAS bf16 on
dense weights, each replayed back to back for `--seconds`
while `nvidia-smi` samples SM clock and board power every 50 ms. The step's ms is the median over the
last half of the replays, clocks and watts the means over that half (the state the GPU settles in).
Per shape, the map's pick is also timed as `gearshift profile` times a candidate: a short burst from
idle (`time_us`), and after `SUSTAIN_S` seconds of running (`time_us(sustain_s=...)`, the profiler's
default from `SUSTAIN_FROM_M` tokens); summed over the step, the two tell how far a burst timing is
from what a whole step of that size sees.

    PYTHONPATH=. python benchmarks/power_cap.py --m 256,1024,4096 --out benchmarks/results

Stop 47 (`results/power_cap_stop47.md`): from 1024 tokens both the map's kernels and cuBLAS hold the
H100 at its 700 W cap at about 1.4-1.6 GHz (boost: 1.98 GHz), and burst timings were 5-12% below the step.
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from kernel_bench import Model, producer_codes, step_fn, tag_suffix, write_json  # noqa: E402

SMI_FIELDS = "timestamp,clocks.sm,power.draw"


def replay_for(run, seconds: float) -> tuple[list[float], list[tuple[float, float]]]:
    """Capture run() in a CUDA graph and replay it back to back for `seconds`: each replay's ms and its
    (start, end) wall times (time.time())."""
    run()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    ms, spans = [], []
    until = time.time() + seconds
    while time.time() < until:
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.time()
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        ms.append(e0.elapsed_time(e1))
        spans.append((t0, time.time()))
    del g
    return ms, spans


def read_samples(path: str) -> list[tuple[float, float, float]]:
    """nvidia-smi's CSV lines as (epoch seconds, MHz, watts); lines it could not read are skipped."""
    out = []
    for line in open(path):
        parts = [p.strip() for p in line.split(",")]
        try:
            t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            out.append((t, float(parts[1]), float(parts[2])))
        except (ValueError, IndexError):
            continue
    return out


def settled(ms: list[float], spans, samples) -> dict:
    """The last half of a replay run: median step ms, mean MHz and watts of the samples inside it."""
    half = len(ms) // 2
    lo, hi = spans[half][0], spans[-1][1]
    inside = [s for s in samples if lo <= s[0] <= hi]
    return {"ms": statistics.median(ms[half:]), "replays": len(ms), "first_ms": ms[0], "samples": len(inside),
            "mhz": statistics.mean(s[1] for s in inside) if inside else None,
            "watts": statistics.mean(s[2] for s in inside) if inside else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", default="256,1024,4096")
    ap.add_argument("--modes", default="w4a16", help="w4a16 (plain int4) and/or w4a8 (int4-prog weights, the "
                    "producers' codes, as the engine runs it), each against cuBLAS bf16 in the same run")
    ap.add_argument("--seconds", type=float, default=3.0, help="replay time per step and variant")
    ap.add_argument("--policy", default="gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json")
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("power_cap.py times CUDA graphs and reads nvidia-smi: it needs a GPU")

    from gearshift.dispatch.dispatcher import AdaptiveDispatcher
    from gearshift.dispatch.policy import device_slug, load_map_file
    from gearshift.dispatch.profiler import PRESETS, SUSTAIN_S, time_us
    from gearshift.quant.modes import MODES

    shapes, layers = PRESETS["llama3-8b"]["shapes"], PRESETS["llama3-8b"]["layers"]
    modes = a.modes.split(",")
    unknown = [m for m in modes if m not in ("w4a16", "w4a8")]
    if unknown:
        raise SystemExit(f"--modes: {unknown} (w4a16, w4a8)")
    disp = AdaptiveDispatcher(load_map_file(a.policy), autoload=False)
    models = {"w4a16": Model("int4", shapes, layers, 128, torch.bfloat16, "blocks16") if "w4a16" in modes else None,
              "w4a8": Model("int4p", shapes, layers, 128, torch.bfloat16, "blocks16") if "w4a8" in modes else None}
    dense = Model("dense", shapes, layers, 0, torch.bfloat16)
    codes: dict[int, object] = {}  # id(x) -> the producer's codes for that linear (W4A8, as the engine runs it)

    def quantized(mode):
        act = MODES[mode].act
        return lambda x, s: disp.linear(x, s, act, codes=codes.get(id(x)))

    fns = {m: (models[m], quantized(m)) for m in modes}
    fns["cublas"] = (dense, lambda x, s: torch.nn.functional.linear(x, s.weight))
    log = tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False)
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits", "-lms", "50"],
                           stdout=log)
    res: dict = {}
    try:
        runs = []
        for m in (int(v) for v in a.m.split(",")):
            xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _, _, k in shapes]
            codes.clear()
            if "w4a8" in modes:  # the codes the RMSNorms and SwiGLU write in the engine (o still quantizes)
                made = producer_codes(disp, shapes, models["w4a8"].stores[0], xs, MODES["w4a8"].act, m)
                codes.update((id(x), c) for x, c in zip(xs, made) if c is not None)
            row = res.setdefault(str(m), {})
            for name, (model, fn) in fns.items():
                runs.append((m, name, *replay_for(step_fn(model, xs, fn), a.seconds)))
                time.sleep(1.0)  # let the GPU cool a little: every variant starts from about the same state
                for label, kw in (("burst", {}), ("sustained", {"sustain_s": SUSTAIN_S})):
                    per = [time_us([lambda st=layer[i], x=xs[i]: fn(x, st) for layer in model.stores], **kw)
                           for i in range(len(shapes))]
                    row[f"{name}_{label}_sum_ms"] = sum(per) * layers / 1000
                    row[f"{name}_{label}_us"] = per
                    time.sleep(1.0)
    finally:
        smi.terminate()
        smi.wait()
        log.close()
    samples = read_samples(log.name)
    os.unlink(log.name)
    for m, name, ms, spans in runs:
        res[str(m)][f"{name}_step"] = settled(ms, spans, samples)
    dev = torch.cuda.get_device_name()
    path = write_json(a.out, f"power_cap_{device_slug(dev)}{tag_suffix(a.tag)}.json",
                      {"device": dev, "torch": torch.__version__, "policy": a.policy, "seconds": a.seconds,
                       "sustain_s": SUSTAIN_S, "modes": modes, "results": res})
    print(path)
    print(f"{'M':>5} {'side':>7} {'step ms':>9} {'first':>8} {'MHz':>6} {'W':>5} {'burst sum':>10} {'sustained sum':>14}")
    for m, row in res.items():
        for name in fns:
            st = row[f"{name}_step"]
            mhz = f"{st['mhz']:.0f}" if st["mhz"] is not None else "-"
            watts = f"{st['watts']:.0f}" if st["watts"] is not None else "-"
            print(f"{m:>5} {name:>7} {st['ms']:9.3f} {st['first_ms']:8.3f} {mhz:>6} {watts:>5} "
                  f"{row[f'{name}_burst_sum_ms']:10.3f} {row[f'{name}_sustained_sum_ms']:14.3f}")


if __name__ == "__main__":
    main()
