"""`Double.toString(double)` as Java 17 writes it, the digits of every double Debezium's
JsonConverter (Jackson's `writeNumber(double)`) and SimpleHeaderConverter write.

Java 17 is the runtime Debezium 3.6 runs on (its minimum). Its digits come from
`jdk.internal.math.FloatingDecimal` (JDK 17), which is NOT the shortest round trip Python's
`repr` writes, in three ways observed against the JVM:

- an integer-valued double in [2^53, 2^63) is written from its exact integer value, its last
  0-2 digits rounded off (half up) as "insignificant" for its exponent:
  2.82879384806159E17 -> `2.82879384806159008E17`;
- otherwise digits are generated one by one (Steele & White's free-format method) until the
  remainder is within half an ULP of either neighbour, with the interval taken as symmetric
  (and halved below a power of two): the digits are sometimes one longer than the shortest,
  or not the closest (1.0E23 -> `9.999999999999999E22`, 7.0E22 -> `7.0000000000000004E22`);
- in E-notation at least two digits are generated (5e-324 -> `4.9E-324`).

Java 19+ replaced this with a shortest-digits algorithm (JDK-4511638); a Debezium on Java 21
writes those values differently, as Python's `repr` does.

Layout: zero, `-0.0`, `NaN`, `Infinity`; plain decimal with at least one fraction digit for
10^-3 <= |v| < 10^7; else `d.dddE[-]n`.
"""

from __future__ import annotations

import math
import struct

_EXP_SHIFT = 52  # bits of the stored significand
_HIDDEN_BIT = 1 << _EXP_SHIFT


