"""A Llama-family decoder (Llama 2/3, Mistral, Qwen2/2.5, Qwen3) whose linears are QuantLinear.

`forward` processes a batch of sequences, each at its own offset in the KV cache and each
with its own number of new tokens, in one call: prefill, decode, QSPEC's multi-token verify
and its overwrite of draft entries are all the same call with different (start, n_new).
"""

from __future__ import annotations

import math
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from gearshift.kernels.decode_attention import MAX_QUERY_TOKENS as DECODE_MAX_TOKENS
from gearshift.kernels.decode_attention import decode_attention_triton
from gearshift.kernels.rmsnorm import (add_rms_norm_codes_triton, add_rms_norm_reference, add_rms_norm_triton,
                                       rms_norm_codes_triton, rms_norm_reference, rms_norm_triton)
from gearshift.kernels.rope import rope_triton
from gearshift.kernels.rope_kv_write import split_qkv
from gearshift.kernels.silu_mul import emits_codes, silu_mul_codes_triton, silu_mul_reference, silu_mul_triton
from gearshift.kernels.switches import (decode_attention_codes_on, decode_attention_min_batch,  # noqa: F401
                                       decode_attention_on, fused_for, set_fused_kernels,
                                       pdl_pass)  # (set_fused_kernels: re-exported)
from gearshift.kernels.tile_room import empty_rows
from gearshift.kernels.x_tiles import XTiles
from gearshift.model.attention import cache_attention
from gearshift.model.config import ModelConfig
from gearshift.model.cuda_graphs import token_bucket
from gearshift.model.kv_cache import KVCache
from gearshift.model.quant_linear import CodesOnly, QuantLinear
from gearshift.model.rope import Rotary, apply_rotary
from gearshift.quant.modes import get_mode


class RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, tiles: bool = False) -> torch.Tensor | XTiles:
        """tiles (fused kernels): the normed rows as `XTiles`, for a linear whose kernel reads that layout."""
        if fused_for(x):
            return rms_norm_triton(x, self.weight, self.eps, tiles=tiles)
        return rms_norm_reference(x, self.weight, self.eps)

    def add(self, x: torch.Tensor, delta: torch.Tensor,
            tiles: bool = False) -> tuple[torch.Tensor, torch.Tensor | XTiles]:
        """(x + delta, norm(x + delta)): a residual update and the norm after it, one pass on GPU (tiles: as
        in `forward`)."""
        if fused_for(x):
            return add_rms_norm_triton(x, delta, self.weight, self.eps, tiles=tiles)
        return add_rms_norm_reference(x, delta, self.weight, self.eps)

    def with_codes(self, x: torch.Tensor, delta: torch.Tensor | None, qmax: float,
                   codes_dtype: torch.dtype = torch.int8, normed: bool = True, fragment_order: bool = False):
        """(residual, normed, ActCodes): the norm (after the residual add, if delta) also emits the
        per-token integer codes the next linear's kernel takes, in its dtype and (fragment_order) column
        order (fused kernels). normed=False: the normed rows are not stored (`CodesOnly` stands for them)."""
        fo = fragment_order
        if delta is None:
            s, (h, codes) = x, rms_norm_codes_triton(x, self.weight, self.eps, qmax, codes_dtype, normed, fo)
        else:
            s, h, codes = add_rms_norm_codes_triton(x, delta, self.weight, self.eps, qmax, codes_dtype, normed, fo)
        if h is None:
            h = CodesOnly(codes, tuple(x.shape), torch.promote_types(self.weight.dtype, x.dtype))
        return s, h, codes


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, qkv_proj: QuantLinear, o_proj: QuantLinear,
                 q_norm: RMSNorm | None = None, k_norm: RMSNorm | None = None):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.qkv_proj, self.o_proj = qkv_proj, o_proj
        self.q_norm, self.k_norm = q_norm, k_norm

    def forward(self, x, cos, sin, cache: KVCache, layer: int, targets, mask, upto, mode, codes=None):
        b, t, _ = x.shape  # (x may be CodesOnly: the norm stored only the codes qkv_proj takes)
        qkv = self.qkv_proj(x, mode, codes)
        fused = fused_for(qkv)
        if fused and self.q_norm is None:  # RoPE of q and k and the cache write in one launch
            q = cache.write_rotated(layer, qkv, self.n_heads, cos, sin, targets)
        else:
            q, k, v = split_qkv(qkv, self.n_heads, self.n_kv, self.head_dim)
            if self.q_norm is not None:
                q, k = self.q_norm(q), self.k_norm(k)
            if fused:  # one launch per tensor instead of five
                q, k = rope_triton(q, cos, sin), rope_triton(k, cos, sin)
            else:
                q = apply_rotary(q.transpose(1, 2), cos, sin).transpose(1, 2)
                k = apply_rotary(k.transpose(1, 2), cos, sin).transpose(1, 2)
            cache.write(layer, k, v, targets)
        if fused and self._decode_kernel(q, cache):  # one launch (and o's W4A8 codes, where switched on; o's
            # input in the fragment layout, `XTiles`, where its kernel reads that)
            spec = self.o_proj.codes_for(mode, b * t, q.dtype) if decode_attention_codes_on() else None
            tiles = spec is None and self.o_proj.x_tiles_for(mode, b * t, q.dtype, "o")
            out, codes = decode_attention_triton(q, cache.k[layer], cache.v[layer], targets, upto,
                                                 None if spec is None else spec.qmax,
                                                 torch.int8 if spec is None else spec.dtype, tiles=tiles,
                                                 fragment_order=spec is not None and spec.fragment_order)
            return self.o_proj(out, mode, codes)
        q = q.transpose(1, 2)
        keys, values = cache.view(layer, upto)
        out = cache_attention(q, keys.to(q.dtype), values.to(q.dtype), mask)  # [B, H, T, D]
        rows = empty_rows(b * t, out.shape[1] * out.shape[3], out.dtype, out.device)  # (o's TMA boxes: tile_room)
        rows.view(b, t, out.shape[1], out.shape[3]).copy_(out.transpose(1, 2))
        return self.o_proj(rows.view(b, t, -1), mode)

    @staticmethod
    def _decode_kernel(q: torch.Tensor, cache: KVCache) -> bool:
        """Whether this pass runs `decode_attention_triton`: few query tokens (its programs take one
        token each: prefill runs SDPA, whose tiles reuse each key across queries) in a 16-bit dtype, and
        a cache of at least `switches.decode_attention_min_batch()` sequences (1 since stop 46). The cache's
        batch is fixed for a generation, so AR steps and QSPEC's passes take the same one."""
        d = q.shape[-1]
        return (decode_attention_on() and q.shape[0] >= decode_attention_min_batch() and q.shape[1] <= DECODE_MAX_TOKENS
                and d >= 16 and d & (d - 1) == 0 and q.dtype in (torch.bfloat16, torch.float16)
                and cache.k.dtype == q.dtype)


