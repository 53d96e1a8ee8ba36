"""How much the small kernels between the linears could give back if fused away (GPU): an upper bound.

The graphed decode step of the random-weight 8B model (`engine_step.EngineStep`, PDL on, the shipped map)
is captured once as the engine runs it and once with some of the kernels between the linears *left out*:
their consumers take stale buffers of the right shape instead. The outputs of the stripped steps are wrong;
only their time means something. A fusion that moved such a kernel's work into a neighbouring GEMM could
at best save the difference, and in practice less, since the work itself (loads, reductions, stores) moves
into the GEMM's tail or prologue.

Variants (each one left out in all 32 layers):
  no_norm    the residual-add RMSNorms before qkv and gate_up (the next linear takes the unnormed rows;
             W4A8 / W4A4: static codes of the right shape)
  no_rope    RoPE + the KV-cache write (attention takes q straight from the qkv output)
  no_swiglu  W4A8 / W4A4: SwiGLU's codes kernel (down takes static codes; W4A16 runs SwiGLU in gate_up's
             epilogue, so it has nothing to leave out)
  no_oquant  W4A8 / W4A4: o's activation quantizer (o takes static codes)
  none       all of the above

    PYTHONPATH=. python benchmarks/fusion_bound.py --modes w4a16,w4a8 --batches 1,4,16 --tag stop50
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

VARIANTS = ("no_norm", "no_rope", "no_swiglu", "no_oquant")


class _StaticCodes:
    """Stale codes buffers of each (rows, width, dtype): what a left-out producer's consumer reads."""

    def __init__(self):
        self.buffers = {}

    def get(self, rows: int, width: int, spec, device):
        from gearshift.kernels.act_quant import ActCodes

        key = (rows, width, spec.dtype, spec.qmax, spec.fragment_order)
        if key not in self.buffers:
            q = torch.zeros((rows, width), device=device, dtype=spec.dtype)
            self.buffers[key] = ActCodes(q, torch.ones((rows,), device=device, dtype=torch.float32), spec.qmax,
                                         spec.fragment_order)
        return self.buffers[key]


_STATIC = _StaticCodes()  # kept for the process: the captured graphs read these buffers at every replay


@contextlib.contextmanager
def left_out(names: set[str], o_proj=None, mode: str = "w4a16"):
    """Patch the model's forward so the named kernels are not launched (see the module docstring);
    o_proj / mode: the projection whose codes `no_oquant` hands in, and the mode they are for."""
    from gearshift.model import kv_cache, transformer
    from gearshift.model.quant_linear import CodesOnly

    static = _STATIC
    saved = (transformer.DecoderLayer._norm, kv_cache.KVCache.write_rotated, transformer.silu_mul_codes_triton,
             transformer.decode_attention_triton)
    orig_norm = saved[0]

    def norm(norm_mod, x, delta, linear, mode):
        if "no_norm" not in names or delta is None:  # (the first layer's norm has no residual add)
            return orig_norm(norm_mod, x, delta, linear, mode)
        spec = linear.codes_for(mode, x.shape[0] * x.shape[1], x.dtype)
        if spec is None:
            return x, delta, None
        codes = static.get(x.shape[0] * x.shape[1], x.shape[-1], spec, x.device)
        return x, CodesOnly(codes, tuple(x.shape), x.dtype), codes

    def write_rotated(self, layer, qkv, n_q, cos, sin, targets):
        if "no_rope" not in names:
            return saved[1](self, layer, qkv, n_q, cos, sin, targets)
        b, t, _ = qkv.shape
        d = self.k.shape[-1]
        return qkv[..., : n_q * d].reshape(b, t, n_q, d)

    def silu_mul_codes(gate_up, qmax, codes_dtype=torch.int8, **kw):
        if "no_swiglu" not in names:
            return saved[2](gate_up, qmax, codes_dtype, **kw)
        from gearshift.kernels.act_quant import CodesSpec

        rows, width = gate_up.numel() // gate_up.shape[-1], gate_up.shape[-1] // 2
        return None, static.get(rows, width, CodesSpec(qmax, codes_dtype), gate_up.device)

    def attention(q, k_cache, v_cache, slots, upto, qmax=None, codes_dtype=torch.int8, **kw):
        out, codes = saved[3](q, k_cache, v_cache, slots, upto, qmax, codes_dtype, **kw)
        if "no_oquant" in names and codes is None and o_proj is not None:
            rows, width = q.shape[0] * q.shape[1], q.shape[2] * q.shape[3]
            spec = o_proj.codes_for(mode, rows, q.dtype)
            if spec is not None:
                codes = static.get(rows, width, spec, q.device)
        return out, codes

    transformer.DecoderLayer._norm = staticmethod(norm)
    kv_cache.KVCache.write_rotated = write_rotated
    transformer.silu_mul_codes_triton = silu_mul_codes
    transformer.decode_attention_triton = attention
    try:
        yield
    finally:
        transformer.DecoderLayer._norm = staticmethod(saved[0])
        kv_cache.KVCache.write_rotated = saved[1]
        transformer.silu_mul_codes_triton = saved[2]
        transformer.decode_attention_triton = saved[3]


