"""Attention over the KV cache through torch's SDPA, on a backend that needs no per-shape plan.

torch 2.11 on an H100/H200 picks cuDNN's attention for the model's call (additive mask, GQA). cuDNN
builds an execution plan for every new shape (43-68 ms of host time, measured on an H200) and, the
first time a kind of shape meets a fresh machine, runtime-compiles its kernel (0.7-1.7 s; the driver's
disk cache keeps it for later processes). A server prefills a new shape almost every time (the
longest prompt of a group sets it), and a warm-up cannot know which shapes cuDNN counts as new
kinds: a serve_load run at concurrency 16 showed fifteen requests waiting 1.3 s inside one such
call (stop 58). The memory-efficient backend has its kernels built in, so it costs no plan and no
compile. It needs as many K/V heads as query heads, so grouped K/V heads are repeated first, a
few sequences at a time so that the copy stays under `EXPAND_BYTES`. In steady state it is
slower than cuDNN on long prefills (0.32 against 0.17 ms for 15 x 336 tokens, 8.7 against 5.4 ms
for 16 x 2047, per layer); the `sdpa_backend` switch ("auto": torch's choice) A/Bs the two.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gearshift.kernels.switches import sdpa_backend

#: most bytes of repeated K and V one chunk of sequences may take
EXPAND_BYTES = 1 << 30

_noted: set[str] = set()


def _note_once(msg: str) -> None:
    from gearshift.model.loader import note  # (the loader imports the model: not at module level)

    if msg not in _noted:
        _noted.add(msg)
        note(msg)


def cache_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
                    backend: str | None = None, expand_bytes: int = EXPAND_BYTES) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + mask) v for q [B, H, T, D] and keys / values [B, H_kv, S, D] (H a
    multiple of H_kv, query head h reading K/V head h // (H / H_kv)), mask [B or 1, 1, T, S] additive.
    `backend`: "efficient" (the default on CUDA), "math" (the same chunked path on torch's reference
    kernel: what CPU tests check it with), "auto" (one SDPA call on torch's choice; CPU always)."""
    backend = backend or (sdpa_backend() if q.is_cuda else "auto")
    gqa = keys.shape[1] != q.shape[1]
    if backend == "auto":
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=gqa)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kind = {"efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[backend]
    b, rep = q.shape[0], q.shape[1] // keys.shape[1]
    per_seq = 2 * q.shape[1] * keys.shape[2] * keys.shape[3] * keys.element_size()
    step = max(1, expand_bytes // per_seq) if gqa else b
    outs = []
    try:
        with sdpa_kernel([kind]):
            for i in range(0, b, step):
                k, v = keys[i:i + step], values[i:i + step]
                if gqa:
                    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
                m = mask[i:i + step] if mask is not None and mask.shape[0] == b else mask
                outs.append(F.scaled_dot_product_attention(q[i:i + step], k, v, attn_mask=m))
    except RuntimeError as e:
        if "No available kernel" not in str(e):
            raise
        _note_once(f"torch's {backend} attention does not take q {tuple(q.shape)} {q.dtype} with this mask; "
                   f"these calls run on torch's own choice of backend")
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=gqa)
    return outs[0] if len(outs) == 1 else torch.cat(outs)
