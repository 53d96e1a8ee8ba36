"""Where a small-M decode step's time goes, between and inside its launches: a per-program timeline of
the 128 fragment GEMV launches of one Llama-3-8B W4A16 step (GPU; stop 43).

The fragment kernel's small shapes take 2-2.5 us more than their bytes need at copy bandwidth
(o at one token: 5.5 us for 3.0 us of bytes), and stop 36's ablations of its block did not find
where. Here every launch of the step records, per program, `%globaltimer` at its start and end (and
with --wait after its PDL wait) and its SM (`int4_mma_gemv.TRACE`), while the step replays as a CUDA
graph exactly as `policy_ab.py` times it. Per shape (mean over layers 2..32) this reports:

- `span`: from the previous launch's last program end to this launch's last program end, the time the
  launch adds to the step, against `bytes`: its weights and scales at the copy bandwidth measured in
  the same run;
- `lead`: how long before the previous launch's last end this launch's first program started
  (negative: it started after), i.e. how far PDL overlapped them;
- `early`: the share of this launch's programs that started before the previous launch's last program
  on their SM had ended (co-residency with the predecessor);
- `ramp` / `drain`: from the first program start to the last program start, and from the first
  program end to the last; the 10th / 50th / 90th percentiles of the programs' durations and of their
  end times (from the launch's first start);
- `release` (with --wait): from the previous launch's last end to the first PDL wait to return;
- for the whole step, the DRAM rate implied by spreading each program's bytes evenly over its life,
  in 0.25 us bins: the share of the step below half and below 80% of the copy rate.

The trace changes the kernels' register allocation a little (`TRACE_WAIT`'s store the most), so the
step is timed untraced and traced in the same run, and the traced time is what the timeline explains.

    PYTHONPATH=. python benchmarks/mma_ablations/chain_trace.py --m 1,4 --out benchmarks/results
"""
import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kernel_bench import Model, step_fn, tag_suffix, time_step, write_json  # noqa: E402

from gearshift.dispatch.dispatcher import AdaptiveDispatcher  # noqa: E402
from gearshift.dispatch.policy import device_slug, load_map_file  # noqa: E402
from gearshift.dispatch.profiler import PRESETS, copy_bandwidth  # noqa: E402
from gearshift.kernels import int4_mma_gemv as mg  # noqa: E402
from gearshift.quant.modes import MODES  # noqa: E402


BIN_US = 0.25


def traced_step(run, reps: int = 10):
    """Capture run() as a CUDA graph with every fragment launch traced; replay it; return the trace
    rows (of the last replay) and ms per traced replay."""
    mg.TRACE_ARENA = torch.full((1 << 20, 4), -1, device="cuda", dtype=torch.int64)
    mg.TRACE = []
    run()  # compile the traced kernels outside the capture
    torch.cuda.synchronize()
    mg.TRACE = []
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    launches, mg.TRACE = mg.TRACE, None  # (a launch past the arena's end raised already)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / reps)
    for L in launches:
        if int(L["rows"][:, 2].min()) <= 0:
            raise SystemExit(f"a program of a {L['n']}x{L['k']} launch wrote no trace")
    mg.TRACE_ARENA = None  # (the launches' rows keep the arena alive)
    return launches, statistics.median(times)


