"""GPU benchmark of every GEMM strategy and the ADAngel dispatcher on Llama-3-8B linear shapes.

Stages (all in one process so one device call does everything):
  check    every strategy vs the torch reference on the GPU (bf16 and fp16), rel. error table
  profile  the offline profiler over M buckets -> policy map JSON
  bench    one 32-layer decode step (4 shapes x 32 layers, distinct weights: no L2 reuse),
           CUDA-graph replay, for each M: every static strategy, the library kernels, the
           dispatcher; ratios to the int4 floor (weight bytes / copy bandwidth measured here)
  gearbx   per-row int4 (G=K) and int8 stores at M=1,16 (GEARBX low / mid gear)
Usage: python benchmarks/kernel_bench.py --out DIR [--stages check,profile,bench,gearbx] [--m 1,16,...]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gearshift.dispatch.dispatcher import AdaptiveDispatcher  # noqa: E402
from gearshift.dispatch.policy import M_BUCKETS, PolicyMap, device_slug, load_map_file  # noqa: E402
from gearshift.dispatch.profiler import PRESETS, ablations, copy_bandwidth, profile, random_store, time_us  # noqa: E402
from gearshift.dispatch.strategies import strategies_for  # noqa: E402
from gearshift.jsonfile import write_text  # noqa: E402
from gearshift.kernels.act_quant import quantize_for  # noqa: E402
from gearshift.kernels.library import scaled_mm_fp8_linear, tinygemm_linear, to_fp8_rowwise, to_tinygemm  # noqa
from gearshift.kernels.reference import linear_reference  # noqa: E402
from gearshift.kernels.silu_mul import emits_codes  # noqa: E402
from gearshift.kernels.switches import x_tiles_on  # noqa: E402
from gearshift.kernels.tile_room import empty_rows  # noqa: E402
from gearshift.kernels.x_tiles import XTiles, to_x_tiles  # noqa: E402
from gearshift.quant.modes import MODES  # noqa: E402

PEAK = {"bf16_tflops": 989.0, "int8_tops": 1979.0, "fp8_tflops": 1979.0}  # H100 SXM dense datasheet (leads)


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def stage_check(log, dtypes=(torch.bfloat16,), layouts=("rows", "blocks16")) -> list[dict]:
    rows = []
    dev = torch.device("cuda")
    for dtype, layout in itertools.product(dtypes, layouts):
        for n, k, g in ((384, 1024, 128), (256, 1024, 1024), (256, 4096, 128)):
            for mode_name in ("w4a16", "w4a8", "w4a8fp8", "w4a4", "w8a16", "w8a8"):
                fmt = "int8" if mode_name.startswith("w8") else "int4"
                if fmt == "int8" and layout != "rows":
                    continue
                st = random_store(fmt, n, k, g, dev, dtype, layout)
                act = MODES[mode_name].act
                for m in (1, 5, 33, 200):
                    x = torch.randn(m, k, device=dev, dtype=dtype)
                    ref = linear_reference(x.double() if False else x.float(), st, act).to(torch.float32)
                    for strat in strategies_for(mode_name):
                        cfgs = strat.configs(m)[:2]
                        # the same tiles without split-K too: one program over all K tiles (32 at
                        # K = 4096) is where fp32 accumulation errors grow (stop 13's W4A8 bug)
                        cfgs += [replace(c, split_k=1) for c in cfgs if c is not None and c.split_k > 1]
                        for cfg in cfgs:
                            if not strat.supports(st, act, cfg):
                                continue
                            try:
                                y = strat.run(x, st, act, cfg)
                                torch.cuda.synchronize()
                                r = rel(y, ref)
                                bad = bool(torch.isnan(y).any())
                            except Exception as e:
                                r, bad = float("nan"), True
                                log(f"FAIL {mode_name} {strat.name} {cfg} {type(e).__name__}: {str(e)[-1500:]}")
                            rows.append({"dtype": str(dtype)[6:], "layout": layout, "mode": mode_name,
                                         "strategy": strat.name,
                                         "n": n, "k": k, "g": g, "m": m, "cfg": None if cfg is None else cfg.key(),
                                         "rel": r, "nan": bad})
    worst: dict = {}
    for r in rows:
        kk = (r["dtype"], r["mode"], r["strategy"])
        worst[kk] = max(worst.get(kk, 0.0), r["rel"] if r["rel"] == r["rel"] else 1e9)
    log("check: worst rel err per (dtype, mode, strategy)")
    for kk, v in sorted(worst.items()):
        log(f"  {kk[0]:9s} {kk[1]:8s} {kk[2]:16s} {v:.2e}")
    return rows


class Model:
    """32 layers x 4 shapes of one format, distinct random weights (the real decode working set)."""

    def __init__(self, fmt, shapes, layers, group, dtype, layout="rows"):
        self.stores = [[random_store(fmt, n, k, group, "cuda", dtype, layout) for _, n, k in shapes]
                       for _ in range(layers)]
        self.shapes = shapes

    def nbytes(self):
        return sum(s.nbytes() for layer in self.stores for s in layer)


def tag_suffix(tag: str) -> str:
    """A result file name's tag part: '' or '_TAG' (a leading '_' is not doubled)."""
    return tag if not tag or tag.startswith("_") else "_" + tag


