"""Achieved rates of `benchmarks/progressive.py` results (CPU, reads its JSON): per shape and M, the
W4A8 kernel's TOPS as a share of the H100's int8 dense peak (1979 TOPS, datasheet; PERF.md lists no
compute ceilings), cuBLAS bf16's TFLOP/s in the same run, and the time as a multiple of the int4
weight-read floor (codes + fp16 scales and mins / the copy bandwidth measured in the same run).

    python benchmarks/progressive_rates.py benchmarks/results/progressive_NVIDIA_H100_80GB_HBM3.json
"""
import argparse

from gearshift.jsonfile import read_json

INT8_PEAK = 1979e12


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="progressive_<device>.json")
    ap.add_argument("--mode", default="w4a8")
    ap.add_argument("--group", type=int, default=128)
    a = ap.parse_args(argv)
    d = read_json(a.results)
    bw = d["copy_bw_Bps"]
    print(f"{d['device']}, copy bandwidth {bw / 1e12:.2f} TB/s")
    print(f"| shape | M | {a.mode} progressive us | TOPS | of int8 peak | cuBLAS bf16 TFLOP/s | x weight floor |")
    print("|---|---|---|---|---|---|---|")
    for name, per in d["shapes"].items():
        n, k = per["n"], per["k"]
        floor = (n * k / 2 + n * (k // a.group) * 4) / bw
        for m, row in per.items():
            if not isinstance(row, dict) or f"{a.mode}_progressive" not in row:
                continue
            us = row[f"{a.mode}_progressive"]
            ops = 2 * int(m) * n * k
            print(f"| {name} | {m} | {us:.1f} | {ops / us / 1e6:.0f} | {ops / us / 1e6 / INT8_PEAK * 1e12:.0%} "
                  f"| {ops / row['cublas_bf16'] / 1e6:.0f} | {us * 1e-6 / floor:.1f}x |")


if __name__ == "__main__":
    main()
