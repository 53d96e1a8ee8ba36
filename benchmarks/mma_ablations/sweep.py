"""Shared driver of the fragment-kernel ablations: for each Llama-3-8B shape, token count and
variant, every tile config is checked against the torch reference and timed over enough weight
copies to exceed L2; writes all timings to JSON and prints the per-shape bests with their
32-layer step sums (GPU)."""
import argparse
import json
from pathlib import Path
from typing import Callable

import torch

import gearshift.kernels.int4_mma_gemv as mg
from gearshift.dispatch.profiler import PRESETS, n_copies, random_store, time_us
from gearshift.kernels.config import TileConfig
from gearshift.kernels.reference import linear_reference
from gearshift.jsonfile import read_json

SHAPES = tuple(PRESETS["llama3-8b"]["shapes"])


def sweep(variants: dict[str, Callable[[], dict | None]], restore: Callable[[], None], cfgs: list[TileConfig],
          ms: list[int], out: str, name: str) -> None:
    """variants: label -> a function that switches the kernel to that variant and may return
    {"layout": L} to run it on the same weights in Int4Weight layout L; restore undoes it."""
    rows, best = [], {}
    for shape, n, k in SHAPES:
        probe = random_store("int4", n, k, 128, "cuda")
        plain = [probe] + [random_store("int4", n, k, 128, "cuda") for _ in range(n_copies(probe) - 1)]
        copies = {"rows": plain}
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            ref = linear_reference(x.float(), plain[0], None)
            for label, apply in variants.items():
                layout = (apply() or {}).get("layout", "rows")
                if layout not in copies:
                    copies[layout] = [s.to_layout(layout) for s in plain]
                stores = copies[layout]
                for cfg in cfgs:
                    if not mg.mma_gemv_supports(stores[0], cfg, m):
                        continue
                    y = mg.mma_gemv(x, stores[0], cfg)
                    rel = ((y.float() - ref).norm() / ref.norm()).item()
                    assert rel < 3e-3, (shape, m, label, cfg.key(), rel)
                    us = time_us([lambda s=s: mg.mma_gemv(x, s, cfg) for s in stores])
                    rows.append(dict(shape=shape, m=m, variant=label, config=cfg.to_dict(), us=us, rel_err=rel))
                    keep_best(best, (shape, m, label), us, cfg)
                restore()
        del plain, copies, stores
        torch.cuda.empty_cache()
    report(out, name, rows, best, ms, list(variants))


def family_sweep(ms: list[int], family: Callable[[TileConfig], str], families: list[str], out: str,
                 name: str, configs: Callable[[int], list[TileConfig]] | None = None) -> None:
    """Every fragment tile of `configs(m)` (default `strategies.mma_configs`) per shape and M, checked
    against the reference and for bit-identical reruns, then timed; per-shape bests kept per
    `family(cfg)` and reported."""
    from gearshift.dispatch.strategies import mma_configs

    rows, best = [], {}
    for shape, m, x, stores, ref in shape_cases(ms):
        for cfg in (configs or mma_configs)(m):
            if not mg.mma_gemv_supports(stores[0], cfg, m):
                continue
            y = mg.mma_gemv(x, stores[0], cfg)
            rel = ((y.float() - ref).norm() / ref.norm()).item()
            assert rel < 3e-3, (shape, m, cfg.key(), rel)
            assert torch.equal(mg.mma_gemv(x, stores[0], cfg), y), (shape, m, cfg.key())
            us = time_us([lambda s=s: mg.mma_gemv(x, s, cfg) for s in stores])
            fam = family(cfg)
            rows.append(dict(shape=shape, m=m, family=fam, config=cfg.to_dict(), us=us, rel_err=rel))
            keep_best(best, (shape, m, fam), us, cfg)
    report(out, name, rows, best, ms, families)


def ms_arg(doc: str, default: str) -> list[int]:
    """Parses a script's --ms and --out: (token counts, output folder)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default=default, help="token counts (1..16)")
    ap.add_argument("--out", default="benchmarks/results", help="folder for the JSON")
    args = ap.parse_args()
    return [int(v) for v in args.ms.split(",")], args.out


def seeded_args(doc: str, default_ms: str, default_top: int):
    """The seed-map ablations' command line (--ms, --top, --seed, --tag, --out): (args, token
    counts, the seed map as JSON, shape name -> (N, K))."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default=default_ms, help="token counts (1..16)")
    ap.add_argument("--top", type=int, default=default_top, help="seed tiles per shape and M")
    ap.add_argument("--seed", default="gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json", help="policy map")
    ap.add_argument("--tag", default="", help="suffix of the result file name")
    ap.add_argument("--out", default="benchmarks/results", help="folder for the JSON")
    a = ap.parse_args()
    seed = read_json(a.seed)
    return a, [int(v) for v in a.ms.split(",")], seed, {s: (n, k) for s, n, k in SHAPES}


def shape_cases(ms: list[int], layout: str = "blocks16"):
    """(shape, m, x, stores, ref) for every Llama-3-8B shape and token count: `stores` are enough
    random int4 copies (in `layout`) to exceed L2, ref the torch reference of x on the first."""
    for shape, n, k in SHAPES:
        stores = [random_store("int4", n, k, 128, "cuda", layout=layout)]
        stores += [random_store("int4", n, k, 128, "cuda", layout=layout) for _ in range(n_copies(stores[0]) - 1)]
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            yield shape, m, x, stores, linear_reference(x.float(), stores[0], None)
        del stores
        torch.cuda.empty_cache()


def keep_best(best: dict, key: tuple, us: float, cfg: TileConfig) -> None:
    if key not in best or us < best[key][0]:
        best[key] = (us, cfg.key())


def report(out: str, name: str, rows: list[dict], best: dict, ms: list[int], labels: list) -> None:
    """Writes {name}_{device}.json (all rows, the bests keyed shape:m:label) and prints, per M and
    label, the per-shape best tiles and their 32-layer step sum."""
    dev = torch.cuda.get_device_name()
    Path(out).mkdir(parents=True, exist_ok=True)
    (Path(out) / f"{name}_{dev.replace(' ', '_')}.json").write_text(json.dumps(
        {"device": dev, "rows": rows, "best": {":".join(map(str, k)): v for k, v in best.items()}}, indent=1))
    print(f"{dev}: best us per shape (tile); 32-layer step sum, ms")
    for m in ms:
        for label in labels:
            tot = sum(best[(s, m, label)][0] for s, _, _ in SHAPES) * 32 / 1000
            print(f"M={m:2} {label!s:>11}: " + "  ".join(f"{s} {best[(s, m, label)][0]:5.1f} {best[(s, m, label)][1]}"
                                                       for s, _, _ in SHAPES) + f"  step {tot:.3f}")
