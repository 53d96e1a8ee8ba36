#!/usr/bin/env bash
# Nsight Compute on variants of wgmma_dq_producer.py (gate_up 28672 x 4096, M = 1024; 'reg' is the
# shipped register-A 256 x 128 tile), clocks left alone: the details page and the per-instruction
# SASS page of each as CSV in $1, for ncu_report.py (stop 40).
#   bash benchmarks/tc_ablations/ncu_dq_producer.sh $OUT reg vecp_s4a2 abl2_s4a2 abl3_vecp_s4a2
#   python benchmarks/tc_ablations/ncu_report.py $OUT vecp_s4a2 --sass 40
set -u
out=$1; shift
mkdir -p "$out"
for v in "$@"; do
  ncu --clock-control none --set full --import-source no -k 'regex:dq_|w4a16_wgmma' --launch-skip 1 \
      --launch-count 1 -f -o "$out/$v" env PYTHONPATH=. python benchmarks/tc_ablations/wgmma_dq_producer.py \
      --fmt int4p --shapes gate_up --m 1024 --once "$v" > "$out/$v.log" 2>&1
  echo "$v: rc $?"
  ncu -i "$out/$v.ncu-rep" --page details --csv > "$out/${v}_details.csv" 2>> "$out/$v.log"
  ncu -i "$out/$v.ncu-rep" --page source --csv --print-source sass > "$out/${v}_sass.csv" 2>> "$out/$v.log"
  rm -f "$out/$v.ncu-rep"
done
