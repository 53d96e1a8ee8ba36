"""A/B two policy maps on whole decode steps: the 128 Llama-3-8B linears of one 32-layer step
(or another model's, `--preset`; distinct random weights) through the dispatcher under map A and
map B, alternating A, B, A, B... in one process so drift hits both alike; medians per M (GPU).
Every choice of both maps is first checked against the torch reference. Per-shape profiles can
disagree with whole steps (PDL overlaps a kernel's start with its predecessor), so a map change is judged here.

    python benchmarks/policy_ab.py --a gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json --b merged.json \\
        --mode w4a16 --m 1,2,4,8,16 --out benchmarks/results

With --layout-a / --layout-b the two sides hold the same weights in different int4 layouts
(`Int4Weight.to_layout`); with the same map on both, their outputs must then be bit-identical,
which is checked for every shape and M before timing. --set-a / --set-b set kernel switches per side
(`kernels/w4a16_wgmma.py`: `PACKED_DEQUANT=never`, `WGMMA_PDL=0`; other modules by name:
`w4a8_progressive.PROGRESSIVE_PDL=0`); with the
same map and layout the two sides' outputs are then checked bit-identical too (except with
`PACKED_DEQUANT=always`, which rounds scales).
"""
import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_bench import (Model, codes_step_fn, engine_rows, kernel_switches, producer_codes,  # noqa: E402
                          producer_tiles, step_fn, tag_suffix, time_step, tinygemm_step, write_json)

from gearshift.dispatch.dispatcher import AdaptiveDispatcher  # noqa: E402
from gearshift.dispatch.policy import device_slug, load_map_file  # noqa: E402
from gearshift.dispatch.profiler import PRESETS, copy_bandwidth, shapes_from_config  # noqa: E402
from gearshift.kernels.library import to_tinygemm  # noqa: E402
from gearshift.kernels.reference import linear_reference  # noqa: E402
from gearshift.quant.modes import MODES  # noqa: E402


