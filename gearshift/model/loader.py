"""Load a model from a Hugging Face folder, a gearshift checkpoint or a GGUF file.

Every source is turned into one mapping of HF tensor names to either dense tensors or
weight stores (int4 from GGUF Q4_0/Q4_1 or from our checkpoints), and one builder makes the
`Transformer` from it, fusing q/k/v and gate/up into single stores (exact: rows are stacked).
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Optional

import torch

from gearshift.errors import GearshiftError
from gearshift.model.config import ModelConfig
from gearshift.model.quant_linear import QuantLinear, concat_rows
from gearshift.model.transformer import Attention, Decoder, DecoderLayer, MLP, RMSNorm, Transformer
from gearshift.quant import DenseWeight, quantize_int4, quantize_int4_progressive, quantize_int8
from gearshift.quant.base import WeightFormat, build_format

CHECKPOINT_MANIFEST = "gearshift.json"
WEIGHT_QUANTIZERS = ("int4", "int4-sym", "int4-prog", "int8")


@dataclass
class LoadedModel:
    model: Transformer
    tokenizer: object | None  # a transformers PreTrainedTokenizerFast
    config: ModelConfig
    source: str
    info: dict = field(default_factory=dict)

    def weight_summary(self) -> dict:
        formats: dict[str, int] = {}
        for _, lin in self.model.linear_layers():
            key = lin.store.format_name + (f"/g{lin.store.group_size}" if hasattr(lin.store, "group_size") else "")
            formats[key] = formats.get(key, 0) + 1
        return formats


def default_dtype(device: str | torch.device) -> torch.dtype:
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def note(msg: str) -> None:
    print(f"gearshift: {msg}", file=sys.stderr)


_GROUP_NOTES: set = set()


def choose_group_size(k: int, wanted: int) -> int:
    """The int4 group size for a layer of in_features k: `wanted` where it divides k, else the largest of
    128 / 64 / 32 / 16 below it that does (said once per case on stderr)."""
    if wanted < 16:
        raise GearshiftError(f"--group-size must be at least 16, got {wanted}")
    for g in (wanted, 128, 64, 32, 16):
        if g <= wanted and k % g == 0:
            if g != wanted and (k, wanted) not in _GROUP_NOTES:
                _GROUP_NOTES.add((k, wanted))
                note(f"group size {wanted} does not divide in_features {k}: those layers use group {g}")
            return g
    raise GearshiftError(f"in_features {k} has no int4 group size <= {wanted} among 128/64/32/16")


def quantize_store(w: torch.Tensor, how: str, group_size: int) -> WeightFormat:
    """The int4 scales and mins are bf16 values (stored as fp16, so also fp16 values): the large-M W4A16
    kernel then dequantizes in exact packed math under bf16 and fp16 activations alike (`quantize_int4`'s
    `values`), and a model quantized on the CPU (fp32) gets the same weights as on a GPU (bf16)."""
    if how in ("int4", "int4-sym"):
        return quantize_int4(w, choose_group_size(w.shape[1], group_size), symmetric=how == "int4-sym",
                             values=torch.bfloat16)
    if how == "int4-prog":
        return quantize_int4_progressive(w, choose_group_size(w.shape[1], group_size))
    if how == "int8":
        return quantize_int8(w)
    raise GearshiftError(f"unknown weight quantization {how!r}; choose one of {', '.join(WEIGHT_QUANTIZERS)}")


def _as_store(x, dtype, quantize: str | None, group_size: int, device=None) -> WeightFormat:
    """A linear's store: stores as they are, dense tensors quantized from their source precision (on
    `device`, where given) or cast to the compute dtype."""
    if isinstance(x, DenseWeight):  # a checkpoint's unquantized weight runs in the compute dtype, as an HF tensor does
        x = x.weight
    if isinstance(x, WeightFormat):
        return x
    if quantize:  # fp32 is exact for every source dtype: the weights `gearshift quantize` (CPU, fp32) makes
        return quantize_store(x.to(device=device, dtype=torch.float32), quantize, group_size)
    return DenseWeight(x.to(dtype))


_LINEAR_WEIGHT = re.compile(r"model\.layers\.\d+\.(self_attn|mlp)\.\w+_proj\.weight")


def _linear_bits(tensors: Mapping[str, object]) -> set[int]:
    """The weight bits the source's decoder linears hold (16 for dense ones), before they are built."""
    return {x.weight_bits if isinstance(x, WeightFormat) and x.format_name != "dense" else 16
            for name, x in tensors.items() if _LINEAR_WEIGHT.fullmatch(name)}