def applicable(mode: str) -> list[str]:
    """The variants that leave something out in this mode (W4A16 has no codes producers)."""
    return ["no_norm", "no_rope"] if mode in ("w4a16", "w16a16") else list(VARIANTS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="w4a16,w4a8")
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--context", type=int, default=512, help="cached tokens each sequence attends to")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds; the median is reported")
    ap.add_argument("--reps", type=int, default=50, help="back-to-back replays per timing")
    ap.add_argument("--variants", default=",".join(VARIANTS + ("none",)),
                    help="which of the variants to time beside the shipped step (base)")
    ap.add_argument("--int4-prog", action="store_true", help="int4-prog stores (what W4A8 / W4A4 run best on)")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("fusion_bound.py times CUDA graphs: it needs a GPU")

    from engine_step import EngineStep

    from gearshift.dispatch import get_dispatcher

    dispatcher = get_dispatcher()
    models, rows = {}, []
    for mode in args.modes.split(","):
        wanted = args.variants.split(",")
        variants = {"base": set(), **{v: {v} for v in applicable(mode) if v in wanted}}
        if "none" in wanted:
            variants["none"] = set(applicable(mode))
        for b in (int(x) for x in args.batches.split(",")):
            timers = {}
            for name, drop in variants.items():
                timers[name] = EngineStep("llama3-8b", mode, args.int4_prog, b, args.context, models=models)
                o_proj = timers[name].model.model.layers[0].self_attn.o_proj
                with left_out(drop, o_proj, mode):
                    timers[name].ms(dispatcher, reps=3, trials=1)  # captured with the kernels left out
            times = {n: [] for n in variants}
            for _ in range(args.rounds):
                for n in variants:
                    times[n].append(timers[n].ms(dispatcher, reps=args.reps, trials=1))
            del timers
            row = {"mode": mode, "batch": b, "ms": {n: statistics.median(v) for n, v in times.items()},
                   "rounds": times}
            rows.append(row)
            base = row["ms"]["base"]
            print(f"{mode} batch {b}: base {base:.3f} ms; " +
                  ", ".join(f"{n} {row['ms'][n] / base:.3f}" for n in variants if n != "base"), flush=True)
    from kernel_bench import tag_suffix, write_json

    from gearshift.dispatch.policy import device_slug

    dev = torch.cuda.get_device_name()
    path = write_json(args.out, f"fusion_bound_{device_slug(dev)}{tag_suffix(args.tag)}.json",
                      {"device": dev, "torch": torch.__version__, "args": vars(args), "rows": rows})
    print("\n| mode | batch | base ms | " + " | ".join(("no_norm", "no_rope", "no_swiglu", "no_oquant", "none")) + " |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [f"{r['ms'][n] / r['ms']['base']:.3f}" if n in r["ms"] else "-"
                 for n in ("no_norm", "no_rope", "no_swiglu", "no_oquant", "none")]
        print(f"| {r['mode']} | {r['batch']} | {r['ms']['base']:.3f} | " + " | ".join(cells) + " |")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
