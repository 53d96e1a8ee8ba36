"""Does keeping one register-A wgmma in flight pay? (`TileConfig.pipe_a`, GPU)

With A in registers the W4A16 wgmma consumers retire each wgmma before dequantizing the next tile.
`_pipelined_a_loop` keeps one in flight (two tiles per loop body, so the two A fragments never
share PTX registers). ptxas 12.8 pipelines that only in the kernel's default partition and with
enough registers (else C7512, wgmmas serialized again; checked on the CPU), so an 8-warp pipelined
tile runs either as two 4-warp consumers of which only the first is pipelined ("first") or as one
cooperative 8-warp consumer ("coop", where ptxas pipelines it: 64/128 x 128 tiles).

Per Llama-3-8B shape and M: the shipped map's tile, cuBLAS bf16 on a dense copy, and each candidate
tile serial (8 warps: two consumers) and pipelined. Every pipelined launch is first compared bit
for bit with the serial one on the same inputs, several times (the stop-15 failure was rows g + 8
differing from run to run).

    git apply benchmarks/results/pipelined_a.patch   # the switch was measured and not kept
    python benchmarks/tc_ablations/pipelined_a.py --fmt int4p --out $OUT/pipelined_a.json

Stop 26 (H100, `results/pipelined_a_run*_*.json`): bit-identical everywhere; 4-warp one-consumer
tiles 0.75-0.93x of their serial selves, 8-warp tiles 0.99-1.07x ("first") and 1.00-1.03x ("coop");
the best pipelined tile beat the shipped map's tile only on o at M = 256 (19.1 against 21.4 us).
"""
import argparse
import dataclasses
import json

SHAPES = (("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336))
MAP = "gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json"
#: candidates (bm, bn, bk, warps, stages, maxnreg); 4 warps at 200 registers: two CTAs per SM
CANDIDATES = ((256, 128, 64, 8, 4, 0), (256, 128, 64, 8, 3, 0), (128, 128, 128, 8, 4, 0), (128, 128, 64, 8, 4, 0),
              (256, 64, 64, 4, 4, 0), (128, 64, 128, 4, 3, 200))
#: 8-warp tiles that ptxas also pipelines as one cooperative consumer (`PIPE_8WARP = "coop"`)
COOP = ((128, 128, 64), (64, 128, 64), (64, 128, 128))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default="256,512,1024")
    ap.add_argument("--shapes", default="qkv,o,gate_up,down")
    ap.add_argument("--fmt", default="int4p", choices=("int4", "int4p"))
    ap.add_argument("--checks", type=int, default=4, help="bitwise repeats of each pipelined launch")
    ap.add_argument("--out", default="pipelined_a.json")
    a = ap.parse_args()

    import torch

    import gearshift.kernels.w4a16_wgmma as W
    from gearshift.dispatch.profiler import n_copies, random_store, time_us
    from gearshift.kernels.config import TileConfig
    from gearshift.kernels.reference import linear_reference
    from gearshift.quant.int4 import BLOCKS16

    entries = json.load(open(MAP))["entries"]
    rows = {}
    for m in (int(v) for v in a.ms.split(",")):
        for name, n, k in (s for s in SHAPES if s[0] in a.shapes.split(",")):
            probe = random_store(a.fmt, n, k, 128, "cuda", layout=BLOCKS16)
            stores = [probe] + [random_store(a.fmt, n, k, 128, "cuda", layout=BLOCKS16)
                                for _ in range(n_copies(probe) - 1)]
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = linear_reference(x.float(), probe, None)
            row = {}
            e = entries[f"w4a16:g128:{n}x{k}"].get(str(m)) or {}
            if e.get("strategy") == "w4a16_wgmma":
                cfg = TileConfig.from_dict(e["config"])
                row["map"] = dict(tile=cfg.key(), us=time_us([lambda s=s: W.w4a16_wgmma(x, s, cfg) for s in stores]))
            dense = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(max(2, len(stores) // 4))]
            row["cublas_us"] = time_us([lambda w=w: x @ w.t() for w in dense])
            del dense
            for bm, bn, bk, w, st, r in CANDIDATES:
                cfg = TileConfig(bm, bn, bk, 1, w, st, maxnreg=r)
                pipe = dataclasses.replace(cfg, pipe_a=True)
                if bm > max(64, m) or not W.wgmma_supports(probe, cfg):
                    continue
                serial = W.w4a16_wgmma(x, probe, cfg)
                rel = ((serial.float() - ref).norm() / ref.norm()).item()
                t_serial = time_us([lambda s=s: W.w4a16_wgmma(x, s, cfg) for s in stores])
                res = dict(serial_us=t_serial, rel_err=rel)
                for mode in ("first", "coop") if w == 8 else ("first",):
                    if mode == "coop" and (bm, bn, bk) not in COOP:
                        continue
                    W.PIPE_8WARP = mode
                    same = all(torch.equal(W.w4a16_wgmma(x, probe, pipe), serial) for _ in range(a.checks))
                    t_pipe = time_us([lambda s=s: W.w4a16_wgmma(x, s, pipe) for s in stores])
                    W.PIPE_8WARP = "first"
                    res[f"pipelined_{mode}_us"] = t_pipe
                    res[f"bitwise_equal_{mode}"] = same
                    print(f"{name:8s} M={m:5d} {cfg.key():26s} serial {t_serial:8.1f} pipelined ({mode}) {t_pipe:8.1f} "
                          f"us ({t_pipe / t_serial:.3f})  same bits {same}  err {rel:.1e}", flush=True)
                row[cfg.key()] = res
            rows[f"{name}:{m}"] = row
            del stores
            torch.cuda.empty_cache()
    json.dump(dict(device=torch.cuda.get_device_name(), fmt=a.fmt, candidates=CANDIDATES, rows=rows),
              open(a.out, "w"), indent=1)
    print(f"\n{'shape':8s} {'M':>5s} {'map':>8s} {'cuBLAS':>8s} {'best serial':>12s} {'best pipelined':>15s}")
    for key, row in rows.items():
        cand = {k: v for k, v in row.items() if isinstance(v, dict) and "serial_us" in v}
        bs = min((v["serial_us"] for v in cand.values()), default=float("nan"))
        bp = min((v[f"pipelined_{mode}_us"] for v in cand.values() for mode in ("first", "coop")
                  if v.get(f"bitwise_equal_{mode}")), default=float("nan"))
        name, m = key.split(":")
        print(f"{name:8s} {m:>5s} {row.get('map', {}).get('us', float('nan')):8.1f} {row['cublas_us']:8.1f} "
              f"{bs:12.1f} {bp:15.1f}")


if __name__ == "__main__":
    main()