#: results larger than this are written gzipped (`NAME.json.gz`); every reader takes both (`gearshift.jsonfile`)
GZIP_ABOVE = 256 * 1024


def write_json(out_dir, name: str, res) -> Path:
    """Write a benchmark's result JSON as out_dir/name (the folder made if missing), or as name + '.gz'
    where it is over GZIP_ABOVE bytes: the repository's working tree travels to the GPU under a size cap.
    Returns the path written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(res, indent=1)
    if len(text) > GZIP_ABOVE and not name.endswith(".gz"):
        name += ".gz"
    return write_text(out / name, text)


class EngineSwitches:
    """The engine's switches (`gearshift.kernels.switches`, e.g. tile_room) as attributes, so that `kernel_switches`
    sets them as it sets a kernel module's: `switches.tile_room=0`."""

    def __getattr__(self, name):
        from gearshift.kernels import switches

        try:
            return dict(switches.state())[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        from gearshift.kernels import switches

        switches.set_switches(**{name: value})


ENGINE_SWITCHES = EngineSwitches()


def kernel_switches(spec: str, default_module: str = "w4a16_wgmma") -> dict:
    """`[MODULE.]NAME=VALUE[,...]` -> {(module, attr): value} for timing experiments that set a
    kernel module's switch (e.g. int4_mma_gemv.TRIGGER=2), or with MODULE `switches` one of the engine's
    (`switches.tile_room=0`); an unknown name is an error, not a no-op."""
    import importlib

    out = {}
    for item in filter(None, spec.split(",")):
        name, _, value = item.partition("=")
        mod_name, _, attr = name.rpartition(".")
        mod = ENGINE_SWITCHES if mod_name == "switches" else \
            importlib.import_module(f"gearshift.kernels.{mod_name or default_module}")
        if not hasattr(mod, attr):
            raise SystemExit(f"{getattr(mod, '__name__', 'switches')} has no switch {attr!r}")
        out[(mod, attr)] = type(getattr(mod, attr))(int(value)) if value.lstrip("-").isdigit() else value
    return out


def engine_rows(m: int, k: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Random activations [m, k] allocated as the engine's producers allocate a linear's input: at the start of a
    buffer of whole token tiles (`tile_room.empty_rows`; its further rows are left as they are)."""
    x = empty_rows(m, k, dtype, "cuda")
    x.copy_(torch.randn(m, k, device="cuda", dtype=dtype))
    return x


def step_fn(model, xs, fn):
    def run():
        for layer in model.stores:
            for i, st in enumerate(layer):
                fn(xs[i], st)
    return run


#: the linears whose input comes from a kernel that can write codes in the engine: qkv and gate_up
#: from an RMSNorm, down from SwiGLU (since stop 30, from 64 tokens). Where their kernel takes quantized activations,
#: that producer writes the codes (`QuantLinear.codes_for`) and no quantizer runs; o still quantizes
PRODUCER_FED = ("qkv", "gate_up", "down")


def producer_codes(d, shapes, stores, xs, act, m, fed=PRODUCER_FED, every_m: bool = False) -> list:
    """Per shape: the codes the engine's producer kernel (RMSNorm, SwiGLU) would hand that linear
    under dispatcher d, for the shapes in `fed` (made here by the quantizer, whose helpers the
    producers use, so the same bits), else None. every_m: down gets them at every M too (what-if
    timing: a SwiGLU that emits codes at few tokens as cheaply as without)."""
    out = []
    for (name, _, k), store, x in zip(shapes, stores, xs):
        if name == "down" and not every_m and not emits_codes(m, k):  # where the engine's SwiGLU emits them
            out.append(None)
            continue
        spec = d.codes_for(store, act, m, x.dtype) if name in fed else None
        if spec is None:
            out.append(None)
            continue
        out.append(quantize_for(x, act, spec))
    return out


def producer_tiles(d, shapes, stores, xs, act, m) -> list:
    """Per shape: x as `XTiles` (made here, the bits the producers store) where the engine's producer would
    write it so for dispatcher d's kernel at m tokens, else x itself. As `QuantLinear.x_tiles_for` asks: the
    switches (`x_tiles_on`, every linear of `X_TILE_LINEARS` unless an A/B leaves some out) and then d. The
    producers are the RMSNorms (qkv, gate_up), gate_up's SwiGLU epilogue (down) and decode attention (o)."""
    return [XTiles(to_x_tiles(x), tuple(x.shape)) if x_tiles_on(m, name) and d.x_tiles_for(store, act, m, x.dtype)
            else x for (name, _, _), store, x in zip(shapes, stores, xs)]


def codes_step_fn(model, xs, d, act, codes):
    """step_fn through d, each linear given its entry of `codes` (producer_codes) where not None."""
    by_x = {id(x): c for x, c in zip(xs, codes)}
    return step_fn(model, xs, lambda x, s: d.linear(x, s, act, codes=by_x.get(id(x))))


def tinygemm_step(tg, xs):
    """One step of torch's int4 kernel over tg[layer][shape] = ((packed, scales_and_zeros), group)."""
    def run():
        for layer in tg:
            for i, ((packed, sz), g) in enumerate(layer):
                tinygemm_linear(xs[i], packed, sz, g)
    return run


def time_step(run, reps=5) -> float:
    """ms per call of run() (one decode step), CUDA graph replay."""
    return time_us([run], rounds=1, reps=reps) / 1000.0


def static_serves(sd: AdaptiveDispatcher, strat, store, act, m: int) -> bool:
    """Whether the static dispatcher `sd` runs `strat` itself on `store` at m tokens (not the reference)."""
    c = sd.choose(store, act, m)
    return c is not None and c.strategy == strat.name and strat.supports(store, act, c.config)


def stage_bench(pm, m_list, bw, log, dtype=torch.bfloat16, layers=32, layout="blocks16", prog=False) -> dict:
    shapes = PRESETS["llama3-8b"]["shapes"]
    flops = {m: 2 * m * sum(n * k for _, n, k in shapes) * layers for m in m_list}
    res: dict = {"m": m_list, "ms": {}, "notes": [], "int4_layout": layout, "int4_row_units": prog}
    int4 = Model("int4p" if prog else "int4", shapes, layers, 128, dtype, layout)
    floor_ms = int4.nbytes() / bw * 1000
    res["int4_bytes"] = int4.nbytes()
    res["floor_ms"] = floor_ms
    log(f"int4 model bytes {int4.nbytes()/1e9:.3f} GB, copy bw {bw/1e12:.3f} TB/s, floor {floor_ms:.3f} ms")

    def record(name, m, ms):
        res["ms"].setdefault(name, {})[str(m)] = None if ms is None else round(ms, 4)

    disp = AdaptiveDispatcher(pm, autoload=False)
    for m in m_list:
        xs = [torch.randn(m, k, device="cuda", dtype=dtype) for _, _, k in shapes]
        for mode in ("w4a16", "w4a8", "w4a8fp8"):
            act = MODES[mode].act
            try:
                record(f"{mode}:dispatch", m, time_step(step_fn(int4, xs, lambda x, s: disp.linear(x, s, act))))
                codes = producer_codes(disp, shapes, int4.stores[0], xs, act, m) if act is not None else []
                if any(c is not None for c in codes):  # as the engine runs it: codes from the norms and SwiGLU
                    record(f"{mode}:norm_codes_dispatch", m, time_step(codes_step_fn(int4, xs, disp, act, codes)))
                xt = producer_tiles(disp, shapes, int4.stores[0], xs, act, m)
                if any(isinstance(t, XTiles) for t in xt):  # as the engine runs it: the fragment layout from the
                    # norms, SwiGLU's epilogue and decode attention (W4A16, 1..16 tokens)
                    record(f"{mode}:x_tiles_dispatch", m,
                           time_step(step_fn(int4, xt, lambda x, s: disp.linear(x, s, act))))
            except Exception as e:
                log(f"dispatch {mode} M={m}: {e!r}"[:300])
            for strat in strategies_for(mode):
                if strat.name.startswith("w4a8_bit") and m > 1024 or (strat.name == "w4a8_split" and m > 2048):
                    continue
                if not strat.configs(m):  # e.g. the GEMV kernel above M=4
                    continue
                sd = AdaptiveDispatcher(pm, autoload=False, static=strat.name)
                # a static strategy that cannot run a shape's store (e.g. a row-layout kernel on blocks16
                # weights) would run the torch reference there: leave it out rather than time that
                if not all(static_serves(sd, strat, st, act, m) for st in int4.stores[0]):
                    record(f"{mode}:{strat.name}", m, None)
                    continue
                try:
                    record(f"{mode}:{strat.name}", m, time_step(step_fn(int4, xs, lambda x, s: sd.linear(x, s, act))))
                except Exception as e:
                    log(f"static {mode} {strat.name} M={m}: {e!r}"[:300])
        log(f"M={m}: " + ", ".join(f"{k}={v.get(str(m))}" for k, v in res["ms"].items()))
    # library kernels on their own (second-copy) weights
    del int4
    torch.cuda.empty_cache()
    dense = Model("dense", shapes, layers, 0, dtype)
    for m in m_list:
        xs = [torch.randn(m, k, device="cuda", dtype=dtype) for _, _, k in shapes]
        record("lib:cublas_bf16", m, time_step(step_fn(dense, xs, lambda x, s: torch.nn.functional.linear(x, s.weight))))
    fp8w = [[to_fp8_rowwise(s.weight) for s in layer] for layer in dense.stores]
    del dense
    torch.cuda.empty_cache()
    for m in m_list:
        xs = [torch.randn(m, k, device="cuda", dtype=dtype) for _, _, k in shapes]

        def run_fp8():
            for layer in fp8w:
                for i, (q, s) in enumerate(layer):
                    scaled_mm_fp8_linear(xs[i], q, s)
        try:
            record("lib:scaled_mm_fp8", m, time_step(run_fp8))
        except Exception as e:
            log(f"fp8 M={m}: {e!r}"[:300])
    del fp8w
    torch.cuda.empty_cache()
    int4 = Model("int4", shapes, layers, 128, dtype)
    try:
        tg = [[(to_tinygemm(s), s.group_size) for s in layer] for layer in int4.stores]
        for m in [mm for mm in m_list if mm <= 256]:
            xs = [torch.randn(m, k, device="cuda", dtype=dtype) for _, _, k in shapes]
            record("lib:tinygemm", m, time_step(tinygemm_step(tg, xs)))
        # correctness of the conversion
        st = int4.stores[0][1]
        x = torch.randn(4, st.in_features, device="cuda", dtype=dtype)
        res["tinygemm_rel_err"] = rel(tinygemm_linear(x, *tg[0][1][0], 128), linear_reference(x.float(), st, None))
        del tg
    except Exception as e:
        log(f"tinygemm: {e!r}"[:300])
    del int4
    torch.cuda.empty_cache()
    # derived ratios
    lib = [k for k in res["ms"] if k.startswith("lib:")]
    res["derived"] = {}
    for name, per in res["ms"].items():
        for m_s, ms in per.items():
            if ms is None:
                continue
            m = int(m_s)
            best_lib = min((res["ms"][l].get(m_s) for l in lib if res["ms"][l].get(m_s) is not None), default=None)
            res["derived"].setdefault(name, {})[m_s] = {
                "x_floor": round(ms / floor_ms, 3),
                "GBps_ratio": round(res["int4_bytes"] / (ms / 1000) / bw, 3),
                "tflops": round(flops[m] / (ms / 1000) / 1e12, 2),
                "tflops_ratio_bf16": round(flops[m] / (ms / 1000) / 1e12 / PEAK["bf16_tflops"], 4),
                "vs_best_lib": None if best_lib is None else round(ms / best_lib, 3),
            }
    return res


def stage_gearbx(log, dtype=torch.float16) -> dict:
    shapes = PRESETS["llama3-8b"]["shapes"]
    out = {}
    for fmt, mode in (("int4", "w4a16"), ("int8", "w8a16")):
        model = Model(fmt, shapes, 32, -1 if fmt == "int4" else 0, dtype)  # -1 -> G = K (per row)
        for m in (1, 16):
            xs = [torch.randn(m, k, device="cuda", dtype=dtype) for _, _, k in shapes]
            sub = PolicyMap(torch.cuda.get_device_name())
            pm = profile(shapes, [mode], [m], group=-1 if fmt == "int4" else 0, policy=sub, dtype=dtype,
                         int4_layout="rows")  # the gear stores GEARBX builds at run time are rows
            d = AdaptiveDispatcher(pm, autoload=False)
            ms = time_step(step_fn(model, xs, lambda x, s: d.linear(x, s, None)))
            out[f"{fmt}_perrow:M{m}"] = round(ms, 4)
            log(f"gearbx {fmt} per-row M={m}: {ms:.3f} ms per 32-layer step")
        del model
        torch.cuda.empty_cache()
    return out


# bytes each row reads per weight (int4 rows: their own int4 + scale bytes), and the MMA peak it
# is held to: the dispatched W4A8 modes run int8/fp8 tensor cores, everything else bf16
LIB_BYTES_PER_WEIGHT = {"lib:cublas_bf16": 2.0, "lib:scaled_mm_fp8": 1.0}
PEAK_OF = {"w4a8:dispatch": "int8_tops", "w4a8:norm_codes_dispatch": "int8_tops", "w4a8fp8:dispatch": "fp8_tflops",
           "lib:scaled_mm_fp8": "fp8_tflops"}


def throughput_md(bench: dict, m_list, bw) -> list[str]:
    """Achieved read bandwidth and tensor throughput of the dispatched modes and the libraries, as
    ratios to the copy bandwidth measured in the same run and to the datasheet MMA peaks; plus
    cuBLAS's own best TFLOP/s in the run, the measured compute ceiling."""
    shapes = PRESETS["llama3-8b"]["shapes"]
    weights = 32 * sum(n * k for _, n, k in shapes)
    ms = bench["ms"]
    rows = [r for r in sorted(ms) if r.endswith("dispatch") or r.startswith("lib:")]
    cublas = max((2 * m * weights / (t / 1000) / 1e12 for m_s, t in ms.get("lib:cublas_bf16", {}).items()
                  if t is not None for m in [int(m_s)]), default=None)
    lines = ["", "Achieved bandwidth, GB/s of the bytes each strategy reads (dispatch and tinygemm: int4 weights "
             f"+ scales; cuBLAS: bf16 weights; scaled_mm: fp8 weights), and its ratio to the copy bandwidth "
             f"measured in the same run ({bw / 1e9:.0f} GB/s). `lib:scaled_mm_fp8` includes quantizing the "
             "activations to fp8 per token in eager torch, as an engine calling it must; PERF.md's fp8 step (2.67 ms "
             "at M=1) is less than half of this row and most likely leaves that quantization out:", "",
             "| strategy | " + " | ".join(f"M={m}" for m in m_list) + " |", "|---|" + "---|" * len(m_list)]
    for name in rows:
        per_w = LIB_BYTES_PER_WEIGHT.get(name)
        nbytes = bench["int4_bytes"] if per_w is None else per_w * weights
        cells = []
        for m in m_list:
            t = ms[name].get(str(m))
            cells.append("-" if t is None else f"{nbytes / (t / 1000) / 1e9:.0f} ({nbytes / (t / 1000) / bw:.2f})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Tensor throughput, TFLOP/s (2 M N K per linear), and its ratio to the datasheet dense peak of "
              f"the MMA the strategy runs (bf16 {PEAK['bf16_tflops']:.0f}, int8/fp8 {PEAK['int8_tops']:.0f}); "
              + (f"cuBLAS bf16 reached {cublas:.0f} TFLOP/s at best in this run ({cublas / PEAK['bf16_tflops']:.2f} "
                 "of its peak), the measured ceiling." if cublas else ""), "",
              "| strategy | " + " | ".join(f"M={m}" for m in m_list) + " |", "|---|" + "---|" * len(m_list)]
    for name in rows:
        peak = PEAK[PEAK_OF.get(name, "bf16_tflops")]
        cells = []
        for m in m_list:
            t = ms[name].get(str(m))
            tf = None if t is None else 2 * m * weights / (t / 1000) / 1e12
            cells.append("-" if tf is None else f"{tf:.1f} ({tf / peak:.3f})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def write_md(path, res, device, bw):
    m_list = res["bench"]["m"]
    ms = res["bench"]["ms"]
    floor = res["bench"]["floor_ms"]
    lines = [f"# Kernel benchmark: {device}", "",
             f"One decode step of Llama-3-8B linears (4 shapes x 32 layers, distinct weights), bf16 activations, "
             f"CUDA-graph replay, ms. Copy bandwidth measured in the same run: {bw/1e12:.2f} TB/s; int4 floor "
             f"(int4 weight+scale bytes / bandwidth) = {floor:.3f} ms.", "",
             "| strategy | " + " | ".join(f"M={m}" for m in m_list) + " |",
             "|---|" + "---|" * len(m_list)]
    for name in sorted(ms):
        lines.append(f"| {name} | " + " | ".join("-" if ms[name].get(str(m)) is None else f"{ms[name][str(m)]:.3f}"
                                                  for m in m_list) + " |")
    lines += ["", "Ratio to the int4 floor:", "", "| strategy | " + " | ".join(f"M={m}" for m in m_list) + " |",
              "|---|" + "---|" * len(m_list)]
    for name in sorted(ms):
        if name.endswith("dispatch") or name.startswith("lib:"):
            lines.append(f"| {name} | " + " | ".join(
                "-" if ms[name].get(str(m)) is None else f"{ms[name][str(m)] / floor:.2f}" for m in m_list) + " |")
    lines += throughput_md(res["bench"], m_list, bw)
    if res.get("provenance"):  # results merged from several runs say which part came from where
        lines += ["", f"Provenance: {res['provenance']}."]
    if "gearbx" in res:
        lines += ["", "GEARBX gears (fp16 activations, per-row stores, dispatcher), ms per 32-layer step: "
                  + ", ".join(f"{k}={v}" for k, v in res["gearbx"].items())]
    if "ablation" in res:
        lines += ["", "Ablations from the profile (sum over one step, ms):", ""]
        for mode, per_m in res["ablation"].items():
            cols = sorted({c for v in per_m.values() for c in v})
            lines += [f"{mode}:", "", "| M | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
            for m, v in per_m.items():
                lines.append(f"| {m} | " + " | ".join("-" if v.get(c) is None else f"{v[c]/1000:.3f}" for c in cols)
                             + " |")
            lines.append("")
    Path(path).write_text("\n".join(lines) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--stages", default="check,profile,bench,gearbx")
    ap.add_argument("--m", default=",".join(map(str, M_BUCKETS)))
    ap.add_argument("--modes", default="w4a16,w4a8,w4a8fp8,w4a4")
    ap.add_argument("--policy", default=None, help="reuse a policy JSON instead of profiling")
    ap.add_argument("--int4-prog", action="store_true",
                    help="int4 stores with row units (--quantize int4-prog) in profile and bench: adds the int8 "
                         "tensor-core W4A8/W4A4 kernel w4a8_progressive")
    ap.add_argument("--int4-layout", default="blocks16", choices=("rows", "blocks16"),
                    help="int4 byte order for profile and bench (the engine's GPU default is blocks16)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    logf = open(out / "kernels_log.txt", "a")

    def log(s):
        print(s, flush=True)
        logf.write(s + "\n")
        logf.flush()

    stages = a.stages.split(",")
    m_list = [int(v) for v in a.m.split(",")]
    device = torch.cuda.get_device_name()
    res = {"device": device, "torch": torch.__version__, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        import triton
        res["triton"] = triton.__version__
    except Exception:
        pass
    bw = copy_bandwidth()
    res["copy_bw_Bps"] = bw
    log(f"{device}: copy bandwidth {bw/1e12:.3f} TB/s")
    t0 = time.time()
    if "check" in stages:
        rows = stage_check(log)
        res["check_worst"] = {}
        for r in rows:
            kk = f"{r['dtype']}/{r['mode']}/{r['strategy']}"
            res["check_worst"][kk] = max(res["check_worst"].get(kk, 0.0), r["rel"] if r["rel"] == r["rel"] else 1e9)
        log(f"check done {time.time()-t0:.0f}s")
    pm = load_map_file(a.policy) if a.policy else None
    if "profile" in stages:
        shapes = PRESETS["llama3-8b"]["shapes"]
        pm = profile(shapes, a.modes.split(","), m_list, group=128, log=log, int4_layout=a.int4_layout,
                     int4_progressive=a.int4_prog)
        pm.save(out / f"policy_{device_slug(device)}.json.gz")  # every candidate's timing: megabytes
        res["ablation"] = {mode: ablations(pm, shapes, 32, mode) for mode in a.modes.split(",")}
        log(f"profile done {time.time()-t0:.0f}s")
        for mode, per in res["ablation"].items():
            for m, row in per.items():
                best_static = min((v for c, v in row.items() if c.startswith("only:") and v is not None), default=None)
                log(f"abl {mode} M={m}: map={row['map']} best_static={best_static} rule={row.get('adangel_r')}")
    if "bench" in stages:
        res["bench"] = stage_bench(pm, m_list, bw, log, layout=a.int4_layout, prog=a.int4_prog)
        log(f"bench done {time.time()-t0:.0f}s")
    if "gearbx" in stages:
        res["gearbx"] = stage_gearbx(log)
    write_json(out, f"kernels_{device_slug(device)}.json", res)
    if "bench" in res:
        write_md(out / "kernels.md", res, device, bw)
        d = res["bench"]["derived"]
        log("summary (ms | x floor | vs best lib):")
        for name in sorted(d):
            if name.endswith("dispatch") or name.startswith("lib:"):
                log(f"{name:22s} " + " ".join(f"{m}:{v['x_floor']}/{v['vs_best_lib']}" for m, v in d[name].items()))


if __name__ == "__main__":
    main()
