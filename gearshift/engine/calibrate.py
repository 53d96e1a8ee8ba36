"""Activation calibration for the low-precision draft modes (issue 7: a W4A4 that drafts well).

`ActQuantOptions` says how a mode quantizes activations (bits, group size along K, Atom-style
outlier channels kept at 8 bits, QuaRot-style online Hadamard rotation, clipping);
`calibrate_activations(loaded, prompts, options)` runs the model in W4A16 over a handful of
prompts, records per-channel statistics of every linear's input with forward pre-hooks, picks
each layer's outlier channels and installs one quantizer per linear for the mode. Only the
activation side changes: the int4 weight stores are never written, so W4A16 is untouched.

Options also have a compact text form used on the command line and in reports:
``tok`` (per-token), ``g32`` (groups of 32), ``o32`` (32 outlier channels at 8 bits), ``had``
(online Hadamard), ``clip0.9``, ``a8`` (8-bit activations); joined with ``+``, e.g. ``g32+o32``.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, replace

import torch

from gearshift.errors import GearshiftError
from gearshift.quant.activations import ActQuantSpec
from gearshift.quant.modes import get_mode

LAYER_TYPES = ("qkv", "o", "gate_up", "down")

#: statistics per linear: name -> {"sumsq": [K] float64, "absmax": [K] float32, "count": int}
ActStats = dict


@dataclass(frozen=True)
class ActQuantOptions:
    bits: int | None = None  # None: the mode's activation bits (w4a4 -> 4, w4a8 -> 8)
    group_size: int | None = None  # one scale per token and group of K channels; None: per token
    outliers: int = 0  # channels per linear kept at `outlier_bits` (Atom); chosen from calibration
    outlier_bits: int = 8
    outlier_metric: str = "meansq"  # meansq | absmax: how calibration ranks channels
    hadamard: bool = False  # QuaRot-style online rotation Q(xR)R^T (weights unchanged)
    hadamard_block: int | None = None  # None: the largest Hadamard order dividing K
    seed: int = 0  # random signs of the Hadamard rotation
    clip: float = 1.0  # scale = clip * absmax / qmax for the low-bit channels
    #: per layer type: ((suffix, options), ...), suffix one of qkv, o, gate_up, down (the `*_proj` linears)
    layers: tuple = ()

    def __post_init__(self):
        if self.bits not in (None, 4, 8):
            raise GearshiftError(f"activation bits must be 4 or 8, not {self.bits}")
        if self.group_size is not None and self.group_size <= 0:
            raise GearshiftError("activation group size must be positive")
        if self.outliers < 0:
            raise GearshiftError("outlier count must be >= 0")
        if self.outlier_bits not in (4, 8):
            raise GearshiftError("outlier bits must be 4 or 8")
        if self.outlier_metric not in ("meansq", "absmax"):
            raise GearshiftError(f"unknown outlier metric {self.outlier_metric!r} (meansq, absmax)")
        if self.hadamard and self.outliers:
            raise GearshiftError("choose outlier channels or a Hadamard rotation, not both (the rotation spreads "
                                 "the outliers over every channel)")
        if not 0.0 < self.clip <= 1.0:
            raise GearshiftError(f"clip ratio must be in (0, 1], got {self.clip}")
        for suffix, sub in self.layers:
            if suffix not in LAYER_TYPES:
                raise GearshiftError(f"unknown layer type {suffix!r}; choose one of {', '.join(LAYER_TYPES)}")
            if not isinstance(sub, ActQuantOptions) or sub.layers:
                raise GearshiftError("per-layer-type options must be plain options")

    def for_layer(self, name: str) -> "ActQuantOptions":
        """The options that apply to the linear called `name` (its per-type override, if any)."""
        for suffix, sub in self.layers:
            if name.endswith(f".{suffix}_proj"):
                return sub
        return replace(self, layers=()) if self.layers else self

    @property
    def needs_calibration(self) -> bool:
        return self.outliers > 0 or any(sub.outliers > 0 for _, sub in self.layers)

    def act_bits(self, mode: str) -> int:
        if self.bits is not None:
            return self.bits
        spec = get_mode(mode).act
        if spec is None:
            raise GearshiftError(f"mode {mode} keeps 16-bit activations; activation options apply to w4a4/w4a8")
        return spec.bits

    def describe(self) -> str:
        parts = []
        if self.bits is not None:
            parts.append(f"a{self.bits}")
        if self.hadamard:
            parts.append("had" + (f"{self.hadamard_block}" if self.hadamard_block else ""))
        if self.group_size is not None:
            parts.append(f"g{self.group_size}")
        if self.outliers:
            parts.append(f"o{self.outliers}" + ("" if self.outlier_bits == 8 else f"b{self.outlier_bits}")
                         + ("" if self.outlier_metric == "meansq" else "max"))
        if self.clip != 1.0:
            parts.append(f"clip{self.clip:g}")
        text = "+".join(parts) or "tok"
        return ",".join([text] + [f"{suffix}:{sub.describe()}" for suffix, sub in self.layers])

    @classmethod
    def parse(cls, text: str) -> "ActQuantOptions":
        """`tok`, `g32`, `o32`, `o32max`, `o64b4`, `had`, `had64`, `clip0.9`, `a8`, `seed3`, joined by '+';
        then optional per-layer-type overrides after commas: `g32+o64,down:had+g32`."""
        head, *rest = text.split(",")
        layers = []
        for part in rest:
            if ":" not in part:
                raise GearshiftError(f"per-layer option {part!r} in {text!r} must read TYPE:OPTIONS "
                                     f"(TYPE one of {', '.join(LAYER_TYPES)})")
            suffix, sub = part.split(":", 1)
            layers.append((suffix.strip().lower(), cls.parse(sub)))
        return replace(cls._parse_one(head), layers=tuple(layers))

    @classmethod
    def _parse_one(cls, text: str) -> "ActQuantOptions":
        kw: dict = {}
        for raw in text.split("+"):
            p = raw.strip().lower()
            try:
                if p in ("", "tok", "token", "rtn", "per-token"):
                    continue
                if p.startswith("had"):
                    kw["hadamard"] = True
                    if p[3:]:
                        kw["hadamard_block"] = int(p[3:])
                elif p.startswith("clip"):
                    kw["clip"] = float(p[4:])
                elif p.startswith("seed"):
                    kw["seed"] = int(p[4:])
                elif p.startswith("g"):
                    kw["group_size"] = int(p[1:])
                elif p.startswith("a"):
                    kw["bits"] = int(p[1:])
                elif p.startswith("o"):
                    body = p[1:]
                    if body.endswith("max"):
                        kw["outlier_metric"], body = "absmax", body[:-3]
                    if "b" in body:
                        body, b = body.split("b", 1)
                        kw["outlier_bits"] = int(b)
                    kw["outliers"] = int(body)
                else:
                    raise ValueError
            except ValueError:
                raise GearshiftError(f"cannot read activation option {raw!r} in {text!r} (use e.g. tok, g32, "
                                     f"o32, had, clip0.9, a8 joined with '+')") from None
        return cls(**kw)

    def to_meta(self, mode: str | None = None) -> dict:
        d = asdict(replace(self, layers=()))
        d["layers"] = {suffix: asdict(sub) for suffix, sub in self.layers}
        d["spec"] = self.describe()
        if mode is not None:
            d["mode"] = mode
            d["act_bits"] = self.act_bits(mode)
        return d


# ------------------------------------------------------------------------------------ statistics

def _targets(model) -> list[tuple[str, object]]:
    return [(n, lin) for n, lin in model.linear_layers() if n != "lm_head" and lin.pinned_mode is None]


def _encode(loaded, prompt) -> list[int]:
    if isinstance(prompt, (list, tuple)):
        return [int(t) for t in prompt]
    from gearshift.engine.agreement import encode_prompt

    return encode_prompt(loaded, str(prompt))


@torch.inference_mode()
def collect_activation_stats(loaded, prompts, new_tokens: int = 32, progress: bool = True,
                             mode: str = "w4a16") -> ActStats:
    """Per-channel statistics of every linear's input over the prompts (run one at a time in `mode`).

    Each prompt (text, chat-templated when the tokenizer has a template, or token ids) is
    extended by `new_tokens` greedy tokens so the statistics also cover generated text.
    """
    model = loaded.model
    if not prompts:
        raise GearshiftError("calibration needs at least one prompt")
    stats: ActStats = {}
    hooks = []

    def hook_for(name):
        def hook(module, args):
            x = args[0]
            m = args[1] if len(args) > 1 else "w4a16"
            if m != mode:
                return
            xf = x.detach().reshape(-1, x.shape[-1]).float()
            s = stats.setdefault(name, {"sumsq": torch.zeros(x.shape[-1], dtype=torch.float64, device=x.device),
                                        "absmax": torch.zeros(x.shape[-1], device=x.device), "count": 0})
            s["sumsq"] += xf.double().pow(2).sum(0)
            s["absmax"] = torch.maximum(s["absmax"], xf.abs().amax(0))
            s["count"] += xf.shape[0]
        return hook

    for name, lin in _targets(model):
        hooks.append(lin.register_forward_pre_hook(hook_for(name)))
    it = list(prompts)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(it), desc="calibrating activations", file=sys.stderr, disable=None, leave=False)
    try:
        dev = model.device
        for p in it:
            ids = _encode(loaded, p)
            cache = model.new_cache(1, len(ids) + new_tokens + 1)
            tok = torch.tensor([ids], device=dev)
            logits = model(tok, cache, [0], [len(ids)], mode=mode, logits="last")
            n = len(ids)
            for _ in range(new_tokens):
                nxt = int(logits[0, -1].argmax())
                if nxt in set(loaded.config.eos_token_id or []):
                    break
                logits = model(torch.tensor([[nxt]], device=dev), cache, [n], [1], mode=mode, logits="last")
                n += 1
            if bar is not None:
                bar.update(1)
    finally:
        for h in hooks:
            h.remove()
        if bar is not None:
            bar.close()
    return {k: {"sumsq": v["sumsq"].cpu(), "absmax": v["absmax"].cpu(), "count": v["count"]} for k, v in stats.items()}


def choose_outliers(stats: dict, n: int, metric: str = "meansq") -> torch.Tensor:
    """The n channels with the largest mean square (or absmax) input, sorted by index."""
    score = stats["sumsq"] / max(stats["count"], 1) if metric == "meansq" else stats["absmax"].double()
    return torch.sort(torch.topk(score, n).indices).values


# ------------------------------------------------------------------------------------ installing

def build_quantizer(options: ActQuantOptions, mode: str, in_features: int, stats: dict | None = None):
    """The activation quantizer of one linear for `mode` (an ActQuantSpec where one suffices)."""
    from gearshift.quant.act_quantizers import HadamardActQuantizer, OutlierActQuantizer

    bits = options.act_bits(mode)
    g = options.group_size
    if g is not None and g >= in_features:
        g = None
    if options.hadamard:
        return HadamardActQuantizer(in_features, bits, g, options.clip, options.hadamard_block, seed=options.seed)
    if options.outliers:
        if stats is None:
            raise GearshiftError("outlier channels need calibration statistics; run calibrate_activations")
        n = min(options.outliers, in_features - (g or 1))
        return OutlierActQuantizer(in_features, choose_outliers(stats, n, options.outlier_metric), bits, g,
                                   options.outlier_bits, options.clip)
    if options.clip != 1.0:
        return OutlierActQuantizer(in_features, None, bits, g, options.outlier_bits, options.clip)
    return ActQuantSpec("int4" if bits == 4 else "int8", g)  # plain spec: the GPU kernels can serve it


def install_act_quantizers(loaded, options: ActQuantOptions, mode: str = "w4a4", stats: ActStats | None = None) -> dict:
    """Install `options` for `mode` on every linear but the lm_head; returns the recorded metadata.

    The metadata also lands in loaded.info["quantization"]["activations"][mode], which
    `save_checkpoint` writes into the manifest's "quantization" section.
    """
    m = get_mode(mode)
    if m.weight_bits != 4 or m.act is None:
        raise GearshiftError(f"activation options are for the low-precision draft modes (w4a4, w4a8), not {mode}")
    if options.needs_calibration and stats is None:
        raise GearshiftError("these activation options pick outlier channels from calibration data; "
                             "use calibrate_activations(loaded, prompts, options)")
    n_out = []
    for name, lin in _targets(loaded.model):
        q = build_quantizer(options.for_layer(name), mode, lin.in_features, None if stats is None else stats.get(name))
        if isinstance(q, torch.nn.Module):
            q = q.to(loaded.model.device)
        old = lin.act_overrides.get(mode)
        if isinstance(old, torch.nn.Module) and f"act_{mode}" in lin._modules:
            del lin._modules[f"act_{mode}"]
        lin.set_act_quantizer(mode, q)
        n_out.append(getattr(q, "n_outliers", 0))
    meta = options.to_meta(mode)
    meta["linears"] = len(n_out)
    if stats is not None:
        meta["calibration_tokens"] = max((s["count"] for s in stats.values()), default=0)
    qinfo = loaded.info.setdefault("quantization", {})
    qinfo.setdefault("activations", {})[mode] = meta
    return meta


def clear_act_quantizers(loaded, mode: str) -> None:
    """Back to the mode's default activation quantizer on every linear."""
    for _, lin in loaded.model.linear_layers():
        lin.act_overrides.pop(mode, None)
        lin._modules.pop(f"act_{mode}", None)
    acts = loaded.info.get("quantization", {}).get("activations", {})
    acts.pop(mode, None)


def calibrate_activations(loaded, prompts, options: ActQuantOptions, mode: str = "w4a4", progress: bool = True,
                          new_tokens: int = 32, stats: ActStats | None = None) -> dict:
    """Calibrate (only if the options need data) and install the quantizers for `mode`.

    `prompts`: texts (chat-templated) or token-id lists; None or empty = the built-in calibration
    prompts. Returns the metadata recorded for the checkpoint.
    """
    if options.needs_calibration and stats is None:
        if not prompts:
            from gearshift.data import calibration_prompts

            prompts = calibration_prompts()
        stats = collect_activation_stats(loaded, prompts, new_tokens=new_tokens, progress=progress)
    meta = install_act_quantizers(loaded, options, mode, stats)
    if options.needs_calibration:
        meta["calibration_prompts"] = len(prompts)
    return meta


def with_bits(options: ActQuantOptions, bits: int | None) -> ActQuantOptions:
    return replace(options, bits=bits)
