"""Every W4A16/W4A8 strategy and tile on the Llama-3-8B shapes, with the same weights in the row
and the blocks16 int4 layout: are the outputs bit-identical, and how fast is each (GPU)?
Usage: PYTHONPATH=. python benchmarks/layout_check.py [--m 16,64] [--shapes gate_up] [--out DIR]
"""
import argparse
import json
from pathlib import Path

import torch

from gearshift.dispatch.profiler import PRESETS, n_copies, random_store, time_us
from gearshift.dispatch.strategies import strategies_for
from gearshift.quant.modes import MODES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", default="16,64")
    ap.add_argument("--modes", default="w4a16")
    ap.add_argument("--shapes", default="qkv,o,gate_up,down")
    ap.add_argument("--configs", type=int, default=4, help="tiles per strategy (the first N of its list)")
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    rows = []
    for shape, n, k in (s for s in PRESETS["llama3-8b"]["shapes"] if s[0] in a.shapes.split(",")):
        plain = [random_store("int4", n, k, 128, "cuda")]
        plain += [random_store("int4", n, k, 128, "cuda") for _ in range(n_copies(plain[0]) - 1)]
        blocks = [s.to_layout("blocks16") for s in plain]
        for mode in a.modes.split(","):
            act = MODES[mode].act
            for m in (int(v) for v in a.m.split(",")):
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                for strat in strategies_for(mode):
                    for cfg in strat.configs(m)[:a.configs]:
                        if not (strat.supports(plain[0], act, cfg) and strat.supports(blocks[0], act, cfg)):
                            continue
                        same = torch.equal(strat.run(x, plain[0], act, cfg), strat.run(x, blocks[0], act, cfg))
                        t = [time_us([lambda s=s: strat.run(x, s, act, cfg) for s in st]) for st in (plain, blocks)]
                        r = dict(shape=shape, mode=mode, m=m, strategy=strat.name,
                                 config=None if cfg is None else cfg.key(), identical=same, rows_us=t[0],
                                 blocks16_us=t[1])
                        rows.append(r)
                        print(f"{shape:8} {mode} M={m:4} {strat.name:15} {r['config']}: identical={same} "
                              f"rows {t[0]:7.1f} us  blocks16 {t[1]:7.1f} us  x{t[1] / t[0]:.2f}", flush=True)
        del plain, blocks
        torch.cuda.empty_cache()
    dev = torch.cuda.get_device_name()
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / f"layout_check_{dev.replace(' ', '_')}.json").write_text(json.dumps({"device": dev, "rows": rows},
                                                                                      indent=1))


if __name__ == "__main__":
    main()
