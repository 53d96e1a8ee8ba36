"""Write a loaded (and possibly quantized) model as a gearshift checkpoint.

Layout: the source `config.json`, the tokenizer files, `model.safetensors` holding every
store's buffers under `<module>.store.<buffer>` plus the dense norms and embeddings under
their HF names, and `gearshift.json` naming each linear's format. It loads back without
re-quantizing. Everything is written to a temporary folder that is renamed at the end, so an
interrupted run leaves nothing half-written.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from gearshift.errors import GearshiftError
from gearshift.model.atomic import atomic_dir
from gearshift.model.loader import CHECKPOINT_MANIFEST, LoadedModel
from gearshift.quant.activations import ActQuantSpec

FORMAT_VERSION = 1


def _hf_config(loaded: LoadedModel) -> dict:
    c = loaded.config
    d = {
        "architectures": [c.architecture], "model_type": c.model_type, "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta, "rope_scaling": c.rope_scaling,
        "max_position_embeddings": c.max_position_embeddings, "tie_word_embeddings": c.tie_word_embeddings,
        "attention_bias": c.attention_bias if c.model_type != "qwen2" else False, "mlp_bias": c.mlp_bias,
        "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id, "torch_dtype": c.torch_dtype,
        "hidden_act": "silu",
    }
    return d


def save_checkpoint(loaded: LoadedModel, out: str | Path, extra_meta: dict | None = None) -> Path:
    from safetensors.torch import save_file

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GearshiftError(f"output {out} already exists; choose a new path")
    model = loaded.model
    tensors: dict[str, torch.Tensor] = {}
    layers: dict[str, dict] = {}
    for name, lin in model.linear_layers():
        if name == "lm_head" and model.tied:
            continue
        layers[name] = {"format": lin.store.format_name, "meta": lin.store.meta()}
        acts = {}
        for mode, q in lin.act_overrides.items():
            if isinstance(q, ActQuantSpec):
                acts[mode] = {"kind": "spec", "meta": {"dtype": q.dtype, "group_size": q.group_size}}
                continue
            meta, qt = q.to_state()
            acts[mode] = {"kind": q.kind, "meta": meta}
            for tname, t in qt.items():
                tensors[f"{name}.act.{mode}.{tname}"] = t
        if acts:
            layers[name]["activations"] = acts
        for bname, buf in lin.store.named_buffers():
            tensors[f"{name}.store.{bname}"] = buf
        if lin.bias is not None:
            tensors[f"{name}.bias"] = lin.bias
    for name, t in model.state_dict().items():
        if ".store." in name or ".act_" in name or name.endswith(".bias") and name.rsplit(".", 1)[0] in layers:
            continue
        if name.startswith("lm_head"):
            continue
        tensors[name] = t
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    manifest = {"format_version": FORMAT_VERSION, "layers": layers,
                "quantization": {**loaded.info.get("quantization", {}), **(extra_meta or {})},
                "source": loaded.source, "source_format": loaded.info.get("source_format")}
    with atomic_dir(out) as tmp:
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt", "gearshift": "1"})
        (tmp / "config.json").write_text(json.dumps(_hf_config(loaded), indent=2))
        (tmp / CHECKPOINT_MANIFEST).write_text(json.dumps(manifest, indent=2))
        if loaded.tokenizer is not None:
            loaded.tokenizer.save_pretrained(str(tmp))
    return out
