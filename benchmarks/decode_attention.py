"""Decode attention per layer (GPU): what the engine ran before (torch SDPA with the additive mask,
cuDNN on the H100, then the o projection's activation quantizer under W4A8 / W4A4) against
`kernels/decode_attention.py` (one launch, with and without o's codes), at Llama-3-8B's heads
(32 query heads, 8 KV heads, head size 128), bf16, CUDA-graph replay over enough layer copies of the
KV cache to exceed L2. Outputs are first checked against the fp32 reference, and the codes bit for
bit against the quantizer. --variants also times other key chunks, blocks, warps and stages (the
engine's are constants: a token's bits depend on the chunk and block).

    PYTHONPATH=. python benchmarks/decode_attention.py --batches 1,4,16 --contexts 128,1024,4096 \\
        --out benchmarks/results
"""
import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from gearshift.dispatch.profiler import time_us
from gearshift.kernels.act_quant import quantize_act_triton
from gearshift.kernels.decode_attention import (KV_CHUNK, MAX_SPLITS, decode_attention_reference,
                                               decode_attention_triton)
from gearshift.quant.activations import ActQuantSpec

H, KV, D = 32, 8, 128


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--tokens", type=int, default=1, help="query tokens per sequence (QSPEC verify: gamma + 1)")
    ap.add_argument("--contexts", default="128,1024,4096", help="keys each sequence attends (its last token)")
    ap.add_argument("--variants", default="", help="also time these kernel variants, CHUNK:BLOCK:WARPS:STAGES[:MAX_SPLITS] "
                    "separated by commas, e.g. 512:64:4:3,256:128:8:2:16")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    dev = torch.cuda.get_device_name()
    act = ActQuantSpec("int8")
    rows = []
    t = a.tokens
    for b in (int(v) for v in a.batches.split(",")):
        for ctx in (int(v) for v in a.contexts.split(",")):
            cap = ctx + 16
            layer_bytes = 2 * b * KV * (cap + 1) * D * 2
            copies = max(2, min(32, (96 << 20) // layer_bytes))
            ks = [torch.randn(b, KV, cap + 1, D, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
            vs = [torch.randn(b, KV, cap + 1, D, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
            q = torch.randn(b, t, H, D, device="cuda", dtype=torch.bfloat16)
            slots = (ctx - t + torch.arange(t, device="cuda")).expand(b, t).contiguous()
            upto = ctx
            visible = torch.arange(upto, device="cuda").view(1, 1, 1, upto) <= slots.view(b, 1, t, 1)
            mask = torch.zeros(visible.shape, dtype=torch.bfloat16, device="cuda").masked_fill_(~visible, float("-inf"))

            def sdpa(k, v):  # as Attention.forward ran it
                out = F.scaled_dot_product_attention(q.transpose(1, 2), k[:, :, :upto], v[:, :, :upto],
                                                     attn_mask=mask, enable_gqa=True)
                return out.transpose(1, 2).reshape(b, t, -1)

            ref = decode_attention_reference(q, ks[0], vs[0], slots, upto).float()
            out, codes = decode_attention_triton(q, ks[0], vs[0], slots, upto, qmax=127.0)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            err_sdpa = ((sdpa(ks[0], vs[0]).float() - ref).norm() / ref.norm()).item()
            cq, cs = quantize_act_triton(out.view(b * t, -1), act)
            assert err < 1e-2 and torch.equal(cq, codes.codes) and torch.equal(cs, codes.scales), (b, ctx, err)
            us = {"sdpa": time_us([lambda k=k, v=v: sdpa(k, v) for k, v in zip(ks, vs)]),
                  "sdpa_then_quantizer": time_us([lambda k=k, v=v: quantize_act_triton(sdpa(k, v).view(b * t, -1), act)
                                                  for k, v in zip(ks, vs)]),
                  "kernel": time_us([lambda k=k, v=v: decode_attention_triton(q, k, v, slots, upto)
                                     for k, v in zip(ks, vs)]),
                  "kernel_codes": time_us([lambda k=k, v=v: decode_attention_triton(q, k, v, slots, upto, qmax=127.0)
                                           for k, v in zip(ks, vs)])}
            for var in filter(None, a.variants.split(",")):
                c, bl, w, st, *ms = (int(x) for x in var.split(":"))
                us[f"kernel_{var}"] = time_us([lambda k=k, v=v: decode_attention_triton(
                    q, k, v, slots, upto, chunk=c, block=bl, warps=w, stages=st, max_splits=ms[0] if ms else 8)
                    for k, v in zip(ks, vs)])
            kv_bytes = 2 * b * KV * ctx * D * 2
            rows.append({"batch": b, "tokens": t, "context": ctx, "rel_err": err, "rel_err_sdpa": err_sdpa,
                         "kv_bytes": kv_bytes, "us": us})
            print(f"B={b:3} T={t} ctx={ctx:5}: " + "  ".join(f"{k} {v:6.1f}" for k, v in us.items())
                  + f"  | err {err:.1e} (sdpa {err_sdpa:.1e})", flush=True)
            del ks, vs
    Path(a.out).mkdir(parents=True, exist_ok=True)
    tag = a.tag if not a.tag or a.tag.startswith("_") else "_" + a.tag
    (Path(a.out) / f"decode_attention_{dev.replace(' ', '_')}{tag}.json").write_text(json.dumps(
        {"device": dev, "heads": H, "kv_heads": KV, "head_dim": D, "chunk": KV_CHUNK, "max_splits": MAX_SPLITS,
         "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
