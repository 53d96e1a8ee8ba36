"""JSON files that may be kept gzipped.

Benchmark results and profiled policy maps with every candidate's timing run to megabytes of indented
JSON. The repository keeps the large ones as `NAME.json.gz` (the working tree that travels to the lent
GPU is capped at 64 MiB), so every reader opens either form, and a path to `NAME.json` that is no longer
there finds `NAME.json.gz` beside it: commands written down before a file was compressed keep working.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path


def resolve(path: str | os.PathLike) -> Path:
    """The file a path names: itself, or `<path>.gz` where only the compressed copy exists."""
    p = Path(path)
    if not p.exists() and p.suffix != ".gz":
        gz = p.with_name(p.name + ".gz")
        if gz.exists():
            return gz
    return p


def read_text(path: str | os.PathLike) -> str:
    """The file's text, decompressed where it ends in `.gz` (OSError where it cannot be read)."""
    p = resolve(path)
    if p.suffix == ".gz":
        with gzip.open(p, "rt", encoding="utf-8") as f:
            return f.read()
    return p.read_text(encoding="utf-8")


def read_json(path: str | os.PathLike):
    """The JSON document in a plain or gzipped file."""
    return json.loads(read_text(path))


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write text, gzipped where the path ends in `.gz` (fixed mtime, so the same text gives the same bytes)."""
    p = Path(path)
    if p.suffix == ".gz":
        with open(p, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as f:
            f.write(text.encode("utf-8"))
    else:
        p.write_text(text, encoding="utf-8")
    return p
