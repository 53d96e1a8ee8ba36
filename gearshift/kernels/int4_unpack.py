"""Int4 nibbles to exact floats without integer-to-float conversions.

`I2F` runs at 16 results per clock per SM on Hopper, while a memory-bound int4 GEMV must turn
about 26 weights per clock per SM into floats: converting with `.to(tl.float32)` caps such a
kernel at ~60% of the weight-read floor. Instead the nibble is OR-ed into the mantissa of 1.0
(one LOP3) and the float is rescaled with one FMA that also subtracts the implicit 1:
bits(1.0) | (q << b) reads as 1 + q*2^(b-23), and fma(f, 2^(23-b), -2^(23-b)) = q exactly.
Words are int32 holding 8 nibbles; nibble i is column 8*word + i of the store (the byte layout
of `Int4Weight`: column 2j in the low nibble of byte j, read little-endian).
"""

from __future__ import annotations

from gearshift.kernels._triton import HAS_TRITON, tl, triton


def _dequant_asm(cvt: str) -> str:
    """PTX for one pack of 4 weights: $2 holds bytes (b0, b0, b1, b1) (each code byte twice, see
    `dequant_tile`), $3..$6 the rows' scales, $7..$10 their offset mins (fp32). Each nibble lands in
    bits 16..19 of fp32 128.0 (one shift, one LOP3; 128 + q exactly), one FFMA makes
    (128 + q) * s + (m - 128 s), one cvt packs two results: 3.25 instructions per weight."""
    return f"""{{ .reg .b32 f0, f1, f2, f3, base;
    mov.b32 base, 0x43000000;
    shl.b32 f0, $2, 16; lop3.b32 f0, f0, 0x000F0000, base, 0xEA;
    shl.b32 f1, $2, 12; lop3.b32 f1, f1, 0x000F0000, base, 0xEA;
    lop3.b32 f2, $2, 0x000F0000, base, 0xEA;
    shr.b32 f3, $2, 4; lop3.b32 f3, f3, 0x000F0000, base, 0xEA;
    fma.rn.f32 f0, f0, $3, $7; fma.rn.f32 f1, f1, $4, $8;
    fma.rn.f32 f2, f2, $5, $9; fma.rn.f32 f3, f3, $6, $10;
    {cvt} $0, f1, f0; {cvt} $1, f3, f2; }}"""


CODES_ASM = """{ .reg .b32 u;
    shr.b32 u, $1, 4; prmt.b32 $0, $1, u, 0x7250; and.b32 $0, $0, 0x0F0F0F0F; }"""