def timeline(launches: list, shapes: list, nbytes: list, copy_tbs: float, wait: bool) -> dict:
    """Per launch and per shape: the quantities the module docstring names (us)."""
    rows = [L["rows"].cpu() for L in launches]
    t0 = min(int(r[:, 0].min()) for r in rows)
    per = []
    for i, r in enumerate(rows):
        start, twait, end, sm = (r[:, j].double() - (t0 if j < 3 else 0) for j in range(4))
        d = {"i": i, "shape": shapes[i % len(shapes)][0], "programs": r.shape[0], "tile": launches[i]["tile"],
             "start_min": start.min().item() / 1e3, "start_max": start.max().item() / 1e3,
             "end_min": end.min().item() / 1e3, "end_max": end.max().item() / 1e3,
             "bytes_us": nbytes[i % len(shapes)] / (copy_tbs * 1e6)}
        if wait:
            d["wait_min"] = twait.min().item() / 1e3
        if i:
            prev = rows[i - 1]
            p_end = prev[:, 2].double() - t0
            d["span"] = d["end_max"] - per[-1]["end_max"]
            d["lead"] = per[-1]["end_max"] - d["start_min"]
            last_on_sm = {}
            for s, e in zip(prev[:, 3].tolist(), p_end.tolist()):
                last_on_sm[s] = max(last_on_sm.get(s, 0.0), e)
            d["early"] = sum(1 for s, b in zip(sm.tolist(), start.tolist()) if b < last_on_sm.get(int(s), -1e30)) \
                / r.shape[0]
            if wait:
                d["release"] = d["wait_min"] - per[-1]["end_max"]
        d["ramp"] = d["start_max"] - d["start_min"]
        d["drain"] = d["end_max"] - d["end_min"]
        dur = ((end - start) / 1e3).sort().values
        ends = ((end - start.min()) / 1e3).sort().values
        for q in (10, 50, 90):
            d[f"dur_p{q}"] = dur[min(len(dur) - 1, len(dur) * q // 100)].item()
            d[f"end_p{q}"] = ends[min(len(ends) - 1, len(ends) * q // 100)].item()
        per.append(d)
    # the step's implied DRAM rate: each program's bytes (its launch's over its programs) spread evenly over
    # its life, summed in 0.25 us bins from the first start to the last end
    span = max(d["end_max"] for d in per)
    bins = torch.zeros(int(span / BIN_US) + 2, dtype=torch.float64)
    for i, r in enumerate(rows):
        start = (r[:, 0].double() - t0) / 1e3
        end = (r[:, 2].double() - t0) / 1e3
        rate = nbytes[i % len(shapes)] / r.shape[0] / (end - start).clamp(min=1e-3)  # bytes per us
        for b0, b1, v in zip((start / BIN_US).tolist(), (end / BIN_US).tolist(), rate.tolist()):
            lo, hi = int(b0), int(b1)
            bins[lo: hi + 1] += v * BIN_US  # (whole bins: coarse at the edges, exact in total to a bin)
    tbs = bins[:-1] / BIN_US / 1e6  # TB/s per bin
    rates = {f"below_{int(f * 100)}pct_of_copy": (tbs < f * copy_tbs).double().mean().item() for f in (0.5, 0.8)}
    rates["mean_tbs"] = sum(nbytes) * (len(rows) // len(shapes)) / (span * 1e6)
    summary = {}
    keys = ["span", "bytes_us", "lead", "early", "ramp", "drain", "dur_p10", "dur_p50", "dur_p90", "end_p10",
            "end_p50", "end_p90"] + (["release"] if wait else [])
    for name, *_ in shapes:
        sel = [d for d in per[len(shapes):] if d["shape"] == name]  # layers 2..: a predecessor of the same kind
        summary[name] = {k: statistics.mean(d[k] for d in sel) for k in keys} | {"tile": sel[0]["tile"],
                                                                                 "programs": sel[0]["programs"]}
    return {"launches": per, "shapes": summary, "rate": rates}



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--map", default="gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json")
    ap.add_argument("--mode", default="w4a16", choices=("w4a16",),
                    help="the fragment kernel on bf16 inputs (other modes add untraced quantizer launches)")
    ap.add_argument("--m", default="1,4")
    ap.add_argument("--wait", action="store_true", help="also trace the PDL wait (changes some tiles' registers)")
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("chain_trace.py needs a CUDA GPU")
    shapes, layers = PRESETS["llama3-8b"]["shapes"], PRESETS["llama3-8b"]["layers"]
    model = Model("int4", shapes, layers, 128, torch.bfloat16, "blocks16")
    nbytes = [s.nbytes() for s in model.stores[0]]
    d = AdaptiveDispatcher(load_map_file(a.map), autoload=False)
    act = MODES[a.mode].act
    copy_tbs = copy_bandwidth() / 1e12
    mg.TRACE_WAIT = a.wait
    dev = torch.cuda.get_device_name()
    res = {"device": dev, "map": a.map, "mode": a.mode, "copy_tbs": copy_tbs, "wait": a.wait, "m": {}}
    for m in (int(v) for v in a.m.split(",")):
        xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for _, _, k in shapes]
        run = step_fn(model, xs, lambda x, st: d.linear(x, st, act))
        plain = statistics.median(time_step(run) for _ in range(3))
        launches, traced = traced_step(run)
        if len(launches) != layers * len(shapes):
            raise SystemExit(f"M={m}: {len(launches)} traced launches, expected {layers * len(shapes)} "
                             "(a linear that is not a split_k 1 fragment launch?)")
        tl_ = timeline(launches, shapes, nbytes, copy_tbs, a.wait)
        stamps = torch.cat([L["rows"][:, 0].cpu() for L in launches]).unique()
        tl_["timer_step_ns"] = int((stamps[1:] - stamps[:-1]).min()) if stamps.numel() > 1 else 0
        res["m"][m] = {"plain_ms": plain, "traced_ms": traced} | tl_
        print(f"M={m}: step {plain:.3f} ms untraced, {traced:.3f} ms traced (copy {copy_tbs:.2f} TB/s; "
              f"smallest timer step {tl_['timer_step_ns']} ns)")
        print(f"  implied DRAM rate {tl_['rate']['mean_tbs']:.2f} TB/s on average; "
              f"{tl_['rate']['below_50pct_of_copy']:.0%} of the step below half the copy rate, "
              f"{tl_['rate']['below_80pct_of_copy']:.0%} below 80%")
        print("  shape     tile                       progs  span  bytes  lead  early  ramp  drain  program us "
              "p10/50/90  ends p10/50/90" + ("  release" if a.wait else ""))
        for name, s in tl_["shapes"].items():
            print(f"  {name:8s}  {s['tile']:26s} {s['programs']:5d} {s['span']:5.2f}  {s['bytes_us']:5.2f} "
                  f"{s['lead']:5.2f}  {s['early']:5.2f} {s['ramp']:5.2f}  {s['drain']:5.2f}  "
                  f"{s['dur_p10']:5.2f} {s['dur_p50']:5.2f} {s['dur_p90']:5.2f}  "
                  f"{s['end_p10']:5.2f} {s['end_p50']:5.2f} {s['end_p90']:5.2f}"
                  + (f"  {s['release']:6.2f}" if a.wait else ""), flush=True)
    write_json(a.out, f"chain_trace_{device_slug(dev)}{tag_suffix(a.tag)}_{a.mode}.json", res)


if __name__ == "__main__":
    main()
