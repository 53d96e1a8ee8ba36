"""A warp of the fragment kernel's inline PTX, run on the CPU (imported by name, like `hopper.py`).

The block asm of `kernels/int4_mma_gemv.py` is straight-line code that every lane of a warp runs
with its own operands, and whose `mma.sync` gathers operand fragments from all 32 lanes. The Triton
interpreter cannot run inline PTX, so this runs it: each instruction for 32 lanes at once, on 32-bit
registers, with `mma.sync` laid out as the PTX ISA's fragment tables say (m16n8k16 bf16 / f16 into
f32, m16n8k32 s8 into s32) and loads from per-lane addresses into small memories. Only the
instructions these blocks use are known; any other one raises, so a new instruction in the asm fails
the tests instead of being skipped. MMA sums are taken in float64 and rounded to fp32, so they agree
with the GPU's to fp32 rounding, not bit for bit.
"""
from __future__ import annotations

import re

import numpy as np

LANES = 32
_LANE = np.arange(LANES)
GROUP, THREAD = _LANE // 4, _LANE % 4  # the PTX ISA's groupID and threadID_in_group


class Memory:
    """Bytes at addresses from `base` on; loads of 16 bytes per lane."""

    def __init__(self, data: np.ndarray, base: int):
        self.data, self.base = np.ascontiguousarray(data).view(np.uint8).reshape(-1), base

    def words(self, addr: np.ndarray, n: int) -> list[np.ndarray]:
        out = []
        for i in range(n):
            off = addr.astype(np.int64) - self.base + 4 * i
            if (off < 0).any() or (off + 4 > self.data.size).any():
                raise IndexError("a load outside the memory")
            b = self.data[off[:, None] + np.arange(4)[None, :]].astype(np.uint32)
            out.append(b[:, 0] | b[:, 1] << 8 | b[:, 2] << 16 | b[:, 3] << 24)
        return out


