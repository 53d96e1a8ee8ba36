#!/usr/bin/env bash
# Profile every case of ncu_cases.py with Nsight Compute (full set, clocks left alone) and export
# the details page and the per-instruction SASS page as CSV into $1 (default ./ncu).
#   bash benchmarks/tc_ablations/ncu_run.sh $OUT [case ...]
set -u
out=${1:-ncu}; shift || true
mkdir -p "$out"
cases=${*:-$(PYTHONPATH=. python benchmarks/tc_ablations/ncu_cases.py --list)}
for c in $cases; do
  ncu --clock-control none --set full --import-source no -k 'regex:wgmma|progressive|gemv|nvjet|gemm|xmma' \
      --launch-skip 1 --launch-count 1 -f -o "$out/$c" \
      env PYTHONPATH=. python benchmarks/tc_ablations/ncu_cases.py --case "$c" > "$out/$c.log" 2>&1
  echo "$c: rc $?"
  ncu -i "$out/$c.ncu-rep" --page details --csv > "$out/${c}_details.csv" 2>> "$out/$c.log"
  ncu -i "$out/$c.ncu-rep" --page source --csv --print-source sass > "$out/${c}_sass.csv" 2>> "$out/$c.log"
done
ls -la "$out"
