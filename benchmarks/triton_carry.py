"""Pack a Triton release for the lent GPU machine, which has no network and ships an older Triton.

Why: the lent H100 runs torch 2.11 with Triton 3.6, whose Gluon has no CTA clusters (no TMA
multicast). A newer Triton can still be tried there: its wheel (for the machine's Python) is
unpacked here without the AMD libraries, the Blackwell tools and CUPTI, xz-compressed and split
into parts that fit one device call each (a call carries 64 MiB with the working tree). On the
machine the parts are joined into `scratch/triton/` and put first on PYTHONPATH.

    python benchmarks/triton_carry.py --version 3.9.0 --python 3.12 --part-mb 20
    # then one device call per part: carry=["scratch/triton_parts/part_aa"], command "true"; and finally
    #   cd scratch && cat triton_parts/part_* | xz -d | tar x && rm -r triton_parts
    #   export PYTHONPATH=$PWD/scratch/triton_pkg:$PWD TRITON_DEFAULT_FP_FUSION=1

Stop 38 did this with 3.9.0 for Python 3.12 (97 MB in parts of 26, later 20 MB: a call carries the
working tree too, about 40 MB by then; the machine's Python is 3.12 although this one's is 3.11): `tests/test_w4a8_progressive.py` and `tests/test_w4a8_wgmma.py`
passed there under 3.9. The machine is handed back after 30 s idle and forgets the parts, so the
calls must follow each other closely.

Stop 39: with `benchmarks/results/` (34 MB) moved out of the checkout for those calls, two calls carry
all parts (40 and 57 MiB next to a 5 MB tree). A machine is held at most 30 minutes, and Triton 3.9
compiles the Gluon kernels slowly (a seeded W4A16 profile's first points took 100 s each): give long
profiles a `timeout` below the call's limit and continue them in the next call with
`gearshift profile ... --resume`.
"""
from __future__ import annotations

import argparse
import glob
import io
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

#: wheel members the machine does not need (AMD codegen, Blackwell tools, profilers)
SKIP = ("triton/backends/nvidia/bin/ptxas-blackwell", "triton/backends/nvidia/lib/cupti",
        "triton/_C/libproton", "triton/instrumentation/", "triton/profiler")


def keep(name: str) -> bool:
    """AMD's Python files stay: backend discovery imports every backend the entry points name."""
    if name.startswith("triton/backends/amd/"):
        return not name.endswith(".so")
    return not name.startswith(SKIP)


def download(version: str, python: str, dest: str) -> str:
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
                    python, "--platform", "manylinux_2_28_x86_64", f"triton=={version}", "-d", dest], check=True)
    return glob.glob(os.path.join(dest, f"triton-{version}-*.whl"))[0]


def pack(wheel: str, out_dir: str, part_mb: int) -> list[str]:
    """The kept members as one tar.xz under `triton_pkg/`, split into parts of part_mb MB."""
    buf = io.BytesIO()
    with zipfile.ZipFile(wheel) as z, lzma.open(buf, "wb", preset=8) as xz, tarfile.open(fileobj=xz, mode="w") as tar:
        for info in z.infolist():
            if info.is_dir() or not keep(info.filename):
                continue
            data = z.read(info)
            ti = tarfile.TarInfo("triton_pkg/" + info.filename)
            ti.size = len(data)
            ti.mode = 0o755 if "/bin/" in info.filename else 0o644
            tar.addfile(ti, io.BytesIO(data))
        # Triton 3.9 looks for ptxas-blackwell even on sm_90
        link = tarfile.TarInfo("triton_pkg/triton/backends/nvidia/bin/ptxas-blackwell")
        link.type, link.linkname = tarfile.SYMTYPE, "ptxas"
        tar.addfile(link)
    blob = buf.getvalue()
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    size = part_mb * 2 ** 20
    parts = []
    for i in range(0, len(blob), size):
        path = os.path.join(out_dir, "part_a" + chr(ord("a") + i // size))
        with open(path, "wb") as f:
            f.write(blob[i:i + size])
        parts.append(path)
    return parts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", default="3.9.0", help="Triton release")
    ap.add_argument("--python", default="3.12", help="the GPU machine's Python (python -V there)")
    ap.add_argument("--part-mb", type=int, default=20, help="MiB per part: at most 64 MiB minus the working tree")
    ap.add_argument("--out", default="scratch/triton_parts", help="where the parts go (an ignored folder)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        parts = pack(download(args.version, args.python, tmp), args.out, args.part_mb)
    for p in parts:
        print(p, os.path.getsize(p) // 2 ** 20, "MB")


if __name__ == "__main__":
    main()
