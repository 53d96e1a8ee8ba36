"""End-to-end decode speed of the engine on an 8B-shaped random-weight model (GPU).

For each precision mode and batch size: run the real engine (Engine + AutoregressivePolicy)
eagerly and with CUDA-graph replay, check that both produce the same greedy tokens, and
report ms per decode step, tokens/s, and the ratio of the step time to the int4 weight-read
floor measured in the same run (int4 linear bytes / device-to-device copy bandwidth).

    python benchmarks/e2e.py --out benchmarks/results       # on a CUDA machine
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import torch


def model_for(models: dict, preset: str, mode: str, int4_prog: bool, **kw):
    """The random-weight model a mode runs on (dense for W16A16, else int4 / int4-prog stores), built
    on first use; `models` holds one at a time (an 8B model of each kind would not fit twice)."""
    from gearshift.model.tiny import build_random_model

    weights = "dense" if mode == "w16a16" else ("int4-prog" if int4_prog else "int4")
    if weights not in models:
        models.clear()
        torch.cuda.empty_cache()
        models[weights] = build_random_model(preset, weights=weights, device="cuda", **kw)
    return models[weights]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama3-8b")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--modes", default="w4a16,w4a8,w16a16")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--no-fused", action="store_true", help="torch RMSNorm/RoPE/KV-write/SwiGLU instead of the Triton kernels")
    ap.add_argument("--no-swiglu-codes", action="store_true",
                    help="W4A8 / W4A4: the down projection quantizes SwiGLU's output itself instead of taking the "
                    "codes SwiGLU emits (same tokens; for A/B timing)")
    ap.add_argument("--swiglu-codes-from", type=int, default=None, metavar="ROWS",
                    help="emit SwiGLU's codes from this many tokens on (default 1 since stop 34; an A/B experiment)")
    ap.add_argument("--no-decode-attention", action="store_true",
                    help="decode steps attend with torch SDPA (and W4A8 / W4A4's o projection quantizes its input) "
                    "instead of kernels/decode_attention.py (other bits: for A/B timing)")
    ap.add_argument("--no-attention-codes", action="store_true",
                    help="W4A8 / W4A4: the decode attention kernel does not emit the o projection's codes; o "
                    "quantizes its input in a launch of its own (same tokens; for A/B timing)")
    ap.add_argument("--no-pdl", action="store_true",
                    help="launch kernels without programmatic dependent launch (gearshift/kernels/pdl.py)")
    ap.add_argument("--int4-prog", action="store_true",
                    help="int4 weights whose groups are int8 multiples of a row unit (--quantize int4-prog): "
                         "W4A8 / W4A4 can then run the int8 tensor-core kernel w4a8_progressive")
    ap.add_argument("--tag", default="", help="suffix of the result file name (e2e_<device>_<tag>.json)")
    ap.add_argument("--int4-layout", default="auto", choices=("auto", "rows", "blocks16"),
                    help="int4 byte order (auto: blocks16 on GPU, as the engine loads it)")
    args = ap.parse_args()
    from gearshift.kernels.pdl import set_pdl
    from gearshift.model.transformer import set_fused_kernels

    set_fused_kernels(not args.no_fused)
    set_pdl(not args.no_pdl)
    from gearshift.kernels.switches import set_decode_attention, set_swiglu_codes
    set_swiglu_codes(not args.no_swiglu_codes, args.swiglu_codes_from)
    set_decode_attention(not args.no_decode_attention, not args.no_attention_codes)

    from gearshift.decode.autoregressive import AutoregressivePolicy
    from gearshift.dispatch.profiler import copy_bandwidth
    from gearshift.decode.sampling import SamplingParams
    from gearshift.engine.engine import Engine, Request
    from gearshift.model.loader import LoadedModel
    from gearshift.model.tiny import preset_config
    from gearshift.model.config import ModelConfig
    from gearshift.dispatch import get_dispatcher
    from gearshift.dispatch.policy import describe

    bw = copy_bandwidth()
    cfg = ModelConfig.from_hf_dict(preset_config(args.preset))
    rows = []
    models = {}
    for mode in args.modes.split(","):
        model = model_for(models, args.preset, mode, args.int4_prog, int4_layout=args.int4_layout)
        lin_bytes = sum(l.store.nbytes() for n, l in model.linear_layers() if n != "lm_head")
        head_bytes = model.lm_head.store.nbytes()
        floor_s = lin_bytes / bw
        loaded = LoadedModel(model, None, cfg, args.preset)
        for b in [int(x) for x in args.batches.split(",")]:
            gen = torch.Generator().manual_seed(b)
            prompts = [torch.randint(0, cfg.vocab_size, (args.prompt_len,), generator=gen).tolist() for _ in range(b)]
            res = {}
            for graphs in (False, True):
                model.use_cuda_graphs = graphs
                eng = Engine(loaded, max_batch=b)
                params = lambda: SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True)  # noqa: E731
                try:
                    eng.generate([Request(p, params()) for p in prompts[:b]], AutoregressivePolicy(model, mode))
                    out = eng.generate([Request(p, params()) for p in prompts], AutoregressivePolicy(model, mode))
                except Exception as e:  # record, keep measuring the rest
                    print(f"FAILED mode={mode} batch={b} graphs={graphs}: {type(e).__name__}: {e}", flush=True)
                    continue
                st = eng.last_stats
                step = st["decode_s"] / st["forwards"]
                res[graphs] = ([r.token_ids for r in out], step, st)
            same = len(res) == 2 and res[False][0] == res[True][0]
            for graphs in res:
                _, step, st = res[graphs]
                rows.append({"mode": mode, "batch": b, "cuda_graphs": graphs, "ms_per_step": step * 1e3,
                             "tokens_per_s": b / step, "floor_ms": floor_s * 1e3,
                             "step_over_floor": step / floor_s, "same_tokens_as_eager": same,
                             "tokens_sha1": hashlib.sha1(repr(res[graphs][0]).encode()).hexdigest()[:12],
                             "linear_bytes": lin_bytes, "lm_head_bytes": head_bytes})
                print(json.dumps(rows[-1]), flush=True)
        model.use_cuda_graphs = False
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "preset": args.preset,
           "copy_bandwidth_GBps": bw / 1e9, "dispatcher": type(get_dispatcher()).__name__,
           "policy_map": describe(getattr(get_dispatcher(), "policy", None)),
           "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "fused_norm_rope": not args.no_fused,
           "pdl": not args.no_pdl, "swiglu_codes": not args.no_swiglu_codes,
           "decode_attention": not args.no_decode_attention,
           "attention_codes": not args.no_attention_codes, "int4_layout": args.int4_layout,
           "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = doc["device"].replace(" ", "_")
    tag = args.tag if not args.tag or args.tag.startswith("_") else "_" + args.tag
    (out / f"e2e_{name}{tag}.json").write_text(json.dumps(doc, indent=1))
    print(f"\n{'mode':8} {'batch':>5} {'graphs':>6} {'ms/step':>8} {'tok/s':>9} {'x floor':>8} same")
    for r in rows:
        print(f"{r['mode']:8} {r['batch']:5d} {str(r['cuda_graphs']):>6} {r['ms_per_step']:8.2f} "
              f"{r['tokens_per_s']:9.1f} {r['step_over_floor']:8.2f} {r['same_tokens_as_eager']}")


if __name__ == "__main__":
    main()
