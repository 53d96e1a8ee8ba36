"""Logits of one forward with the fused Triton kernels (RMSNorm, RoPE, KV write, SwiGLU) vs the torch ops
(GPU, random 8B shapes)."""

import torch

from gearshift.model.tiny import build_random_model
from gearshift.model.transformer import set_fused_kernels

model = build_random_model("llama3-8b", weights="int4", device="cuda", num_hidden_layers=8)
ids = torch.randint(0, 1000, (4, 48), device="cuda")
out = {}
for fused in (False, True):
    set_fused_kernels(fused)
    out[fused] = model(ids, model.new_cache(4, 64), [0] * 4, [48] * 4, mode="w4a16")
d = (out[True] - out[False]).abs()
print(f"fused vs torch RMSNorm/RoPE: max |dlogit| {d.max().item():.4f}, mean {d.mean().item():.5f}, "
      f"logit scale {out[False].abs().max().item():.2f}, argmax agreement "
      f"{(out[True].argmax(-1) == out[False].argmax(-1)).float().mean().item():.4f}")
