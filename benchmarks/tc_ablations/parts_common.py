"""What the `*_parts.py` ablation scripts share: tile lists from the command line, and the JSON
and table they end with."""
import argparse
import json
import os

import torch

from gearshift.dispatch.profiler import PRESETS, time_us
from gearshift.kernels.config import TileConfig
from gearshift.quant.activations import ActQuantSpec


def parts_parser(doc: str, ms: str, configs: str, tag: str) -> argparse.ArgumentParser:
    """The options every parts script takes (it may add its own)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default=ms)
    ap.add_argument("--configs", default=configs, help="BM,BN,warps,stages,maxnreg,split_k;...")
    ap.add_argument("--ablate", default="0,1,2,3,4,7")
    ap.add_argument("--ncu", action="store_true", help="one launch per tile, for Nsight Compute; no timing")
    ap.add_argument("--tag", default=tag)
    return ap


def parse_parts(ap: argparse.ArgumentParser):
    """(args, tiles, {shape: (N, K)} of Llama-3-8B, the int8 per-token activation spec)."""
    args = ap.parse_args()
    return (args, tile_configs(args.configs), {name: (n, k) for name, n, k in PRESETS["llama3-8b"]["shapes"]},
            ActQuantSpec("int8"))


def tile_configs(spec: str, bk: int = 128) -> list[TileConfig]:
    """"BM,BN,warps,stages,maxnreg,split_k;..." -> tiles."""
    return [TileConfig(bm, bn, bk, sk, w, st, maxnreg=r) for bm, bn, w, st, r, sk in
            (tuple(int(v) for v in c.split(",")) for c in spec.split(";"))]


def ablation_row(m: int, name: str, n: int, k: int, cfg: TileConfig, ablate: str, copies: list, run) -> dict:
    """One (M, shape, tile) row: us for each ablate value (`run(store, ablate)` over the weight
    copies in turn, so the weights come from DRAM) and the full tile's TOPS; printed as it goes."""
    row = {"m": m, "shape": name, "cfg": cfg.key()}
    for ab in (int(v) for v in ablate.split(",")):
        row[str(ab)] = time_us([lambda s=s, ab=ab: run(s, ab) for s in copies])
    row["tops"] = 2 * m * n * k / row["0"] / 1e6
    print(row, flush=True)
    return row


def save_and_print(rows: list[dict], ablate: str, tag: str) -> None:
    """$OUT/<tag>.json, then one line per (M, shape, tile): us per ablation and the full tile's TOPS."""
    json.dump({"device": torch.cuda.get_device_name(), "rows": rows},
              open(os.path.join(os.environ.get("OUT", "."), f"{tag}.json"), "w"), indent=1)
    cols = ablate.split(",")
    print(f"\n{'M':>5} {'shape':8} {'cfg':24} " + " ".join(f"{'ab' + a:>8}" for a in cols) + "  TOPS")
    for r in rows:
        print(f"{r['m']:5d} {r['shape']:8} {r['cfg']:24} " + " ".join(f"{r[a]:8.1f}" for a in cols)
              + f"  {r['tops']:.0f}")