if HAS_TRITON:

    @triton.jit
    def word_bases(w, one_bits):
        """Two mantissa carriers per word: nibbles 0..4 in bits 0..19 of `lo`, nibbles 5..7 in
        bits 8..19 of `hi`, each OR-ed with bits(1.0). `one_bits` is 0x3F800000 passed as a kernel
        argument: as a literal, LLVM folds the two ANDs below into one two-constant LOP3 and ptxas
        then re-materializes a constant register for every weight."""
        lo = (w & 0xFFFFF) | one_bits
        hi = ((w >> 12) & 0xFFF00) | one_bits
        return lo, hi


    @triton.jit
    def nibble_f32(lo, hi, I: tl.constexpr):
        """Nibble I (0..7) as an exact fp32 in 0..15, from `word_bases`: one AND, one FMA."""
        if I < 5:
            src = lo
            B: tl.constexpr = 4 * I
        else:
            src = hi
            B: tl.constexpr = 4 * I - 12
        GAIN: tl.constexpr = float(1 << (23 - B))
        f = (src & (0x3F800000 | (0xF << B))).to(tl.float32, bitcast=True)
        return f * GAIN - GAIN


    ONE_BITS = 0x3F800000


    @triton.jit
    def split8(v, R: tl.constexpr, C: tl.constexpr):
        """[R, C*8] -> eight [R, C] tensors, column 8c + i into tensor i (nibble order)."""
        v = tl.reshape(v, (R, C, 2, 2, 2))
        a, b = tl.split(v)  # bit 0 of i
        a0, a1 = tl.split(a)  # bit 1
        b0, b1 = tl.split(b)
        x0, x4 = tl.split(a0)  # bit 2
        x2, x6 = tl.split(a1)
        x1, x5 = tl.split(b0)
        x3, x7 = tl.split(b1)
        return x0, x1, x2, x3, x4, x5, x6, x7


    @triton.jit
    def byte_nibbles(qw, DT: tl.constexpr, EXACT: tl.constexpr):
        """uint8 codes [.., C] -> (low, high) nibbles as DT (bf16/fp16) without I2F: the nibble is
        OR-ed into the mantissa of OFFSET (128 in bf16, 1024 in fp16), giving OFFSET + q exactly;
        EXACT subtracts OFFSET (exact) for kernels that multiply the raw codes."""
        b = qw.to(tl.int16)
        if DT == tl.bfloat16:
            MAGIC: tl.constexpr = 0x4300
            OFFSET: tl.constexpr = 128.0
        else:
            MAGIC: tl.constexpr = 0x6400
            OFFSET: tl.constexpr = 1024.0
        lo = ((b & 0xF) | MAGIC).to(DT, bitcast=True)
        hi = ((b >> 4) | MAGIC).to(DT, bitcast=True)
        if EXACT:
            lo = (lo - OFFSET).to(DT)
            hi = (hi - OFFSET).to(DT)
        return lo, hi


    @triton.jit
    def offset_min(sc, mn, DT: tl.constexpr):
        """mn - OFFSET * sc (fp32): with codes from `byte_nibbles(.., EXACT=False)`,
        w = (OFFSET + q) * sc + offset_min = q * sc + mn, one FMA per weight."""
        if DT == tl.bfloat16:
            return mn - 128.0 * sc
        return mn - 1024.0 * sc

    DEQUANT_ASM_BF16 = tl.constexpr(_dequant_asm("cvt.rn.bf16x2.f32"))
    DEQUANT_ASM_F16 = tl.constexpr(_dequant_asm("cvt.rn.f16x2.f32"))
    DEQUANT_CONSTRAINTS = tl.constexpr("=r,=r,r,r,r,r,r,r,r,r,r")

    @triton.jit
    def dequant_tile(qw, sc, c, BN: tl.constexpr, BK: tl.constexpr, DT: tl.constexpr, ASM: tl.constexpr):
        """uint8 codes [BN, BK/2] -> DT weights [BN, BK] in column order, w = q * sc + mn with
        c = mn - 128 * sc (fp32 per row), rounded once. ASM (on the GPU) does it in packed PTX:
        Triton's own u8 -> float lowering costs ~9 SASS instructions per weight (byte PRMTs, moves,
        a conversion, an FMA, a repack), which with one warp per scheduler made the mid-M
        dequant-first loop issue-bound. Without ASM (the interpreter) the same math runs in
        Triton ops."""
        if ASM:
            # each byte twice: a pack of 4 elements is one byte's two output columns, twice
            qd = tl.join(qw, qw)
            s3 = tl.broadcast_to(sc[:, None, None], (BN, BK // 2, 2))
            c3 = tl.broadcast_to(c[:, None, None], (BN, BK // 2, 2))
            if DT == tl.bfloat16:
                w = tl.inline_asm_elementwise(DEQUANT_ASM_BF16, DEQUANT_CONSTRAINTS, [qd, s3, c3],
                                              dtype=tl.bfloat16, is_pure=True, pack=4)
            else:
                w = tl.inline_asm_elementwise(DEQUANT_ASM_F16, DEQUANT_CONSTRAINTS, [qd, s3, c3],
                                              dtype=tl.float16, is_pure=True, pack=4)
        else:  # Triton ops (I2F; bf16 bitcasts do not survive the interpreter), the same FMA and rounding
            q = tl.join(qw & 0xF, qw >> 4).to(tl.float32) + 128.0
            w = (q * sc[:, None, None] + c[:, None, None]).to(DT)
        return tl.reshape(w, (BN, BK))

    CODES_ASM_C = tl.constexpr(CODES_ASM)

    @triton.jit
    def code_bytes(qw, BN: tl.constexpr, BK: tl.constexpr, ASM: tl.constexpr):
        """uint8 codes [BN, BK/2] -> one byte per code [BN, BK] (0..15, column order), the operand
        of the int8 and fp8 MMAs. ASM: a pack of 4 is bytes (b0, b0, b1, b1) -> (lo b0, hi b0,
        lo b1, hi b1) with SHR, PRMT, AND: 0.75 instructions per code."""
        if ASM:
            qd = tl.join(qw, qw)
            c = tl.inline_asm_elementwise(CODES_ASM_C, "=r,r", [qd], dtype=tl.uint8, is_pure=True, pack=4)
        else:
            c = tl.join(qw & 0xF, qw >> 4)
        return tl.reshape(c, (BN, BK))


def nibble_reference(words, i: int):
    """Torch reference of `nibble_f32`: nibble i of int32 words as float32."""
    return ((words >> (4 * i)) & 0xF).float()
