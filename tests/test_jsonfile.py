"""gearshift/jsonfile.py: plain and gzipped JSON behind one reader, and the results folder kept small."""
import gzip
import json
import os
import subprocess
from pathlib import Path

import pytest

from gearshift.jsonfile import read_json, read_text, resolve, write_text

ROOT = Path(__file__).resolve().parents[1]


def test_plain_and_gzipped_files_read_the_same(tmp_path):
    doc = {"device": "Toy GPU", "rows": [{"m": m, "us": m * 1.5} for m in range(50)]}
    text = json.dumps(doc, indent=1)
    plain = write_text(tmp_path / "r.json", text)
    packed = write_text(tmp_path / "s.json.gz", text)
    assert plain.read_text() == text and gzip.decompress(packed.read_bytes()).decode() == text
    assert read_json(plain) == read_json(packed) == doc and read_text(packed) == text
    # the same text gives the same bytes (no time stamp in the header): re-running a script changes no file
    assert write_text(tmp_path / "t.json.gz", text).read_bytes() == packed.read_bytes()


def test_a_path_to_the_plain_name_finds_the_compressed_file(tmp_path):
    write_text(tmp_path / "old.json.gz", '{"a": 1}')
    assert resolve(tmp_path / "old.json") == tmp_path / "old.json.gz"
    assert read_json(str(tmp_path / "old.json")) == {"a": 1}
    (tmp_path / "both.json").write_text('{"plain": true}')
    write_text(tmp_path / "both.json.gz", '{"plain": false}')
    assert read_json(tmp_path / "both.json") == {"plain": True}  # an existing plain file wins
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "nowhere.json")


def test_benchmark_results_over_the_limit_are_written_gzipped(tmp_path):
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    kernels_bench = pytest.importorskip("kernel_bench")
    small = kernels_bench.write_json(tmp_path, "small.json", {"x": 1})
    big_doc = {"rows": list(range(kernels_bench.GZIP_ABOVE // 4))}
    big = kernels_bench.write_json(tmp_path, "big.json", big_doc)
    assert small.name == "small.json" and read_json(small) == {"x": 1}
    assert big.name == "big.json.gz" and read_json(tmp_path / "big.json") == big_doc


def _tracked_files() -> list[Path] | None:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return [ROOT / f for f in out.decode().split("\0") if f]


def test_the_repository_stays_under_the_gpu_calls_size_cap():
    """Every GPU call carries the working tree, capped at 64 MiB: results JSON over 512 KB is kept gzipped
    (`gzip -9 FILE`; every reader takes both forms), and the tracked files stay under 48 MiB, which leaves
    room for what a call carries besides."""
    files = _tracked_files()
    if files is None:
        pytest.skip("not a git checkout")
    large = [f.relative_to(ROOT).as_posix() for f in files
             if f.suffix == ".json" and "results" in f.parts and f.exists() and f.stat().st_size > 512 * 1024]
    assert not large, f"gzip these results (gzip -9): {large}"
    total = sum(f.stat().st_size for f in files if f.exists() and not os.path.islink(f))
    assert total < 48 * 2**20, f"tracked files take {total / 2**20:.1f} MiB"