def _note_prequantized(info: dict, flagged: list[tuple[str, str]], total: int) -> None:
    """Say (once) that some of the `total` linears just quantized looked quantized already."""
    if not flagged:
        return
    note(f"{len(flagged)} of {total} linears look already quantized ({flagged[0][0]}: {flagged[0][1]}); "
         "re-quantizing compounds the error (GEARBX 13.3): prefer loading the quantized source as it is")
    info["prequantized_linears"] = [n for n, _ in flagged]


def build_transformer(config: ModelConfig, tensors: Mapping[str, object], dtype: torch.dtype,
                      quantize: str | None = None, group_size: int = 128, progress: bool = False,
                      device=None, quantized: list | None = None) -> Transformer:
    """Assemble the model from HF-named tensors/stores; dense linears are quantized if asked, from their
    source precision (so an fp32 source gets the weights `gearshift quantize` saves from it), on `device`
    where given. `quantized` collects (linear's name, prequant_report) per tensor quantized here."""
    from gearshift.quant.detect import prequant_report

    def store(x, name: str) -> WeightFormat:
        w = x.weight if isinstance(x, DenseWeight) else x  # (an unquantized checkpoint's; _as_store unwraps it too)
        if quantize and isinstance(w, torch.Tensor) and quantized is not None:
            quantized.append((name, prequant_report(w)))
        return _as_store(x, dtype, quantize, group_size, device)

    def get(name):
        if name not in tensors:
            raise GearshiftError(f"checkpoint has no tensor {name!r}")
        return tensors[name]

    def opt(name):
        return tensors.get(name)

    def norm(name):
        return RMSNorm(get(name).to(dtype), config.rms_norm_eps)

    def fused(prefix: str, fused_name: str, parts: list[str], with_bias: bool) -> QuantLinear:
        key = f"{prefix}.{fused_name}.weight"
        if key in tensors:  # gearshift checkpoints store fused projections
            st = store(tensors[key], f"{prefix}.{fused_name}")
            bias = opt(f"{prefix}.{fused_name}.bias")
        else:
            st = concat_rows([store(get(f"{prefix}.{p}.weight"), f"{prefix}.{fused_name}") for p in parts])
            bias = torch.cat([get(f"{prefix}.{p}.bias") for p in parts]) if with_bias else None
        return QuantLinear(st, None if bias is None else bias.to(dtype))

    def single(prefix: str, with_bias: bool) -> QuantLinear:
        bias = get(f"{prefix}.bias") if with_bias else opt(f"{prefix}.bias")
        return QuantLinear(store(get(f"{prefix}.weight"), prefix), None if bias is None else bias.to(dtype))

    layers = []
    it = range(config.num_hidden_layers)
    if progress:
        from tqdm import tqdm

        it = tqdm(it, desc="building layers" + (f" ({quantize})" if quantize else ""), leave=False, file=sys.stderr, disable=None)
    for i in it:
        p = f"model.layers.{i}"
        qkv = fused(f"{p}.self_attn", "qkv_proj", ["q_proj", "k_proj", "v_proj"], config.attention_bias)
        o = single(f"{p}.self_attn.o_proj", config.o_bias)
        q_norm = norm(f"{p}.self_attn.q_norm.weight") if config.qk_norm else None
        k_norm = norm(f"{p}.self_attn.k_norm.weight") if config.qk_norm else None
        gate_up = fused(f"{p}.mlp", "gate_up_proj", ["gate_proj", "up_proj"], config.mlp_bias)
        down = single(f"{p}.mlp.down_proj", config.mlp_bias)
        layers.append(DecoderLayer(Attention(config, qkv, o, q_norm, k_norm), MLP(gate_up, down),
                                   norm(f"{p}.input_layernorm.weight"), norm(f"{p}.post_attention_layernorm.weight")))
    embed = get("model.embed_tokens.weight")
    if isinstance(embed, WeightFormat):
        embed = embed.dequantize(torch.float32)
    embed = embed.to(dtype)
    decoder = Decoder(embed, layers, norm("model.norm.weight"))
    head = opt("lm_head.weight")
    if head is None or config.tie_word_embeddings:
        head_store = DenseWeight(decoder.embed_tokens.weight.data)  # tied: the same tensor, no copy
    else:
        head_store = _as_store(head, dtype, None, 0)
    if isinstance(head_store, WeightFormat) and head_store.format_name != "dense":
        head_store = DenseWeight(head_store.dequantize(dtype))
    lm_head = QuantLinear(head_store, pinned_mode="w16a16")
    return Transformer(config, decoder, lm_head, dtype)