class MLP(nn.Module):
    def __init__(self, gate_up_proj: QuantLinear, down_proj: QuantLinear):
        super().__init__()
        self.gate_up_proj, self.down_proj = gate_up_proj, down_proj

    def forward(self, x, mode, codes=None):
        if fused_for(x.codes.codes if isinstance(x, CodesOnly) else x):  # SwiGLU in gate_up's epilogue where its
            # kernel has one (fragment tiles: few tokens); down then quantizes its own input in W4A8 / W4A4. Where
            # down's kernel reads the fragment layout, the epilogue stores the product so (`XTiles`)
            rows = math.prod(x.shape[:-1])
            h = self.gate_up_proj.glu(x, mode, codes, self.down_proj.x_tiles_for(mode, rows, x.dtype, "down"))
            if h is not None:
                return self.down_proj(h, mode)
        gate_up = self.gate_up_proj(x, mode, codes)
        if not fused_for(gate_up):
            return self.down_proj(silu_mul_reference(gate_up), mode)
        # one pass instead of two kernels and a temporary; where down's kernel takes quantized
        # activations (W4A8 / W4A4), that pass also emits them from 64 tokens on (`emits_codes`)
        rows = gate_up.numel() // gate_up.shape[-1]
        spec = None
        if emits_codes(rows, gate_up.shape[-1] // 2):
            spec = self.down_proj.codes_for(mode, rows, gate_up.dtype)
        if spec is not None:  # the product is stored only for an observed down_proj (calibration)
            h, down_codes = silu_mul_codes_triton(gate_up, spec.qmax, spec.dtype, product=self.down_proj.observed(),
                                                  fragment_order=spec.fragment_order)
            if h is None:  # down's kernel reads only the codes
                h = CodesOnly(down_codes, (*gate_up.shape[:-1], gate_up.shape[-1] // 2), gate_up.dtype)
            return self.down_proj(h, mode, down_codes)
        return self.down_proj(silu_mul_triton(gate_up), mode)


class DecoderLayer(nn.Module):
    def __init__(self, attn: Attention, mlp: MLP, input_norm: RMSNorm, post_norm: RMSNorm):
        super().__init__()
        self.self_attn, self.mlp = attn, mlp
        self.input_layernorm, self.post_attention_layernorm = input_norm, post_norm

    def forward(self, x, delta, cos, sin, cache, layer, targets, mask, upto, mode):
        """x: the residual stream; delta: the previous layer's MLP output, not yet added (None for
        the first layer), so that each residual add runs inside the norm after it. Returns the
        residual stream and this layer's MLP output."""
        x, h, codes = self._norm(self.input_layernorm, x, delta, self.self_attn.qkv_proj, mode, "qkv")
        a = self.self_attn(h, cos, sin, cache, layer, targets, mask, upto, mode, codes)
        x, h, codes = self._norm(self.post_attention_layernorm, x, a, self.mlp.gate_up_proj, mode, "gate_up")
        return x, self.mlp(h, mode, codes)

    def writes_x_tiles(self, mode, rows: int, dtype: torch.dtype) -> bool:
        """Whether a producer of this layer writes some linear's input in `x_tiles`' layout at `rows` tokens
        (where the fused kernels run): the small kernels' PDL trigger depends on it (`small_trigger_rule`)."""
        return any(lin.x_tiles_for(mode, rows, dtype, name) for name, lin in (
            ("qkv", self.self_attn.qkv_proj), ("o", self.self_attn.o_proj), ("gate_up", self.mlp.gate_up_proj),
            ("down", self.mlp.down_proj)))

    @staticmethod
    def _norm(norm: RMSNorm, x, delta, linear: QuantLinear, mode, name: str):
        """(residual, normed, codes or None): where the next linear's kernel takes quantized
        activations (W4A8 / W4A4: the int8 tensor cores at M >= 64, the bf16 fragment MMA at 1..16
        tokens), the norm emits them: one launch and one read of the normed rows fewer than a
        separate quantizer. name: the linear's `switches.X_TILE_LINEARS` name."""
        spec = None
        if fused_for(x):
            spec = linear.codes_for(mode, x.shape[0] * x.shape[1], x.dtype)
        if spec is not None:  # the normed rows are stored only for an observed linear (calibration)
            return norm.with_codes(x, delta, spec.qmax, spec.dtype, normed=linear.observed(),
                                   fragment_order=spec.fragment_order)
        tiles = fused_for(x) and linear.x_tiles_for(mode, x.shape[0] * x.shape[1], x.dtype, name)  # (`XTiles`)
        x, h = (x, norm(x, tiles)) if delta is None else norm.add(x, delta, tiles)
        return x, h, None


class Decoder(nn.Module):
    """The `model.` prefix of HF checkpoints: embeddings, layers and the final norm."""

    def __init__(self, embed: torch.Tensor, layers: list[DecoderLayer], norm: RMSNorm):
        super().__init__()
        self.embed_tokens = nn.Embedding.from_pretrained(embed, freeze=True)
        self.layers = nn.ModuleList(layers)
        self.norm = norm


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig, decoder: Decoder, lm_head: QuantLinear, dtype: torch.dtype):
        super().__init__()
        self.config = config
        self.model = decoder
        self.lm_head = lm_head
        self.rotary = Rotary(config.head_dim, config.rope_theta, config.rope_scaling)
        self.dtype = dtype

    @property
    def tied(self) -> bool:
        return self.config.tie_word_embeddings or self.lm_head.store.format_name == "dense" and \
            self.lm_head.store.weight.data_ptr() == self.model.embed_tokens.weight.data_ptr()

    def _apply(self, fn, *args, **kwargs):
        """Keep a tied lm_head sharing the embedding tensor across .to()/.cuda() moves."""
        from gearshift.model.quant_linear import _STORE_VERSION

        tied = self.tied
        out = super()._apply(fn, *args, **kwargs)
        _STORE_VERSION[0] += 1  # tensors moved: captured CUDA graphs must not be reused
        if tied:
            self.lm_head.store._buffers["weight"] = self.model.embed_tokens.weight.data
        return out

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    def linear_layers(self) -> Iterator[tuple[str, QuantLinear]]:
        for name, mod in self.named_modules():
            if isinstance(mod, QuantLinear):
                yield name, mod

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        return KVCache.for_model(self.config, batch, capacity, self.dtype, self.device)

    @torch.inference_mode()
    def forward(self, tokens: torch.Tensor, cache: KVCache, start: list[int], n_new: list[int],
                mode: str = "w4a16", logits: str = "all", relocatable: bool = False) -> torch.Tensor:
        """Run `tokens` [B, T] (row b: its first n_new[b] entries are real) at cache offsets `start`.

        Returns logits [B, T, V] (`logits="all"`) or [B, 1, V] at each row's last real token
        (`logits="last"`); afterwards cache.lengths[b] = start[b] + n_new[b] for rows with n_new > 0.
        On CUDA, short steps (decode, QSPEC draft/verify) replay captured CUDA graphs when
        `use_cuda_graphs` is on; the graphs compute exactly what the eager path computes. Longer
        steps of up to `graph_max_rows` rows (prefills) asking for the last logits only then run
        padded to a token bucket, eagerly the first time their shapes are seen and from a graph
        after that (`cuda_graphs.py`). relocatable=True (prefills on a few slots of a cache, `KVCache.slots`):
        the graph is one for whichever slots they are (`GraphRunner.run`).
        """
        b, t = tokens.shape
        cache.check_room(start, n_new)
        upto = max((s + n for s, n in zip(start, n_new) if n), default=1)
        padded = token_bucket(t)
        # (long steps with every position's logits are left eager: a graph would hold [B, T, V] fp32 logits,
        # 0.5 GB at 1024 rows of a 128k vocabulary, for as long as it is cached)
        long_ok = logits == "last" and b * padded <= self.graph_max_rows
        if self.use_cuda_graphs and tokens.is_cuda and (t <= self.graph_max_tokens or long_ok):
            short = t <= self.graph_max_tokens
            run = tokens if padded == t else F.pad(tokens, (0, padded - t))  # padding tokens: n_new masks them
            out = self._graph_runner().run(self, run, cache, start, n_new, upto, mode, logits, capture_at_once=short,
                                           relocatable=relocatable)
        else:
            out = self.forward_lists(tokens, cache, start, n_new, upto, mode, logits)
        cache.commit(start, n_new)
        return out

    @torch.inference_mode()
    def forward_at(self, tokens: torch.Tensor, positions: torch.Tensor, n_new: torch.Tensor, cache: KVCache,
                   upto: int, mode: str = "w4a16", logits: str = "last") -> torch.Tensor:
        """A forward at cache positions the device computed (positions [B, T], n_new [B], on the device):
        nothing is read from the host, so it can be queued behind work whose results the host has not
        read yet (QSPEC's next draft after a verify pass). `upto` bounds every row's last position + 1.
        The caller keeps `cache.lengths` (nothing is committed here) and has checked the room. Short
        steps replay the same graphs `forward` captures for their shapes."""
        upto = min(upto, cache.capacity)
        if self.use_cuda_graphs and tokens.is_cuda and tokens.shape[1] <= self.graph_max_tokens:
            return self._graph_runner().run_tensors(self, tokens, positions, n_new, cache, upto, mode, logits)
        return self.forward_tensors(tokens, positions, n_new, cache, upto, mode, logits)

    def forward_lists(self, tokens: torch.Tensor, cache: KVCache, start: list[int], n_new: list[int], upto: int,
                      mode: str, logits: str) -> torch.Tensor:
        """`forward_tensors` from the host's offsets and lengths, eagerly (no commit)."""
        dev, t = tokens.device, tokens.shape[1]
        positions = torch.tensor(start, device=dev).unsqueeze(1) + torch.arange(t, device=dev).unsqueeze(0)
        return self.forward_tensors(tokens, positions, torch.tensor(n_new, device=dev), cache, upto, mode, logits)

    use_cuda_graphs = False
    graph_max_tokens = 16  # steps of up to this many tokens per row: captured at first sight
    # longer steps of up to this many rows (batch x bucketed tokens): captured when seen again. Beyond
    # about a thousand rows an 8B forward's kernels outlast its launches, and graphs gain little
    graph_max_rows = 1024

    def _graph_runner(self):
        if getattr(self, "_graphs", None) is None:
            from gearshift.model.cuda_graphs import GraphRunner

            self._graphs = GraphRunner()
        return self._graphs

    def forward_tensors(self, tokens: torch.Tensor, positions: torch.Tensor, n_new: torch.Tensor, cache: KVCache,
                        upto: int, mode: str, logits: str) -> torch.Tensor:
        """The forward on device tensors only (no host data): what CUDA graphs capture."""
        b, t = tokens.shape
        m = get_mode(mode) if isinstance(mode, str) else mode
        # where its norms, attention etc. let PDL successors in (at 1-2 rows: whether producers write x tiles)
        tiles = fused_for(tokens) and self.model.layers[0].writes_x_tiles(mode, b * t, self.dtype)
        with pdl_pass(b * t, codes=m.act is not None, tiles=tiles):
            return self._forward_tensors(tokens, positions, n_new, cache, upto, mode, logits)

    def _forward_tensors(self, tokens, positions, n_new, cache, upto, mode, logits):
        b, t = tokens.shape
        dev = tokens.device
        steps = torch.arange(t, device=dev).unsqueeze(0)
        valid = steps < n_new.unsqueeze(1)
        # key j is visible to the query at absolute position p iff j <= p. An additive mask built
        # once here: a boolean one is converted to this by SDPA in every layer (three launches each)
        visible = torch.arange(upto, device=dev).view(1, 1, 1, upto) <= positions.view(b, 1, t, 1)
        mask = torch.zeros(visible.shape, dtype=self.dtype, device=dev).masked_fill_(~visible, float("-inf"))
        x = self.model.embed_tokens(tokens).to(self.dtype)
        cos, sin = self.rotary(positions, self.dtype)
        targets = cache.targets(positions, valid)  # KV write positions, once for all layers
        delta = None
        for i, layer in enumerate(self.model.layers):
            x, delta = layer(x, delta, cos, sin, cache, i, targets, mask, upto, mode)
        if logits == "last":
            last = (n_new - 1).clamp_min(0)
            rows = torch.arange(b, device=dev)
            x = x[rows, last].unsqueeze(1)
            delta = None if delta is None else delta[rows, last].unsqueeze(1)
        h = self.model.norm(x) if delta is None else self.model.norm.add(x, delta)[1]
        return self.lm_head(h, mode).float()
