"""Write a model folder all-or-nothing: into a hidden temporary sibling, renamed at the end."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_dir(out: Path) -> Iterator[Path]:
    """Yield a temporary folder beside `out`; it becomes `out` only if the block succeeds."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            out.rmdir()  # callers refuse non-empty outputs; an empty folder may be replaced
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