def _halves(reg: np.ndarray, dt: str) -> np.ndarray:
    """[32, 2] float64 of the two 16-bit values of each lane's register, low half first."""
    lo, hi = reg & 0xFFFF, reg >> 16
    pair = np.stack([lo, hi], axis=1).astype(np.uint16)
    if dt == "bf16":
        return (pair.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return pair.view(np.float16).astype(np.float64)


def _bytes(reg: np.ndarray) -> np.ndarray:
    """[32, 4] int64 of the four signed bytes of each lane's register, low byte first."""
    b = np.stack([(reg >> (8 * i)) & 0xFF for i in range(4)], axis=1).astype(np.int64)
    return np.where(b > 127, b - 256, b)


def _mma(dt: str, a: list[np.ndarray], b: list[np.ndarray], c: list[np.ndarray]) -> list[np.ndarray]:
    """D = A B + C for one warp: m16n8k16 (bf16 / f16 -> f32) or m16n8k32 (s8 -> s32)."""
    if dt == "s8":
        kk, per = 32, 4
        av = [_bytes(r) for r in a]
        bv = [_bytes(r) for r in b]
    else:
        kk, per = 16, 2
        av = [_halves(r, dt) for r in a]
        bv = [_halves(r, dt) for r in b]
    A = np.zeros((16, kk))
    B = np.zeros((kk, 8))
    for reg in range(4):  # a0: row g, a1: row g + 8, a2: row g (k + kk/2), a3: row g + 8 (k + kk/2)
        rows = GROUP + 8 * (reg % 2)
        for e in range(per):
            A[rows, THREAD * per + e + (kk // 2) * (reg // 2)] = av[reg][:, e]
    for reg in range(2):  # b0: k 0.., b1: k kk/2.., column g
        for e in range(per):
            B[THREAD * per + e + (kk // 2) * reg, GROUP] = bv[reg][:, e]
    D = A @ B
    out = []
    for i in range(4):  # d0, d1: row g, columns 2t, 2t + 1; d2, d3: row g + 8
        rows, cols = GROUP + 8 * (i // 2), 2 * THREAD + i % 2
        if dt == "s8":
            acc = c[i].view(np.int32).astype(np.int64) + D[rows, cols].astype(np.int64)
            out.append((acc & 0xFFFFFFFF).astype(np.uint32))
        else:
            acc = c[i].view(np.float32).astype(np.float64) + D[rows, cols]
            out.append(acc.astype(np.float32).view(np.uint32))
    return out


def _imm(tok: str) -> int | None:
    if re.fullmatch(r"0[fF][0-9a-fA-F]{8}", tok):
        return int(tok[2:], 16)
    if re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", tok):
        return int(tok, 0) & 0xFFFFFFFF
    return None


def run(asm: str, operands: dict[int, np.ndarray], memories: dict[str, Memory], n_out: int) -> list[np.ndarray]:
    """Run `asm` for one warp: operands $i (i >= n_out) as [32] integer arrays (addresses as int64),
    `memories` "global" / "shared". Returns the outputs $0 .. $(n_out - 1) as [32] uint32 arrays."""
    regs: dict[str, np.ndarray] = {f"${i}": np.asarray(v) for i, v in operands.items()}

    def val(tok: str) -> np.ndarray:
        tok = tok.strip()
        imm = _imm(tok)
        if imm is not None:
            return np.full(LANES, imm, dtype=np.uint32)
        return regs[tok]

    def put(dst: str, v) -> None:
        regs[dst.strip()] = np.asarray(v).astype(np.uint32, copy=False)

    def reglist(s: str) -> list[str]:
        return [r.strip() for r in s.strip().strip("{}").split(",")]

    for raw in asm.split("\n"):
        line = raw.strip().rstrip(";").strip()
        if not line or line in ("{", "}") or line.startswith(".reg"):
            continue
        op, _, rest = line.partition(" ")
        if op.startswith("mma.sync.aligned."):
            dt = "s8" if ".s8." in op else ("bf16" if ".bf16." in op else "f16")
            d, a, b, c = (reglist(g) for g in re.findall(r"\{[^}]*\}", rest))
            for name, v in zip(d, _mma(dt, [val(r) for r in a], [val(r) for r in b], [val(r) for r in c])):
                put(name, v)
            continue
        if op in ("ld.global.v4.b32", "ld.shared.v4.b32"):
            m = re.fullmatch(r"(\{[^}]*\}),\s*\[(\$\d+)(?:\+(\d+))?\]", rest.strip())
            dst, ptr, off = reglist(m.group(1)), m.group(2), int(m.group(3) or 0)
            mem = memories["global" if op.startswith("ld.global") else "shared"]
            for name, v in zip(dst, mem.words(regs[ptr].astype(np.int64) + off, 4)):
                put(name, v)
            continue
        args = [t.strip() for t in rest.split(",")]
        if op in ("mov.b32", "mov.f32", "mov.s32"):
            put(args[0], val(args[1]))
        elif op == "shr.b32":
            put(args[0], val(args[1]) >> np.uint32(_imm(args[2])))
        elif op == "and.b32":
            put(args[0], val(args[1]) & val(args[2]))
        elif op == "or.b32":
            put(args[0], val(args[1]) | val(args[2]))
        elif op == "lop3.b32":
            a, b, c, lut = val(args[1]), val(args[2]), val(args[3]), _imm(args[4])
            r = np.zeros(LANES, dtype=np.uint32)
            for i in range(8):  # bit i of the LUT: the result where (a, b, c) = (i >> 2, i >> 1, i) & 1
                if lut >> i & 1:
                    r |= ((a if i & 4 else ~a) & (b if i & 2 else ~b) & (c if i & 1 else ~c))
            put(args[0], r)
        elif op == "prmt.b32":
            a, b, sel = val(args[1]), val(args[2]), _imm(args[3])
            src = np.stack([(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)])
            r = np.zeros(LANES, dtype=np.uint32)
            for i in range(4):
                s = (sel >> (4 * i)) & 0xF
                byte = src[s & 7]
                if s & 8:
                    byte = np.where(byte & 0x80, 0xFF, 0).astype(np.uint32)
                r |= byte << np.uint32(8 * i)
            put(args[0], r)
        elif op == "add.f32":
            put(args[0], (val(args[1]).view(np.float32) + val(args[2]).view(np.float32)).view(np.uint32))
        elif op == "cvt.rn.f32.s32":
            put(args[0], val(args[1]).view(np.int32).astype(np.float32).view(np.uint32))
        else:
            raise NotImplementedError(f"ptx_warp does not know {op!r}")
    return [regs[f"${i}"] for i in range(n_out)]
