#!/usr/bin/env bash
# The H100 measurements that issue 6's targets still owe (stops 64-72 changed the small-M and partial-tile paths
# on an H200 only), in the order of their value, for the first device call that gets an H100:
#
#     bash benchmarks/owed_h100.sh OUT_DIR [PART...]      # PART: record steps pad prefill profile ksplit (default: all)
#
# record:  the target rows on the current tree, with cuBLAS / tinygemm in the same run (policy_ab.py +
#          record_table.py): W4A16 1..16 tokens on x tiles, 32..4096; W4A8 on int4-prog weights with producer codes
# steps:   the engine's decode step, shipped switches against the forms they replaced: group_index=signed (stop
#          70), s8_fragment_order=0 (stop 69)
# pad:     partial token tiles as the engine reads them (the producers' whole-tile buffers, stop 72; else the copy of
#          stop 71, W4A8's codes since stop 72) against out of bounds, and against the copy alone, whole steps of
#          linears at odd token counts
# prefill: graphed prefills with the switch tile_room on / off (tile_room_ab.py)
# profile: a seeded W4A16 re-profile of 4/8/16 tokens on x tiles, refined on the decode step (it writes a map to
#          OUT_DIR; compare it with step_ab.py --map before shipping it)
# ksplit:  W4A8's K-split progressive tiles (stop 73) against the H100 map's picks at 64 / 128 tokens, and the
#          whole step on a what-if map that takes them where they are faster (OUT_DIR/ksplit_map.json)
# Each part is bounded by `timeout` so that one call of at most 10 minutes keeps what finished. This script has
# not run as a whole yet: its commands are the ones the stop notes name, and `tests/test_owed_h100.py` checks on
# the CPU that each one parses and names only switches that exist.
set -u
OUT=${1:?usage: owed_h100.sh OUT_DIR [record|steps|pad|prefill|profile|ksplit ...]}
shift
PARTS=${*:-record steps pad prefill profile ksplit}
MAP=gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1
mkdir -p "$OUT"
run() {  # run SECONDS CMD...: one bounded step, its log under OUT
    local limit=$1; shift
    echo "== $* (at most ${limit}s)"
    timeout "$limit" "$@" 2>&1 | tee -a "$OUT/owed_h100.log" | tail -12
}
for part in $PARTS; do
    case $part in
    record)
        run 150 python benchmarks/policy_ab.py --a $MAP --b $MAP --mode w4a16 --m 1,2,4,8,16 --x-tiles --cublas \
            --tinygemm --rounds 3 --tag owed_record_small --out "$OUT"
        run 150 python benchmarks/policy_ab.py --a $MAP --b $MAP --mode w4a16 --m 32,64,128,256,512,1024,2048,4096 \
            --cublas --rounds 3 --tag owed_record_large --out "$OUT"
        run 150 python benchmarks/policy_ab.py --a $MAP --b $MAP --mode w4a8 --int4-prog --norm-codes \
            --m 1,2,4,8,16,32,64,128,256,512,1024,2048,4096 --cublas --rounds 3 --tag owed_record --out "$OUT"
        python benchmarks/record_table.py "$OUT"/policy_ab_*owed_record*.json --out "$OUT/record_owed.md" ;;
    steps)
        run 150 python benchmarks/step_ab.py --mode w4a16 --batches 1,2,4,8 --side signed=group_index=signed \
            --side rule= --rounds 5 --tag owed_group_index --out "$OUT"
        run 150 python benchmarks/step_ab.py --mode w4a8 --int4-prog --batches 1,2,4,8,16 \
            --side rows=s8_fragment_order=0 --side frag= --rounds 5 --tag owed_s8_order --out "$OUT" ;;
    pad)
        run 120 python benchmarks/policy_ab.py --a $MAP --b $MAP --mode w4a16 \
            --set-a PAD_ABSENT_EIGHTHS=-1,switches.tile_room=0 --m 33,41,47,65,80,96,129,160,200,257,300,513,700 \
            --rounds 3 --tag owed_pad --out "$OUT"
        run 120 python benchmarks/policy_ab.py --a $MAP --b $MAP --mode w4a16 --set-a switches.tile_room=0 \
            --m 33,47,65,96,129,192,257,384,513,700 --rounds 3 --tag owed_room --out "$OUT"
        run 150 python benchmarks/policy_ab.py --a $MAP --b $MAP --mode w4a8 --int4-prog --norm-codes \
            --set-a w4a8_progressive.PAD_ABSENT_ROWS=-1,switches.tile_room=0 \
            --m 65,96,129,160,192,200,257,300,384,513,700 --rounds 3 --tag owed_pad_w4a8 --out "$OUT" ;;
    prefill)
        run 280 python benchmarks/tile_room_ab.py --lengths 20,40,90,150,300 --rounds 5 --tag owed --out "$OUT" ;;
    profile)
        run 400 python -m gearshift profile --model llama3-8b --m 4,8,16 --modes w4a16 --seed auto --top 12 \
            --refine 4,8,16 --out "$OUT/NVIDIA_H100_80GB_HBM3.w4a16_4_8_16.json" ;;
    ksplit)
        run 150 python benchmarks/tc_ablations/progressive_ksplit.py --map $MAP --ms 64,128 \
            --map-out "$OUT/ksplit_map.json" --tag progressive_ksplit_owed
        run 150 python benchmarks/policy_ab.py --a $MAP --b "$OUT/ksplit_map.json" --mode w4a8 --int4-prog \
            --norm-codes --m 64,80,96,128 --rounds 3 --tag owed_ksplit --out "$OUT" ;;
    *) echo "unknown part $part (record, steps, pad, prefill, profile, ksplit)"; exit 2 ;;
    esac
done
