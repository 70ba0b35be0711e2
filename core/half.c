/*
 * core/half.c — IEEE binary16 <-> binary32 conversion in plain C.
 *
 * Bit-exact and portable (no F16C needed), so the CPU reference backend, the
 * GGUF reader and the codecs agree on every platform. Round-to-nearest-even on
 * the way down, including subnormals, overflow to infinity and NaN kept NaN.
 */
#include "kvt.h"

#include <string.h>

float kvt_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t man = h & 0x3ff;
	uint32_t bits;
	float f;

	if (exp == 0x1f) {
		bits = sign | 0x7f800000u | (man << 13); /* inf / NaN */
	} else if (exp != 0) {
		bits = sign | ((exp + 112) << 23) | (man << 13);
	} else if (man == 0) {
		bits = sign; /* signed zero */
	} else {
		/* subnormal: normalise the mantissa */
		exp = 113;
		while (!(man & 0x400)) {
			man <<= 1;
			exp--;
		}
		bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
	}
	memcpy(&f, &bits, 4);
	return f;
}

uint16_t kvt_f32_to_f16(float f)
{
	uint32_t x;
	memcpy(&x, &f, 4);
	uint32_t sign = (x >> 16) & 0x8000;
	uint32_t absx = x & 0x7fffffffu;

	if (absx >= 0x7f800000u) /* inf or NaN (keep a quiet NaN) */
		return (uint16_t)(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 | ((absx >> 13) & 0x3ff) : 0));
	if (absx >= 0x477ff000u) /* rounds to >= 65520: overflow */
		return (uint16_t)(sign | 0x7c00);
	if (absx < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
		if (absx < 0x33000000u) /* < 2^-25: rounds to zero */
			return (uint16_t)sign;
		uint32_t e = absx >> 23;
		uint32_t m = (absx & 0x7fffff) | 0x800000;
		uint32_t shift = 126 - e; /* 14..24 */
		uint32_t r = m >> shift;
		uint32_t rem = m & ((1u << shift) - 1);
		uint32_t half = 1u << (shift - 1);
		if (rem > half || (rem == half && (r & 1)))
			r++;
		return (uint16_t)(sign | r);
	}
	/* normal: rebias exponent, round mantissa to 10 bits, nearest even */
	uint32_t r = ((absx - 0x38000000u) >> 13);
	uint32_t rem = absx & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (r & 1)))
		r++;
	return (uint16_t)(sign | r);
}
