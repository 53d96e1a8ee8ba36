"""Random-weight models in Hugging Face layout, at toy or real shapes.

Tests, demos and GPU benchmarks need models without downloads: `write_random_model` writes a
folder (config.json, sharded safetensors, a small trained byte-level BPE tokenizer with a chat
template) that transformers and gearshift both load; `random_tensors` yields the same tensors
in memory for benchmarks that never touch disk.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

import torch

from gearshift.errors import GearshiftError
from gearshift.model.atomic import atomic_dir

_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}

PRESETS: dict[str, dict] = {
    "tiny": dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=512, hidden_size=128,
                 intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 rope_theta=10000.0, max_position_embeddings=512, tie_word_embeddings=False),
    "tiny-qwen2": dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=512, hidden_size=128,
                       intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       rope_theta=1000000.0, max_position_embeddings=512, tie_word_embeddings=True),
    "tiny-qwen3": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=512, hidden_size=128,
                       intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=32, rope_theta=1000000.0, max_position_embeddings=512, tie_word_embeddings=True),
    "tiny-llama3": dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=512, hidden_size=128,
                        intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                        rope_theta=500000.0, rope_scaling=dict(_LLAMA3_ROPE, original_max_position_embeddings=64),
                        max_position_embeddings=512, tie_word_embeddings=False),
    "smollm2-135m": dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=49152, hidden_size=576,
                         intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         rope_theta=100000.0, max_position_embeddings=8192, tie_word_embeddings=True),
    "llama3.2-1b": dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128256, hidden_size=2048,
                        intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                        rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE, max_position_embeddings=131072,
                        tie_word_embeddings=True),
    "llama2-7b": dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=32000, hidden_size=4096,
                      intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                      rope_theta=10000.0, max_position_embeddings=4096, tie_word_embeddings=False),
    "llama3-8b": dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128256, hidden_size=4096,
                      intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                      rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE, max_position_embeddings=131072,
                      tie_word_embeddings=False),
    "mistral-7b": dict(architectures=["MistralForCausalLM"], model_type="mistral", vocab_size=32768,
                       hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, rope_theta=1000000.0, max_position_embeddings=32768,
                       tie_word_embeddings=False),
    "qwen2.5-7b": dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=152064, hidden_size=3584,
                       intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                       rope_theta=1000000.0, max_position_embeddings=32768, tie_word_embeddings=False),
    "qwen3-8b": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=151936, hidden_size=4096,
                     intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, rope_theta=1000000.0, max_position_embeddings=40960, tie_word_embeddings=False),
}

SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

_CORPUS = """The quick brown fox jumps over the lazy dog. A language model predicts the next token from
the tokens before it. Quantization stores weights with fewer bits; int4 weights take a quarter of the
memory of fp16 weights. Speculative decoding drafts tokens cheaply and verifies them in one pass.
def add(a, b):\n    return a + b\nfor i in range(10):\n    print(i * i)\n1 + 1 = 2, 2 * 3 = 6, 10 / 4 = 2.5.
Entropy measures how uncertain the model is about the next token. Hello, world! How are you today?
"""


def preset_config(name_or_path: str, **overrides) -> dict:
    if name_or_path in PRESETS:
        cfg = dict(PRESETS[name_or_path])
    elif Path(name_or_path).is_file():
        cfg = json.loads(Path(name_or_path).read_text())
    else:
        raise GearshiftError(f"unknown model preset {name_or_path!r}; choose one of {', '.join(PRESETS)} "
                             "or pass a config.json path")
    cfg.update({k: v for k, v in overrides.items() if v is not None})
    cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    cfg.setdefault("rms_norm_eps", 1e-5)
    cfg.setdefault("hidden_act", "silu")
    cfg.setdefault("bos_token_id", 0)
    cfg.setdefault("eos_token_id", 1)
    if cfg["model_type"] == "llama":
        cfg.setdefault("attention_bias", False)
        cfg.setdefault("mlp_bias", False)
    return cfg


def tensor_shapes(cfg: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    qkv_bias = cfg["model_type"] == "qwen2" or cfg.get("attention_bias", False)
    yield "model.embed_tokens.weight", (v, h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        yield f"{p}.input_layernorm.weight", (h,)
        yield f"{p}.post_attention_layernorm.weight", (h,)
        for name, rows in (("q_proj", nh * hd), ("k_proj", nkv * hd), ("v_proj", nkv * hd)):
            yield f"{p}.self_attn.{name}.weight", (rows, h)
            if qkv_bias:
                yield f"{p}.self_attn.{name}.bias", (rows,)
        yield f"{p}.self_attn.o_proj.weight", (h, nh * hd)
        if cfg["model_type"] == "qwen3":
            yield f"{p}.self_attn.q_norm.weight", (hd,)
            yield f"{p}.self_attn.k_norm.weight", (hd,)
        yield f"{p}.mlp.gate_proj.weight", (inter, h)
        yield f"{p}.mlp.up_proj.weight", (inter, h)
        yield f"{p}.mlp.down_proj.weight", (h, inter)
    yield "model.norm.weight", (h,)
    if not cfg.get("tie_word_embeddings", False):
        yield "lm_head.weight", (v, h)


def random_tensors(cfg: dict, seed: int = 0, dtype: torch.dtype = torch.float32,
                   device: str = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
    """Deterministic random weights: N(0, 0.02) for matrices, ~1 for norms, small biases."""
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, shape in tensor_shapes(cfg):
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(shape, generator=gen, device=device)
        elif name.endswith(".bias"):
            t = 0.02 * torch.randn(shape, generator=gen, device=device)
        else:
            t = 0.02 * torch.randn(shape, generator=gen, device=device)
        yield name, t.to(dtype)


def _filler_words(count: int, taken: set[str]) -> list[str]:
    """`count` distinct byte-level tokens (" aab", " aac", ...) that are not in `taken`."""
    out: list[str] = []
    i = 26 * 26  # three letters and up
    while len(out) < count:
        word, j = "", i
        while j:
            j, r = divmod(j, 26)
            word = chr(ord("a") + r) + word
        tok = "\u0120" + word  # "Ġ": the byte-level alphabet's space
        if tok not in taken:
            out.append(tok)
        i += 1
    return out


def build_tokenizer(vocab_size: int):
    """A byte-level BPE trained on a small built-in corpus, with a ChatML chat template. Ids past what the
    corpus trains (a real model's 128 K vocabulary) are filler words, so that every id a random-weight model
    samples decodes to visible text: streamed output and time-per-token measurements see each token, not a
    run of empty decodes (no merge produces them, so encoding is unchanged)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    size = max(len(SPECIAL_TOKENS) + 256, min(vocab_size, 1024))
    trainer = trainers.BpeTrainer(vocab_size=size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    if tok.get_vocab_size() > vocab_size:
        raise GearshiftError(f"vocab_size {vocab_size} is too small for the byte-level tokenizer (needs 260)")
    if tok.get_vocab_size() < vocab_size:
        data = json.loads(tok.to_str())
        vocab = data["model"]["vocab"]
        first = max(vocab.values()) + 1
        vocab.update({w: first + i for i, w in enumerate(_filler_words(vocab_size - first, set(vocab)))})
        tok = Tokenizer.from_str(json.dumps(data))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|im_end|>",
                                   pad_token="<|end_of_text|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def write_random_model(out: str | Path, preset: str = "tiny", seed: int = 0, dtype: str = "float32",
                       shard_bytes: int = 2 << 30, progress: bool = False, **overrides) -> Path:
    """Write a random-weight HF folder; written to a temporary name, then renamed into place."""
    from safetensors.torch import save_file

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise GearshiftError(f"{out} exists and is not empty")
    cfg = preset_config(preset, **overrides)
    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(dtype)
    if tdtype is None:
        raise GearshiftError(f"unknown dtype {dtype!r} (float32, bfloat16, float16)")
    tokenizer = build_tokenizer(cfg["vocab_size"])
    cfg["bos_token_id"] = tokenizer.convert_tokens_to_ids("<|begin_of_text|>")
    cfg["eos_token_id"] = tokenizer.convert_tokens_to_ids("<|im_end|>")
    cfg["torch_dtype"] = dtype
    with atomic_dir(out) as tmp:
        it = random_tensors(cfg, seed, tdtype)
        if progress:
            from tqdm import tqdm

            it = tqdm(it, total=sum(1 for _ in tensor_shapes(cfg)), desc="random weights", leave=False, disable=None)
        # shards are written as they fill, so a real-size model never sits in memory whole
        names: list[list[str]] = [[]]
        shard: dict[str, torch.Tensor] = {}
        size = total = 0
        for name, t in it:
            nbytes = t.numel() * t.element_size()
            if size and size + nbytes > shard_bytes:
                save_file(shard, str(tmp / f"shard-{len(names) - 1}.safetensors"), metadata={"format": "pt"})
                names.append([])
                shard, size = {}, 0
            shard[name] = t
            names[-1].append(name)
            size += nbytes
            total += nbytes
        save_file(shard, str(tmp / f"shard-{len(names) - 1}.safetensors"), metadata={"format": "pt"})
        n = len(names)
        weight_map = {}
        for i, group in enumerate(names):
            fname = "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            os.replace(tmp / f"shard-{i}.safetensors", tmp / fname)
            weight_map.update({k: fname for k in group})
        if n > 1:
            (tmp / "model.safetensors.index.json").write_text(
                json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1))
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        tokenizer.save_pretrained(str(tmp))
    return out


