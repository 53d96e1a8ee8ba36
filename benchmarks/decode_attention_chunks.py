"""Decode attention's key chunking and launch point against SDPA on the engine's graphed decode step
(GPU, timing only; stop 46).

Variants: `sdpa` (the kernel only from 3 sequences, stop 35's setting), `k256` (the shipped chunking:
256 keys per program, at most 8 chunks), `k128` / `k64` (smaller chunks: more programs at one or two
sequences; they change the bits, for every batch, since a token's chunking is a constant), `k64s32`
(64-key chunks up to 32 of them); each with a suffix `off` / `loop` for the launch point
(`switches.decode_attention_launch`), else "start". Each variant is patched into the model's call of
`decode_attention_triton` and captured once per (batch, context); rounds alternate.

    PYTHONPATH=. python benchmarks/decode_attention_chunks.py --mode w4a16 --cases 1x512,2x512,4x512,16x512 \\
        --variants k256,sdpa,k256off,k64off,k128off,k64 --rounds 3 --out benchmarks/results

Stop 46 measured (`results/attn_chunk_ab_stop46_w4a16.json`, written by this script's first form, which
set the launch point through a module constant that the switch has since replaced): 64- or 128-key chunks
were 0.7% faster than 256 at one sequence without PDL and 2.3-2.7% slower at 16 sequences, so the chunking
stays; the launch point is what `decode_attention_launch_rule` ships.
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from kernel_bench import tag_suffix, write_json  # noqa: E402
from trigger_matrix import alternate  # noqa: E402

CHUNKS = {"k256": {}, "k128": dict(chunk=128, block=64), "k64": dict(chunk=64, block=64),
          "k64s32": dict(chunk=64, block=64, max_splits=32)}


def variant(name: str) -> tuple[int, dict, str]:
    """'k64off' -> (min batch, chunk kwargs, launch point)."""
    if name == "sdpa":
        return 3, {}, "rule"
    for launch in ("off", "loop", ""):
        base = name[: len(name) - len(launch)] if launch else name
        if name.endswith(launch) and base in CHUNKS:
            return 1, CHUNKS[base], launch or "start"
    raise SystemExit(f"unknown variant {name!r}: sdpa, or one of {sorted(CHUNKS)} with an optional off / loop suffix")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", default="w4a16")
    ap.add_argument("--cases", default="1x512,2x512,4x512", help="BATCHxCONTEXT, comma-separated")
    ap.add_argument("--variants", default="sdpa,k256off,k64off,k256")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", default="benchmarks/results")
    a = ap.parse_args()
    names = a.variants.split(",")
    plans = {n: variant(n) for n in names}
    if not torch.cuda.is_available():
        raise SystemExit("decode_attention_chunks.py times CUDA graphs: it needs a GPU")

    from e2e import model_for
    import gearshift.kernels.decode_attention as da
    from gearshift.dispatch import get_dispatcher
    from gearshift.dispatch.policy import device_slug
    from gearshift.kernels import switches
    from gearshift.model import transformer
    from gearshift.model.step_timer import DecodeStepTimer

    model = model_for({}, "llama3-8b", a.mode, False)
    d = get_dispatcher()
    before = dict(switches.state())
    res = {"device": torch.cuda.get_device_name(), "mode": a.mode, "cases": {}}
    try:
        for case in a.cases.split(","):
            b, ctx = (int(v) for v in case.split("x"))
            timers = {n: DecodeStepTimer(model, a.mode, b, ctx) for n in names}  # one runner each
            def run(n, timers=timers):
                min_batch, kw, launch = plans[n]
                switches.set_switches(decode_attention_min_batch=min_batch, decode_attention_launch=launch)
                transformer.decode_attention_triton = functools.partial(da.decode_attention_triton, **kw)
                return timers[n].ms(d)

            times = alternate(names, a.rounds, run)
            base = times[names[0]]
            res["cases"][case] = {n: {"ms": statistics.median(t), "ratio": statistics.median(x / y for x, y in zip(t, base)),
                                      "rounds": t} for n, t in times.items()}
            print(f"{case}: " + "  ".join(f"{n} {v['ms']:.3f} ({v['ratio']:.3f})" for n, v in res["cases"][case].items()),
                  flush=True)
            del timers
            torch.cuda.empty_cache()
    finally:
        transformer.decode_attention_triton = da.decode_attention_triton
        switches.set_switches(**before)
    print(write_json(a.out, f"decode_attention_chunks_{device_slug(res['device'])}_{a.mode}{tag_suffix(a.tag)}.json", res))


if __name__ == "__main__":
    main()