def quantize_linears(loaded: LoadedModel, how: str, group_size: int = 128, progress: bool = True) -> int:
    """Round-to-nearest quantization of every dense linear except the lm_head, in place."""
    todo = [(n, lin) for n, lin in loaded.model.linear_layers()
            if n != "lm_head" and lin.store.format_name == "dense"]
    it = todo
    if progress and todo:
        from tqdm import tqdm

        it = tqdm(todo, desc=f"quantizing ({how})", leave=False, file=sys.stderr, disable=None)
    from gearshift.quant.detect import prequant_report

    flagged = []
    for name, lin in it:
        w = lin.store.dequantize(torch.float32)
        report = prequant_report(w)
        if report.flagged:
            flagged.append((name, report.reason))
        lin.set_store(quantize_store(w, how, group_size).to(w.device))
    use_int4_layout(loaded.model, loaded.info.get("int4_layout", "auto"))
    _note_prequantized(loaded.info, flagged, len(todo))
    if todo:
        loaded.info["quantization"] = {"method": "rtn", "weights": how, "group_size": group_size}
    return len(todo)


INT4_LAYOUTS = ("auto", "rows", "blocks16")


def use_int4_layout(model, layout: str = "auto") -> int:
    """Put every int4 linear that fits into `layout` (auto: blocks16 on CUDA, rows elsewhere);
    returns how many changed. Why: the small-M fragment kernel reads blocks16 faster (a warp's
    loads are 512 contiguous bytes) and the other GPU int4 kernels read it too; results are
    bit-identical in either layout (tests/test_int4_layout.py)."""
    from gearshift.quant.int4 import BLOCKS16, ROWS, Int4Weight, blocks16_fits

    if layout not in INT4_LAYOUTS:
        raise GearshiftError(f"unknown int4 layout {layout!r} (choose from {', '.join(INT4_LAYOUTS)})")
    changed = 0
    for _, lin in model.linear_layers():
        st = lin.store
        if not isinstance(st, Int4Weight):
            continue
        want = layout if layout != "auto" else BLOCKS16 if st.qweight.is_cuda else ROWS
        if want == BLOCKS16 and not blocks16_fits(st.out_features, st.in_features):
            want = ROWS  # speed only: every kernel reads rows
        if st.layout != want:
            lin.set_store(st.to_layout(want))
            changed += 1
    return changed


# ---- sources ---------------------------------------------------------------------------------

