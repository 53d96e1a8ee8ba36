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


def nibble_reference(words, i: int):
    """Torch reference of `nibble_f32`: nibble i of int32 words as float32."""
    return ((words >> (4 * i)) & 0xF).float()
