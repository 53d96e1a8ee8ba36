"""`benchmarks/owed_h100.sh`: every command it runs parses, and names only switches that exist (CPU).

Why: the script is for the first device call that gets an H100, which is rare; a typo found there costs that call.
Each command's argparse runs as the script would call it, stopped right after parsing, and the switch settings it
passes (`--set-a` / `--set-b`, `--side`) go through the parsers the benchmarks use on them.
"""
from __future__ import annotations

import argparse
import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "owed_h100.sh"


def owed_commands() -> list[list[str]]:
    """The python command lines of the script (after `run SECONDS`, or alone), continuations joined."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    cmds = []
    for line in text.splitlines():
        line = line.strip().removesuffix(";;").strip()
        m = re.match(r"(?:run \d+ )?(python .*)", line)
        if m:
            words = shlex.split(m.group(1).replace("$MAP", "MAP.json").replace('"$OUT"', "OUT")
                                .replace("$OUT", "OUT"))
            cmds.append(words[1:])  # without "python"
    return cmds


class Parsed(Exception):
    pass


def parse_only(argv: list[str], monkeypatch) -> argparse.Namespace:
    """Run the command's main() up to its parse_args, with its argv; returns the parsed namespace."""
    real = argparse.ArgumentParser.parse_args

    def stop(self, args=None, namespace=None):
        raise Parsed(real(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop)
    monkeypatch.setattr(sys, "argv", [argv[0]] + argv[1:])
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    with pytest.raises(Parsed) as got:
        if argv[0] == "-m":
            monkeypatch.setattr(sys, "argv", [argv[1]] + argv[2:])
            runpy.run_module(argv[1], run_name="__main__")
        else:
            runpy.run_path(str(ROOT / argv[0]), run_name="__main__")
    return got.value.args[0]


def test_the_script_holds_the_owed_commands():
    scripts = {c[0] if c[0] != "-m" else c[1] for c in owed_commands()}
    assert {"benchmarks/policy_ab.py", "benchmarks/step_ab.py", "benchmarks/record_table.py",
            "benchmarks/tile_room_ab.py", "benchmarks/tc_ablations/progressive_ksplit.py", "gearshift"} <= scripts


@pytest.mark.parametrize("argv", owed_commands(), ids=lambda c: " ".join(c)[:60])
def test_each_owed_command_parses_and_names_known_switches(argv, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    ns = parse_only(argv, monkeypatch)
    if argv[0] == "benchmarks/policy_ab.py":
        from kernel_bench import kernel_switches

        kernel_switches(ns.set_a)
        kernel_switches(ns.set_b)
    if argv[0] == "benchmarks/step_ab.py":
        from step_ab import parse_sides

        parse_sides(ns.side)