def _safetensor_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError):
            raise GearshiftError(f"{index} is not a valid safetensors index") from None
        files = [folder / n for n in names]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise GearshiftError(f"no *.safetensors weights in {folder}")
    for f in files:
        if not f.exists():
            raise GearshiftError(f"missing weight file {f}")
    return files


def read_safetensors(files: list[Path]) -> tuple[dict[str, torch.Tensor], dict]:
    from safetensors import safe_open

    tensors: dict[str, torch.Tensor] = {}
    metadata: dict = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as fh:
                metadata.update(fh.metadata() or {})
                for k in fh.keys():
                    tensors[k] = fh.get_tensor(k)
        except Exception as e:  # safetensors raises several types for truncated/corrupt files
            raise GearshiftError(f"cannot read {f.name}: {str(e).splitlines()[0]} (truncated or corrupt?)") from None
    return tensors, metadata


def _load_tokenizer(folder: Path):
    if not ((folder / "tokenizer.json").exists() or (folder / "tokenizer.model").exists()):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder))
    except Exception as e:
        raise GearshiftError(f"cannot load the tokenizer in {folder}: {str(e).splitlines()[0]}") from None


def _checkpoint_tensors(tensors: dict[str, torch.Tensor], manifest: dict) -> dict[str, object]:
    """Turn `<module>.store.<buffer>` tensors back into stores keyed `<module>.weight`."""
    out: dict[str, object] = {k: v for k, v in tensors.items() if ".store." not in k and ".act." not in k}
    for module, spec in manifest["layers"].items():
        prefix = f"{module}.store."
        parts = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        if not parts:
            raise GearshiftError(f"checkpoint lacks the tensors of {module}")
        out[f"{module}.weight"] = build_format(spec["format"], parts, spec.get("meta", {}))
    return out


def _attach_act_quantizers(model: Transformer, tensors: dict[str, torch.Tensor], manifest: dict) -> None:
    """Rebuild the calibrated activation quantizers a checkpoint recorded for each linear."""
    from gearshift.quant.activations import ACT_QUANTIZERS, ActQuantSpec

    modules = dict(model.linear_layers())
    for module, spec in manifest["layers"].items():
        for mode, a in spec.get("activations", {}).items():
            if a["kind"] == "spec":
                q = ActQuantSpec(a["meta"]["dtype"], a["meta"].get("group_size"))
            else:
                if a["kind"] not in ACT_QUANTIZERS:
                    raise GearshiftError(f"checkpoint uses activation quantizer {a['kind']!r}, unknown to this version")
                prefix = f"{module}.act.{mode}."
                parts = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
                q = ACT_QUANTIZERS[a["kind"]].from_state(a["meta"], parts)
            modules[module].set_act_quantizer(mode, q)


def _all_dense(manifest: dict) -> bool:
    """Whether a gearshift checkpoint holds no quantized linear (`gearshift quantize --weights none`)."""
    return all(spec["format"] == "dense" for spec in manifest["layers"].values())


#: `load_model`'s quantize may decide from the source: (source, bits its linears hold) -> quantizer or None
QuantizeRule = Callable[[str, set], Optional[str]]