def build_random_model(preset: str = "llama3-8b", weights: str = "int4", group_size: int = 128,
                       device: str = "cuda", dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                       int4_layout: str = "auto", **overrides):
    """A random-weight `Transformer` built directly in memory (no files), for benchmarks.

    `weights="int4"` draws packed int4 codes and fp16 scales directly (no dense weights are
    ever materialized, so an 8B model builds in seconds; the scales are bf16 values, as the loader's
    quantizer writes them); `"int4-prog"` the same with scales that
    are whole multiples of a per-row power of two (`Int4Weight.row_units`, what `--quantize
    int4-prog` writes); `"dense"` draws N(0, 0.02) tensors.
    """
    from gearshift.model.config import ModelConfig
    from gearshift.model.loader import build_transformer, use_int4_layout
    from gearshift.quant.int4 import Int4Weight

    cfg = preset_config(preset, **overrides)
    gen = torch.Generator(device=device).manual_seed(seed)
    tensors: dict[str, object] = {}
    for name, shape in tensor_shapes(cfg):
        is_linear = len(shape) == 2 and "embed" not in name and not name.startswith("lm_head")
        if is_linear and weights in ("int4", "int4-prog"):
            n, k = shape
            q = torch.randint(0, 256, (n, k // 2), generator=gen, device=device, dtype=torch.uint8)
            units = None
            if weights == "int4-prog":  # t * 2^-11 with t in 5..15: scales 0.0024-0.0073, |t * (q - 8)| <= 120
                units = torch.full((n,), 2.0 ** -11, device=device)
                t = torch.randint(5, 16, (n, k // group_size), generator=gen, device=device).float()
                scale = (t * units[:, None]).to(torch.float16)
            else:
                scale = torch.full((n, k // group_size), 0.02 / 4, device=device, dtype=torch.float16)
                scale *= 0.5 + torch.rand(scale.shape, generator=gen, device=device, dtype=torch.float16)
                scale = scale.to(torch.bfloat16).to(torch.float16)  # bf16 values, as the loader's quantizer writes
            tensors[name] = Int4Weight(q, scale, -8 * scale, group_size, symmetric=True, row_units=units)
        elif name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape, device=device, dtype=dtype)
        else:
            tensors[name] = (0.02 * torch.randn(shape, generator=gen, device=device, dtype=torch.float32)).to(dtype)
    model = build_transformer(ModelConfig.from_hf_dict(cfg), tensors, dtype).to(device).eval()
    use_int4_layout(model, int4_layout)
    return model
