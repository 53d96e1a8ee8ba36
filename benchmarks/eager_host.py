"""Host time of eager forwards (GPU): what a first-sight prefill, or a prompt longer than the graphed
rows, pays. Builds a random-weight 8B model (int4-prog stores), runs batch-1 forwards eagerly (CUDA graphs
off) at several lengths and reports, per length, the host time until the call returns, the wall time
until the GPU is done and the CUDA-event time (medians of 5). Where host and wall times agree, the host
is the bottleneck. Also writes a cProfile (internal and cumulative time) and a torch.profiler table of one
forward at --profile-tokens.

    PYTHONPATH=. python benchmarks/eager_host.py --tokens 32,512,2048 --tag NAME
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama3-8b")
    ap.add_argument("--mode", default="w4a16")
    ap.add_argument("--tokens", default="32,512,2048")
    ap.add_argument("--profile-tokens", type=int, default=512)
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("eager_host.py times forwards on a CUDA GPU")
    from kernel_bench import tag_suffix, write_json
    from torch.profiler import ProfilerActivity, profile

    from gearshift.dispatch.policy import device_slug
    from gearshift.model.tiny import build_random_model

    model = build_random_model(a.preset, weights="int4-prog", device="cuda")
    model.use_cuda_graphs = False
    lengths = [int(t) for t in a.tokens.split(",")]
    cache = model.new_cache(1, max(lengths + [a.profile_tokens]))

    def forward(toks):
        cache.lengths[0] = 0
        return model(toks, cache, [0], [toks.shape[1]], mode=a.mode, logits="last")

    rows, extra = [], {}
    for t in lengths:
        toks = torch.randint(0, 1000, (1, t), device="cuda")
        for _ in range(2):  # compile and warm
            forward(toks)
        host, wall, events = [], [], []
        for _ in range(5):
            torch.cuda.synchronize()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0 = time.perf_counter()
            e0.record()
            forward(toks)
            e1.record()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            wall.append((time.perf_counter() - t0) * 1e3)
            host.append((t1 - t0) * 1e3)
            events.append(e0.elapsed_time(e1))
        rows.append({"tokens": t, "host_ms": statistics.median(host), "wall_ms": statistics.median(wall),
                     "events_ms": statistics.median(events)})
        print(rows[-1], flush=True)
    toks = torch.randint(0, 1000, (1, a.profile_tokens), device="cuda")
    forward(toks)
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    forward(toks)
    pr.disable()
    torch.cuda.synchronize()
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats(key).print_stats(40)
        extra[f"cprofile_{key}"] = s.getvalue()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        forward(toks)
        torch.cuda.synchronize()
    extra["torch_profiler"] = p.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "preset": a.preset, "mode": a.mode,
           "rows": rows, **extra}
    write_json(a.out, f"eager_host_{device_slug(doc['device'])}_{a.mode}{tag_suffix(a.tag)}.json", doc)
    print(f"\n{'tokens':>7} {'host ms':>8} {'wall ms':>8} {'events ms':>9}")
    for r in rows:
        print(f"{r['tokens']:7d} {r['host_ms']:8.1f} {r['wall_ms']:8.1f} {r['events_ms']:9.1f}")


if __name__ == "__main__":
    main()
