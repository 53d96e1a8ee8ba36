"""Time `sample_rows` per decode step: on the logits' device (what the engine does) against the same call on the
rows copied to the host first (the form before stop 58 also copied them, and then filtered row by row, which
was slower still: 40 / 211 ms for 16 rows, plain / top-p, on two CPU cores), for a Llama-3 vocabulary.

Each setting is a batch of rows sharing one SamplingParams (each row its own seeded generator), timed over
`--reps` calls after two warm-up calls, with a device sync around each call. Greedy rows are the argmax alone.

Usage: python benchmarks/sampling.py [--rows 1,16,64] [--vocab 128256] [--reps 10] [--out DIR]
writes DIR/sampling_<device>.json, prints a table last.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gearshift.decode.sampling import SamplingParams, sample_rows  # noqa: E402

SETTINGS = {"greedy": dict(), "temperature 0.7": dict(temperature=0.7),
            "top-p 0.9": dict(temperature=0.7, top_p=0.9),
            "top-k 50, top-p 0.95": dict(temperature=0.8, top_k=50, top_p=0.95)}


def time_call(fn, reps: int, cuda: bool) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,16,64")
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    device_name = torch.cuda.get_device_name() if cuda else "cpu"
    results = []
    for rows in (int(r) for r in a.rows.split(",")):
        logits = torch.randn(rows, a.vocab, device=dev, dtype=torch.bfloat16) * 3
        for name, kw in SETTINGS.items():
            p = SamplingParams(seed=0, **kw)
            on_dev = [p.make_generator(dev) for _ in range(rows)]
            on_host = [p.make_generator() for _ in range(rows)]
            d = time_call(lambda: sample_rows(logits, [p] * rows, on_dev), a.reps, cuda)
            h = time_call(lambda: sample_rows(logits.cpu(), [p] * rows, on_host), a.reps, cuda)
            results.append({"rows": rows, "setting": name, "device_ms": round(d, 3), "host_ms": round(h, 3)})
    out = Path(a.out) / f"sampling_{re.sub(r'[^A-Za-z0-9_.-]+', '_', device_name).strip('_')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"device": device_name, "vocab": a.vocab, "torch": torch.__version__,
                               "cpu_threads": torch.get_num_threads(), "results": results}, indent=1))
    print(out)
    print(f"{'rows':>5} {'setting':>22} {'on device (ms)':>15} {'via host (ms)':>14}")
    for r in results:
        print(f"{r['rows']:>5} {r['setting']:>22} {r['device_ms']:15.3f} {r['host_ms']:14.3f}")


if __name__ == "__main__":
    main()
