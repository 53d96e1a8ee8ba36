"""Read what `ncu_run.sh` exported: a side-by-side table of the details pages, and per case the
warp-stall samples by reason, by run of instructions with the same execution count (a loop body
or a partition), and the instructions with the most samples (CPU; no GPU needed).

    python benchmarks/tc_ablations/ncu_report.py DIR gate_up1024_dp gate_up1024_cublas
    python benchmarks/tc_ablations/ncu_report.py DIR gate_up1024_dp --sass 25
"""
import argparse
import collections
import csv
from pathlib import Path


def number(v: str) -> float:
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return 0.0


def details(folder: Path, case: str) -> dict:
    out = {}
    for r in csv.DictReader(open(folder / f"{case}_details.csv")):
        if r["Metric Name"]:
            out[(r["Section Name"], r["Metric Name"])] = f"{r['Metric Value']} {r['Metric Unit']}".strip()
    return out


def sass(folder: Path, case: str, top: int) -> None:
    with open(folder / f"{case}_sass.csv") as f:
        f.readline()  # "Kernel Name", ...
        rows = list(csv.DictReader(f))
    reasons = [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k]
    samples = [number(r["Warp Stall Sampling (All Samples)"]) for r in rows]
    total = sum(samples) or 1.0

    def by_reason(rs) -> str:
        c = collections.Counter()
        for r in rs:
            for k in reasons:
                c[k[6:]] += number(r[k])
        s = sum(c.values()) or 1.0
        return ", ".join(f"{k} {v / s * 100:.0f}%" for k, v in c.most_common(5))

    print(f"== {case}: {int(total)} samples, {len(rows)} instructions; {by_reason(rows)}")
    runs = []
    for r, n in zip(rows, samples):
        if runs and runs[-1][0] == r["Instructions Executed"]:
            runs[-1][1].append(r)
            runs[-1][2] += n
        else:
            runs.append([r["Instructions Executed"], [r], n])
    for execs, rs, n in runs:
        if n / total >= 0.005:
            print(f"  {rs[0]['Address'][-5:]}-{rs[-1]['Address'][-5:]} {len(rs):4d} instr x {execs:>9}: "
                  f"{n / total * 100:5.1f}%  {by_reason(rs)}")
    for r, n in sorted(zip(rows, samples), key=lambda p: -p[1])[:top]:
        print(f"    {r['Address'][-5:]} {n / total * 100:5.1f}% x{r['Instructions Executed']:>9} {r['Source'].strip()[:70]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--sass", type=int, default=0, help="also the stall report, with this many top instructions")
    a = ap.parse_args()
    tables = {c: details(a.folder, c) for c in a.cases}
    keys = list(dict.fromkeys(k for t in tables.values() for k in t))
    print(f"{'section | metric':64s}" + "".join(f"{c[:23]:>24s}" for c in a.cases))
    for k in keys:
        print(f"{(k[0][:24] + ' | ' + k[1])[:64]:64s}" + "".join(f"{tables[c].get(k, '-')[:23]:>24s}" for c in a.cases))
    if a.sass:
        for c in a.cases:
            if (a.folder / f"{c}_sass.csv").exists():
                sass(a.folder, c, a.sass)


if __name__ == "__main__":
    main()