def java_double(value: float) -> str:
    """`Double.toString(value)` on Java 17 (module docstring)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return sign + "0.0"
    digits, point = _digits(abs(value))
    return sign + _layout(digits, point)


def _digits(value: float) -> tuple[str, int]:
    """(digits, point): value ~ 0.<digits> x 10^point, as FloatingDecimal develops them."""
    bits = struct.unpack(">Q", struct.pack(">d", value))[0]
    fraction = bits & (_HIDDEN_BIT - 1)
    biased = bits >> _EXP_SHIFT
    if biased == 0:  # subnormal: normalise so the leading 1 sits at bit 52
        shift = _EXP_SHIFT + 1 - fraction.bit_length()
        fraction <<= shift
        bin_exp = 1 - shift - 1023
        significant_bits = 64 - (64 - (fraction >> shift).bit_length())
    else:
        fraction |= _HIDDEN_BIT
        bin_exp = biased - 1023
        significant_bits = _EXP_SHIFT + 1
    tail_zeros = (fraction & -fraction).bit_length() - 1
    fract_bits = _EXP_SHIFT + 1 - tail_zeros  # bits that matter in the significand
    tiny_bits = max(0, fract_bits - bin_exp - 1)  # of them, right of the binary point

    if tiny_bits == 0 and -21 <= bin_exp <= 62 and fract_bits < 64:
        # An integer below 2^63: its exact digits, less the ones its exponent makes noise.
        whole = fraction << (bin_exp - _EXP_SHIFT) if bin_exp >= _EXP_SHIFT else fraction >> (_EXP_SHIFT - bin_exp)
        noise = _noise_digits(bin_exp - significant_bits - 1) if bin_exp > significant_bits else 0
        if noise:
            whole, rest = divmod(whole, 10**noise)
            if rest >= 10**noise // 2:
                whole += 1
        text = str(whole)
        kept = text.rstrip("0")
        return kept, len(text) + noise

    dec_exp = _estimate_dec_exp(fraction, bin_exp)
    b5 = max(0, -dec_exp)
    b2 = b5 + tiny_bits + bin_exp
    s5 = max(0, dec_exp)
    s2 = s5 + tiny_bits
    m5, m2 = b5, b2 - significant_bits
    mantissa = fraction >> tail_zeros
    b2 -= fract_bits - 1
    common = min(b2, s2)
    b2, s2, m2 = b2 - common, s2 - common, m2 - common
    if fract_bits == 1:  # a power of two: the gap below is half the gap above; taken on both sides
        m2 -= 1
    if m2 < 0:
        b2, s2, m2 = b2 - m2, s2 - m2, 0
    b = mantissa * 5**b5 << b2
    s = 5**s5 << s2
    m = 5**m5 << m2
    tens = s * 10
    b_bits = fract_bits + b2 + (_N_5_BITS[b5] if b5 < len(_N_5_BITS) else b5 * 3)
    ten_s_bits = s2 + 1 + (_N_5_BITS[s5 + 1] if s5 + 1 < len(_N_5_BITS) else (s5 + 1) * 3)
    if b_bits < 64 and ten_s_bits < 64:
        # FloatingDecimal's int / long arithmetic: `high` is strict, and m and the sums wrap.
        width = 32 if b_bits < 32 and ten_s_bits < 32 else 64
        return _generate(b, s, m, tens, dec_exp, width)
    return _generate(b, s, m, tens, dec_exp, 0)


def _wrap(x: int, width: int) -> int:
    """x as a Java int (width 32) or long (64) holds it; width 0: exact."""
    if not width:
        return x
    x &= (1 << width) - 1
    return x - (1 << width) if x >> (width - 1) else x


def _generate(b: int, s: int, m: int, tens: int, dec_exp: int, width: int) -> tuple[str, int]:
    """Digits of b/s while the remainder is farther than m from both neighbours (width 0:
    FDBigInteger arithmetic, where `high` includes equality; else int/long arithmetic)."""

    def bounds(b: int, m: int) -> tuple[bool, bool]:
        if width and m <= 0:  # the multiplier overflowed: FloatingDecimal stops here
            return True, True
        low = b < m
        high = (b + m >= tens) if not width else (_wrap(b + m, width) > tens)
        return low, high

    digits: list[int] = []
    q, b = divmod(b, s)
    b, m = b * 10, _wrap(m * 10, width)
    low = b < m
    high = (b + m >= tens) if not width else (_wrap(b + m, width) > tens)
    if q == 0 and not high:
        dec_exp -= 1  # the estimate was one too high: drop the leading zero
    else:
        digits.append(q)
    if dec_exp < -3 or dec_exp >= 8:  # E-notation: at least two digits
        low = high = False
    while not low and not high:
        q, b = divmod(b, s)
        b, m = b * 10, _wrap(m * 10, width)
        low, high = bounds(b, m)
        digits.append(q)
    point = dec_exp + 1
    if high and (not low or _round_up_tie(b, tens, width, digits[-1])):
        digits, point = _round_up(digits, point)
    return "".join(map(str, digits)), point


def _round_up_tie(b: int, tens: int, width: int, last: int) -> bool:
    """Both neighbours in reach: the nearer wins, a tie goes to an even last digit."""
    diff = _wrap((b << 1) - tens, width) if width else (b << 1) - tens
    return diff > 0 or (diff == 0 and last % 2 == 1)


def _round_up(digits: list[int], point: int) -> tuple[list[int], int]:
    i = len(digits) - 1
    while i > 0 and digits[i] == 9:
        digits[i] = 0
        i -= 1
    if digits[i] == 9:  # carried out of the first digit: 1 followed by the zeros, one place up
        digits[0] = 1
        return digits, point + 1
    digits[i] += 1
    return digits, point


def _estimate_dec_exp(fraction: int, bin_exp: int) -> int:
    """floor(log10(value)) as FloatingDecimal estimates it (in doubles, the same ones)."""
    d2 = struct.unpack(">d", struct.pack(">Q", (1023 << _EXP_SHIFT) | (fraction & (_HIDDEN_BIT - 1))))[0]
    d = (d2 - 1.5) * 0.289529654 + 0.176091259 + float(bin_exp) * 0.301029995663981
    return math.floor(d)


def _noise_digits(p2: int) -> int:
    """Decimal digits of 2^p2 less one, for 1 < p2 <= 64 (FloatingDecimal's table), else 0."""
    return len(str(1 << p2)) - 1 if 1 < p2 <= 64 else 0


# ceil(log2(5^i)) for i < 27, FloatingDecimal's estimate of when int/long arithmetic suffices
_N_5_BITS = [0, 3, 5, 7, 10, 12, 14, 17, 19, 21, 24, 26, 28, 31, 33, 35, 38, 40, 42, 45, 47, 49, 52, 54, 56, 59, 61]


def _layout(digits: str, point: int) -> str:
    if 0 < point < 8:
        whole = digits[:point]
        if len(whole) < point:
            return whole + "0" * (point - len(whole)) + ".0"
        return whole + "." + (digits[point:] or "0")
    if -3 < point <= 0:
        return "0." + "0" * -point + digits
    exponent = point - 1
    return f"{digits[0]}.{digits[1:] or '0'}E{exponent}"