def load_model(path: str | Path | None = None, *, dtype: torch.dtype | None = None, device: str = "cpu",
               quantize: str | QuantizeRule | None = None, group_size: int = 128, progress: bool = True,
               cuda_graphs: bool = True, int4_layout: str = "auto") -> LoadedModel:
    """Load `path` (HF folder, gearshift checkpoint or .gguf; None = embedded SmolLM2).

    On CUDA, decode-sized forwards replay captured CUDA graphs unless `cuda_graphs=False`.
    `int4_layout` (`use_int4_layout`): byte order of int4 weights in memory; speed only.
    `quantize`: the dense linears are quantized as they are built, from their own precision (so an
    fp32 or fp16 source gets the weights `gearshift quantize` saves, not those of its bf16 copy), on
    `device`. A `QuantizeRule` chooses the quantizer once the source is read, from the bits its
    linears hold; only the dense ones are quantized then.
    """
    if int4_layout not in INT4_LAYOUTS:
        raise GearshiftError(f"unknown int4 layout {int4_layout!r} (choose from {', '.join(INT4_LAYOUTS)})")
    quantize = None if quantize == "none" else quantize
    dtype = dtype or default_dtype(device)
    if path is None:
        from gearshift.model.gguf_loader import smollm2_path

        path = smollm2_path()
    p = Path(path)
    if not p.exists():
        raise GearshiftError(f"model path {p} does not exist")
    info: dict = {}
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise GearshiftError(f"{p} is a file but not a .gguf; pass a model folder or a GGUF file")
        from gearshift.model.gguf_loader import load_gguf

        g = load_gguf(p)
        config = ModelConfig.from_hf_dict(g.config)
        tensors, tokenizer = g.tensors, g.tokenizer
        info["source_format"] = "gguf"
        info["gguf_types"] = sorted(set(g.source_types.values()))
    else:
        config = ModelConfig.from_file(p / "config.json")
        raw, _ = read_safetensors(_safetensor_files(p))
        manifest_path = p / CHECKPOINT_MANIFEST
        if manifest_path.exists():
            manifest = json.loads(manifest_path.read_text())
            tensors = _checkpoint_tensors(raw, manifest)
            info["source_format"] = "gearshift"
            info["quantization"] = manifest.get("quantization", {})
            if isinstance(quantize, str) and not _all_dense(manifest):
                raise GearshiftError(f"{p} is already a quantized gearshift checkpoint; load it without --quantize")
        else:
            tensors = raw
            info["source_format"] = "hf"
        tokenizer = _load_tokenizer(p)
    if callable(quantize):
        quantize = quantize(str(p), _linear_bits(tensors))
    quantized: list = []
    model = build_transformer(config, tensors, dtype, quantize, group_size, progress=progress,
                              device=device, quantized=quantized)
    if info.get("source_format") == "gearshift":
        _attach_act_quantizers(model, raw, manifest)
    if quantize and quantized:  # (a source whose linears were all quantized already keeps its record)
        info["quantization"] = {"method": "rtn", "weights": quantize, "group_size": group_size}
        flagged: dict[str, str] = {}  # a fused linear's parts report under its name, once
        for name, report in quantized:
            if report.flagged:
                flagged.setdefault(name, report.reason)
        info["quantized_linears"] = len({name for name, _ in quantized})
        _note_prequantized(info, list(flagged.items()), info["quantized_linears"])
    model.to(device)
    model.eval()
    info["int4_layout"] = int4_layout
    use_int4_layout(model, int4_layout)
    if torch.device(device).type == "cuda":
        from gearshift.dispatch import install_policy
        from gearshift.dispatch.policy import describe, toolchain_note, unprofiled_shapes

        model.use_cuda_graphs = cuda_graphs
        d = install_policy(p.parent if p.is_file() else p)
        info["policy_map"] = describe(d.policy)
        if d.policy is None or any(getattr(d.policy, a, None) for a in ("borrowed_for", "filled_from")) \
                or toolchain_note(d.policy):
            note(f"kernel policy map: {info['policy_map']}")
        if d.policy is not None:
            shapes = {(lin.store.out_features, lin.store.in_features) for name, lin in model.linear_layers()
                      if name != "lm_head"}
            missing = unprofiled_shapes(d.policy, shapes)
            if missing:
                names = info["policy_unprofiled_shapes"] = [f"{n}x{k}" for n, k in missing]
                listed = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
                note(f"the kernel policy map has no entries for {len(missing)} of this model's {len(shapes)} linear "
                     f"shapes ({listed}): they run the kernels picked for the nearest profiled shapes; "
                     f"'gearshift profile --shapes {','.join(names)} --seed auto' profiles them into this GPU's "
                     "map (minutes)")
    return LoadedModel(model, tokenizer, config, str(p), info)