RULES = "rules"  # a side without a map: what a GPU nobody profiled runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", required=True, help="policy map JSON of side A, or 'rules' (no map: the un-profiled rules)")
    ap.add_argument("--b", required=True, help="the same for side B")
    ap.add_argument("--preset", default="llama3-8b",
                    help="model whose linear shapes one step runs (a gearshift tiny-model preset, e.g. qwen2.5-7b)")
    ap.add_argument("--mode", default="w4a16")
    ap.add_argument("--m", default="1,2,4,8,16")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="", help="suffix of the result file name (policy_ab_<device>_<tag>_<mode>.json)")
    ap.add_argument("--cublas", action="store_true",
                    help="also time cuBLAS bf16 on dense weights (same run, after the A/B rounds of each M: short "
                         "bursts, as the sides are; from 64 tokens a GPU kept busy settles lower, see power_cap.py)")
    ap.add_argument("--tinygemm", action="store_true", help="also time torch's int4 kernel on converted copies")
    ap.add_argument("--layout-a", default="blocks16", choices=("rows", "blocks16"), help="int4 layout of side A")
    ap.add_argument("--layout-b", default="blocks16", choices=("rows", "blocks16"), help="int4 layout of side B")
    ap.add_argument("--int4-prog", action="store_true",
                    help="int4 stores with row units (--quantize int4-prog), which w4a8_progressive can run")
    ap.add_argument("--set-a", default="", help="[MODULE.]NAME=VALUE[,...]: kernel switches while side A runs "
                    "(MODULE in gearshift.kernels, default w4a16_wgmma; e.g. w4a8_progressive.PROGRESSIVE_PDL=0), or "
                    "the engine's with MODULE switches (switches.tile_room=0: the inputs' whole-tile buffers unused)")
    ap.add_argument("--set-b", default="", help="the same for side B")
    ap.add_argument("--norm-codes", nargs="?", const="qkv,gate_up,down", default="", metavar="SHAPES",
                    help="W4A8 / W4A4: hand these linears (default qkv,gate_up,down) their activation codes made "
                    "before timing, as the engine's RMSNorms (qkv, gate_up) and SwiGLU (down, since stop 30) "
                    "write them (QuantLinear.codes_for); the rest run the quantizer. --norm-codes qkv,gate_up "
                    "is stop 29's count. Without it every linear quantizes its own input")
    ap.add_argument("--free-codes-b", default="", metavar="SHAPES",
                    help="what-if timing: side B hands these linears (e.g. qkv,o,gate_up,down) codes made before "
                    "timing at every M, as if every producer wrote them at no cost; side A keeps --norm-codes. "
                    "B - A is then what the remaining quantizer launches cost in the step")
    ap.add_argument("--shapes", default="", metavar="NAMES",
                    help="time only these linears of the step (e.g. qkv or gate_up,down): which shape a change moves")
    ap.add_argument("--x-tiles", action="store_true",
                    help="W4A16: hand each linear its input in the fragment kernel's layout where that side's kernel "
                    "reads it (1..16 tokens, the linears `switches.x_tiles_linears` names), as the engine's RMSNorms "
                    "(qkv, gate_up), SwiGLU epilogue (down) and decode attention (o) write them "
                    "(QuantLinear.x_tiles_for)")
    a = ap.parse_args()
    sets = {"a": kernel_switches(a.set_a), "b": kernel_switches(a.set_b)}
    defaults = {key: getattr(*key) for s in sets.values() for key in s}

    def side(name):  # the kernels' switches as that side wants them
        for (mod, attr), v in (defaults | sets[name]).items():
            setattr(mod, attr, v)
        return name

    if a.preset in PRESETS:
        shapes, layers = PRESETS[a.preset]["shapes"], PRESETS[a.preset]["layers"]
    else:  # another model family's shapes (the map may not hold them: the dispatcher's nearest-shape picks)
        from gearshift.model.tiny import preset_config

        cfg = preset_config(a.preset)
        shapes, layers = shapes_from_config(cfg), int(cfg["num_hidden_layers"])
    if a.shapes:
        wanted, known = set(a.shapes.split(",")), [name for name, _, _ in shapes]
        if wanted - set(known):
            raise SystemExit(f"--shapes: comma-separated names among {known}, not {a.shapes!r}")
        shapes = [s for s in shapes if s[0] in wanted]
    model = Model("int4p" if a.int4_prog else "int4", shapes, layers, 128, torch.bfloat16, a.layout_a)
    models = {"a": model, "b": model}
    if a.layout_b != a.layout_a:
        models["b"] = copy.copy(model)
        models["b"].stores = [[s.to_layout(a.layout_b) for s in layer] for layer in model.stores]
    act = MODES[a.mode].act
    maps = {"a": AdaptiveDispatcher(None if a.a == RULES else load_map_file(a.a), autoload=False),
            "b": AdaptiveDispatcher(None if a.b == RULES else load_map_file(a.b), autoload=False)}
    same_map = a.a == a.b if RULES in (a.a, a.b) else Path(a.a).resolve() == Path(a.b).resolve()
    dense = Model("dense", shapes, layers, 0, torch.bfloat16) if a.cublas else None
    tg = [[(to_tinygemm(s), s.group_size) for s in layer] for layer in model.stores] if a.tinygemm else None
    res = {}
    # W4A4: the Triton and torch activation quantizers may round a tie apart, and one int4 code step
    # is 1/7 of the scale: 3e-2 was exceeded once (down_proj, M=1, 3.1e-2)
    tol = 5e-2 if a.mode == "w4a4" else 5e-3
    for m in (int(v) for v in a.m.split(",")):
        xs = [engine_rows(m, k) for _, _, k in shapes]  # (in whole token tiles, as the engine's producers allocate)
        fed = {"a": a.norm_codes.split(",") if a.norm_codes else []}
        fed["b"] = a.free_codes_b.split(",") if a.free_codes_b else fed["a"]
        codes = {name: producer_codes(d, shapes, models[side(name)].stores[0], xs, act, m, fed[name],
                                      every_m=name == "b" and bool(a.free_codes_b))
                 for name, d in maps.items()}
        ins = {name: producer_tiles(d, shapes, models[side(name)].stores[0], xs, act, m) if a.x_tiles else xs
               for name, d in maps.items()}
        for i, store in enumerate(model.stores[0]):  # every choice of both maps against the reference
            ref = linear_reference(xs[i].float(), store, act)
            ys = {}
            for name, d in maps.items():
                ys[name] = d.linear(xs[i], models[side(name)].stores[0][i], act)
                err = ((ys[name].float() - ref).norm() / ref.norm()).item()
                if not err < tol:
                    raise SystemExit(f"map {name} M={m} shape {shapes[i][0]}: relative error {err:.2e} > {tol}")
                if ins[name][i] is not xs[i] and not torch.equal(d.linear(ins[name][i], models[side(name)].stores[0][i],
                                                                          act), ys[name]):
                    raise SystemExit(f"map {name} M={m} shape {shapes[i][0]}: the fragment layout gives other bits")
                if codes[name][i] is not None and not torch.equal(
                        d.linear(xs[i], models[side(name)].stores[0][i], act, codes=codes[name][i]), ys[name]):
                    raise SystemExit(f"map {name} M={m} shape {shapes[i][0]}: the producer's codes give other bits")
            exact = "always" not in (sets["a"] | sets["b"]).values()
            if same_map and exact and (a.layout_a, sets["a"]) != (a.layout_b, sets["b"]) \
                    and not torch.equal(ys["a"], ys["b"]):
                raise SystemExit(f"M={m} shape {shapes[i][0]}: the two sides' outputs differ")
        t = {"a": [], "b": []}
        for _ in range(a.rounds):
            for name, d in maps.items():
                t[side(name)].append(time_step(codes_step_fn(models[name], ins[name], d, act, codes[name])))
        res[m] = {name: statistics.median(v) for name, v in t.items()} | {"runs": t}
        line = f"M={m:2}: A {res[m]['a']:.3f} ms  B {res[m]['b']:.3f} ms  B/A {res[m]['b'] / res[m]['a']:.3f}"
        if dense is not None:
            res[m]["cublas_bf16"] = statistics.median(
                time_step(step_fn(dense, xs, lambda x, s: torch.nn.functional.linear(x, s.weight))) for _ in range(a.rounds))
            line += f"  cuBLAS bf16 {res[m]['cublas_bf16']:.3f} ms"
        if tg is not None:
            res[m]["tinygemm"] = statistics.median(time_step(tinygemm_step(tg, xs)) for _ in range(a.rounds))
            line += f"  tinygemm {res[m]['tinygemm']:.3f} ms"
        print(line, flush=True)
    dev = torch.cuda.get_device_name()
    write_json(a.out, f"policy_ab_{device_slug(dev)}{tag_suffix(a.tag)}_{a.mode}.json",
               {"device": dev, "preset": a.preset, "a": a.a, "b": a.b, "layout_a": a.layout_a, "layout_b": a.layout_b,
                "mode": a.mode, "int4_prog": a.int4_prog, "set_a": a.set_a, "set_b": a.set_b,
                "norm_codes": a.norm_codes, "free_codes_b": a.free_codes_b, "x_tiles": a.x_tiles, "shapes": a.shapes,
                "weight_bytes": model.nbytes(),
                "copy_bw_Bps": copy_bandwidth(), "ms": res})

if __name__ == "__main__":
    main()
