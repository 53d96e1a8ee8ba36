"""The issue-6 record table from `policy_ab.py` runs with the shipped map on both sides (CPU, no GPU).

A record run times the same map as side A and side B (so every step is timed 2 x --rounds times,
alternating) and, with --cublas / --tinygemm, the library baselines in the same process. This turns
one or more such JSONs into the Markdown table the issue asks for: ms per 32-layer step, the ratio to
the int4 floor (the weights' bytes over the copy bandwidth measured in that run), achieved GB/s as a
ratio to that bandwidth, TFLOP/s as a ratio to the dense datasheet peak (bf16 989, int8 1979), and
the same run's cuBLAS bf16 over this step.

    python benchmarks/record_table.py benchmarks/results/policy_ab_*_stop44_record_*.json \\
        --out benchmarks/results/record_stop44.md
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_bench import PEAK  # noqa: E402  (the H100 SXM dense datasheet peaks, as kernel_bench.py's tables)

from gearshift.dispatch.profiler import PRESETS  # noqa: E402
from gearshift.jsonfile import read_json  # noqa: E402

#: the tensor-core type each mode's large-M kernels run on (a key of PEAK)
MODE_MMA = {"w4a16": "bf16_tflops", "w4a8": "int8_tops", "w4a4": "int8_tops", "w4a8fp8": "fp8_tflops"}


def step_flops(preset: str, m: int) -> float:
    if preset not in PRESETS:
        raise SystemExit(f"preset {preset!r}: record_table.py knows {sorted(PRESETS)}")
    shapes, layers = PRESETS[preset]["shapes"], PRESETS[preset]["layers"]
    return 2.0 * m * layers * sum(n * k for _, n, k in shapes)


def rows(run: dict) -> list[dict]:
    """One row per M of a record run (both sides' timings pooled: the same map ran on both)."""
    if Path(run["a"]).resolve() != Path(run["b"]).resolve() or run.get("set_a") != run.get("set_b"):
        raise SystemExit(f"{run['mode']}: not a record run (sides differ: {run['a']} / {run['b']})")
    if "weight_bytes" not in run or "copy_bw_Bps" not in run:
        raise SystemExit(f"{run['mode']}: the run has no weight_bytes / copy_bw_Bps (policy_ab.py before stop 44)")
    floor_ms = run["weight_bytes"] / run["copy_bw_Bps"] * 1e3
    out = []
    for m, r in sorted(run["ms"].items(), key=lambda kv: int(kv[0])):
        ms = statistics.median(r["runs"]["a"] + r["runs"]["b"])
        tflops = step_flops(run["preset"], int(m)) / (ms * 1e-3) / 1e12
        row = {"mode": run["mode"], "m": int(m), "ms": ms, "x_floor": ms / floor_ms,
               "gbs": run["weight_bytes"] / (ms * 1e-3) / 1e9, "x_bw": floor_ms / ms, "tflops": tflops,
               "x_peak": tflops / PEAK[MODE_MMA[run["mode"]]], "floor_ms": floor_ms,
               "spread": (min(r["runs"]["a"] + r["runs"]["b"]), max(r["runs"]["a"] + r["runs"]["b"]))}
        if "cublas_bf16" in r:
            row["cublas"] = r["cublas_bf16"]
        if "tinygemm" in r:
            row["tinygemm"] = r["tinygemm"]
        out.append(row)
    return out


def markdown(runs: list[dict]) -> str:
    lines = []
    for run in runs:
        rs = rows(run)
        f = rs[0]["floor_ms"]
        lines += [f"### {run['mode'].upper()} on {run['device']}{' (int4-prog weights)' if run['int4_prog'] else ''}"
                  f"{', producers write the codes of ' + run['norm_codes'] if run.get('norm_codes') else ''}", "",
                  f"Map `{run['a']}`. Floor {f:.3f} ms: {run['weight_bytes'] / 1e9:.3f} GB of int4 weights, scales "
                  f"and mins at the {run['copy_bw_Bps'] / 1e12:.2f} TB/s copy bandwidth of the same run.", "",
                  "| M | ms (min-max) | x floor | GB/s | x copy BW | TFLOP/s | x peak | cuBLAS bf16 ms | cuBLAS / this | tinygemm ms |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rs:
            cub = f"{r['cublas']:.3f} | {r['cublas'] / r['ms']:.2f}x" if "cublas" in r else "- | -"
            tg = f"{r['tinygemm']:.3f}" if "tinygemm" in r else "-"
            lines.append(f"| {r['m']} | {r['ms']:.3f} ({r['spread'][0]:.3f}-{r['spread'][1]:.3f}) | {r['x_floor']:.2f} | "
                         f"{r['gbs']:.0f} | {r['x_bw']:.2f} | {r['tflops']:.1f} | {r['x_peak']:.3f} | {cub} | {tg} |")
        lines.append("")
    return "\n".join(lines)


def emit(md: str, out: str | None) -> None:
    """Write the Markdown to `out`, or print it."""
    if out:
        Path(out).write_text(md)
    else:
        print(md)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="policy_ab.py JSONs of record runs (the same map on both sides)")
    ap.add_argument("--out", default=None, help="write the Markdown here (default: print it)")
    a = ap.parse_args()
    runs = []
    for p in a.runs:
        try:
            runs.append(read_json(p))
        except (OSError, json.JSONDecodeError) as e:
            raise SystemExit(f"{p}: {e}")
    emit(markdown(runs), a.out)


if __name__ == "__main__":
    main()
