"""Host time per dispatched linear call, i.e. what eager decode (no CUDA graph) pays per kernel.

For each Llama-3-8B shape and M, with the shipped map: the GPU time of the call (CUDA-graph replay)
and the host time of its parts, each the median over bursts of back-to-back calls (no sync inside
a burst, so the GPU never stalls the host):
  linear   `AdaptiveDispatcher.linear` (what `QuantLinear.forward` runs; its choice memoized)
  unmemoized  the lookup, the support check and the run, as linear() did before the memo
  choose   the map lookup alone
  run      the strategy's run function (the kernel wrapper, launch included)
and for the Gluon strategies the activation's TMA descriptor alone.

Usage on the GPU: PYTHONPATH=. python benchmarks/host_overhead.py [--ms 1,16,32] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gearshift.dispatch.dispatcher import AdaptiveDispatcher  # noqa: E402
from gearshift.dispatch.policy import device_slug, load_map_file  # noqa: E402
from gearshift.dispatch.profiler import PRESETS, random_store, time_us  # noqa: E402
from gearshift.dispatch.strategies import STRATEGIES  # noqa: E402


def host_us(fns: dict, calls: int = 50, bursts: int = 15) -> dict:
    """Median host microseconds per call of each function; bursts of the functions alternate, so
    a noisy host (other tenants, clock changes) hits all of them alike."""
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    ts = {name: [] for name in fns}
    for _ in range(bursts):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            ts[name].append((time.perf_counter() - t0) / calls * 1e6)
            torch.cuda.synchronize()
    return {name: statistics.median(v) for name, v in ts.items()}


def launch_breakdown(rows) -> None:
    """Host us of one `mma_gemv` call (M = 1, qkv shape): the wrapper as a whole, Triton's JIT entry
    with the wrapper's arguments (binding, specialization, cache lookup, launch), and the compiled
    kernel's launcher alone (what is left without the JIT entry)."""
    from gearshift.kernels import int4_mma_gemv as mg
    from gearshift.kernels.int4_mma_gemv import mma_config, mma_gemv

    st = random_store("int4", 6144, 4096, 128, "cuda", torch.bfloat16, "blocks16")
    x = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    cfg = mma_config(6144, 4096, 1)
    jit = mg._mma_gemv_kernel
    seen = {}
    orig = jit.run

    def spy(*a, **kw):
        seen["a"], seen["kw"] = a, dict(kw)
        seen["kernel"] = orig(*a, **kw)
        return seen["kernel"]

    jit.run = spy
    try:
        mma_gemv(x, st, cfg)
    finally:
        jit.run = orig
    a, kw, kernel = seen["a"], seen["kw"], seen["kernel"]
    grid = kw["grid"]
    dev = torch.cuda.current_device()
    binder = jit.device_caches[dev][4]
    call_kw = {k: v for k, v in kw.items() if k not in ("grid", "warmup")}
    bound = list(binder(*a, **call_kw)[0].values())
    runner = kernel[grid]
    res = host_us({"wrapper": lambda: mma_gemv(x, st, cfg), "jit_run": lambda: orig(*a, **kw),
                   "binder": lambda: binder(*a, **call_kw), "launcher": lambda: runner(*bound)})
    rows.append({"launch_breakdown": res, "config": cfg.key()})
    print("launch breakdown, host us per call (M = 1, qkv):", json.dumps(res))


