"""Model hyper-parameters read from a Hugging Face `config.json`.

The raw JSON is read directly (not through `AutoConfig`) so configs written by transformers
4.x (`rope_theta`, `rope_scaling`) and 5.x (`rope_parameters`) both load the same way.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gearshift.errors import GearshiftError

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v (Qwen2 always, Llama when attention_bias)
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm on each head of q and k before RoPE
    bos_token_id: int | None = None
    eos_token_id: list[int] = field(default_factory=list)
    torch_dtype: str = "float32"

    @property
    def model_type(self) -> str:
        return SUPPORTED_ARCHITECTURES[self.architecture]

    @classmethod
    def from_hf_dict(cls, d: dict) -> "ModelConfig":
        archs = d.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            named = ", ".join(archs) or d.get("model_type", "unknown")
            raise GearshiftError(
                f"unsupported architecture {named}; gearshift runs {', '.join(SUPPORTED_ARCHITECTURES)}")
        try:
            n_heads = int(d["num_attention_heads"])
            hidden = int(d["hidden_size"])
            rope = d.get("rope_parameters") or {}
            rope_scaling = d.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
            if rope_scaling is not None:
                rope_scaling = dict(rope_scaling)
                rope_scaling.setdefault("rope_type", rope_scaling.get("type", "default"))
                if rope_scaling["rope_type"] == "default":
                    rope_scaling = None
            eos = d.get("eos_token_id")
            eos = [] if eos is None else ([int(eos)] if isinstance(eos, int) else [int(e) for e in eos])
            model_type = SUPPORTED_ARCHITECTURES[arch]
            return cls(
                architecture=arch,
                vocab_size=int(d["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(d["intermediate_size"]),
                num_hidden_layers=int(d["num_hidden_layers"]),
                num_attention_heads=n_heads,
                num_key_value_heads=int(d.get("num_key_value_heads") or n_heads),
                head_dim=int(d.get("head_dim") or hidden // n_heads),
                rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
                rope_theta=float(d.get("rope_theta", rope.get("rope_theta", 10000.0))),
                rope_scaling=rope_scaling,
                max_position_embeddings=int(d.get("max_position_embeddings", 4096)),
                tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
                attention_bias=model_type == "qwen2" or bool(d.get("attention_bias", False)),
                o_bias=model_type != "qwen2" and bool(d.get("attention_bias", False)),
                mlp_bias=bool(d.get("mlp_bias", False)),
                qk_norm=model_type == "qwen3",
                bos_token_id=d.get("bos_token_id"),
                eos_token_id=eos,
                torch_dtype=str(d.get("torch_dtype") or d.get("dtype") or "float32"),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise GearshiftError(f"config.json is missing or has a bad value for {e}") from None

    @classmethod
    def from_file(cls, path: str | Path) -> "ModelConfig":
        try:
            return cls.from_hf_dict(json.loads(Path(path).read_text()))
        except FileNotFoundError:
            raise GearshiftError(f"no config.json in {Path(path).parent}") from None
        except json.JSONDecodeError as e:
            raise GearshiftError(f"{path} is not valid JSON ({e.msg} at line {e.lineno})") from None

    def to_dict(self) -> dict:
        return asdict(self)