def ab_host_changes(rows) -> None:
    """Same-process A/B of this stop's host-side changes (bursts alternate, so a noisy host hits
    both alike): the fragment-kernel wrapper with Triton's `triton.cdiv` (a constexpr_function)
    against the plain-integer `cdiv`, and the few-token Gluon wrapper with its activation layout
    rebuilt per call (`act_layout` cache cleared) against the cached one."""
    import triton

    from gearshift.kernels import int4_mma_gemv as mg
    from gearshift.kernels import w4a16_wgmma as wg
    from gearshift.kernels._triton import cdiv
    from gearshift.kernels.config import TileConfig
    from gearshift.kernels.int4_mma_gemv import mma_config, mma_gemv
    from gearshift.kernels.w4a16_wgmma_small import w4a16_wgmma_small

    st = random_store("int4", 6144, 4096, 128, "cuda", torch.bfloat16, "blocks16")
    x1 = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)
    x16 = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    cfg = mma_config(6144, 4096, 1)
    small = TileConfig(16, 64, 256, 4, 4, 3, maxnreg=80)

    def with_cdiv(fn):
        def call():
            mg.cdiv = fn
            return mma_gemv(x1, st, cfg)
        return call

    def small_call(clear):
        def call():
            if clear:
                wg.act_layout.cache_clear()
            return w4a16_wgmma_small(x16, st, small)
        return call

    try:
        res = host_us({"mma_gemv, plain cdiv": with_cdiv(cdiv), "mma_gemv, triton.cdiv": with_cdiv(triton.cdiv),
                       "wgmma_small, cached layout": small_call(False),
                       "wgmma_small, layout per call": small_call(True)})
    finally:
        mg.cdiv = cdiv
    rows.append({"ab_host_changes": res})
    print("A/B of the host-side changes, us per call:", json.dumps(res))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default="1,16,32,256")
    ap.add_argument("--policy", default="gearshift/data/policy/NVIDIA_H100_80GB_HBM3.json")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--profile", action="store_true", help="also print cProfile's top functions per M (qkv shape)")
    ap.add_argument("--launch", action="store_true",
                    help="also split one fragment-kernel call (M = 1, qkv) into wrapper / Triton JIT / launcher")
    args = ap.parse_args()
    dt = torch.bfloat16
    disp = AdaptiveDispatcher(load_map_file(args.policy), autoload=False)
    shapes = PRESETS["llama3-8b"]["shapes"]
    rows = []
    for m in [int(v) for v in args.ms.split(",")]:
        for name, n, k in shapes:
            st = random_store("int4", n, k, 128, "cuda", dt, "blocks16")
            x = torch.randn(m, k, device="cuda", dtype=dt)
            c = disp.choose(st, None, m)
            strat = STRATEGIES[c.strategy]

            def unmemoized():  # what linear() did before it memoized the choice (stop 17)
                cc = disp.choose(st, None, m)
                ss = STRATEGIES[cc.strategy]
                ss.supports(st, None, cc.config)
                return ss.run(x, st, None, cc.config)

            fns = {"linear": lambda: disp.linear(x, st, None), "unmemoized": unmemoized,
                   "choose": lambda: disp.choose(st, None, m), "run": lambda: strat.run(x, st, None, c.config)}
            if c.strategy.startswith("w4a16_wgmma"):
                from gearshift.kernels.w4a16_wgmma_small import _act_descriptor

                fns["act_descriptor"] = lambda: _act_descriptor(x, c.config.bm, 128)
            r = {"m": m, "shape": name, "strategy": c.strategy, "config": c.config.key() if c.config else None,
                 "gpu_us": time_us([lambda: disp.linear(x, st, None)])}
            r.update({f"{part}_us": us for part, us in host_us(fns).items()})
            rows.append(r)
            if args.profile and name == "qkv":
                import cProfile
                import pstats

                prof = cProfile.Profile()
                prof.enable()
                for _ in range(300):
                    disp.linear(x, st, None)
                prof.disable()
                torch.cuda.synchronize()
                print(f"--- cProfile, M={m} {name} {c.strategy}, 300 calls")
                pstats.Stats(prof).sort_stats("tottime").print_stats(22)
            print(json.dumps(r), flush=True)
    if args.launch:
        launch_breakdown(rows)
        ab_host_changes(rows)
    dev = torch.cuda.get_device_name()
    path = Path(args.out) / f"host_overhead_{device_slug(dev)}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"device": dev, "torch": torch.__version__, "rows": rows}, indent=1))
    print(f"\nwrote {path}\n\n| M | shape | strategy | GPU us | linear us | un-memoized us | choose us | run us | "
          "x descriptor us |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "m" not in r:
            continue
        print(f"| {r['m']} | {r['shape']} | {r['strategy']} | {r['gpu_us']:.1f} | {r['linear_us']:.1f} | "
              f"{r['unmemoized_us']:.1f} | {r['choose_us']:.1f} | {r['run_us']:.1f} | "
              f"{r.get('act_descriptor_us', float('nan')):.1f} |")


if __name__ == "__main__":
    main()
