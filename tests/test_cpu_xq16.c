/*
 * tests/test_cpu_xq16.c — the quantized GEMV's rounding of x to int16 (and
 * to int8, act_int8, by block or by group of 8 blocks), vector code against
 * the scalar code it replaced: the same levels, scales and sums
 * bit for bit, on blocks of every kind a forward pass can produce (wide and
 * narrow ranges, zeros, subnormals, values near FLT_MAX, one non-zero lane)
 * and on blocks holding a NaN or an infinity. Built from gpu/cpu_fast.c itself,
 * whose block functions are static.
 */
#include "../gpu/cpu_fast.c"

#include "check.h"

#include <float.h>
#include <stdint.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint32_t next_u32(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 16);
}

/* uniform in [-1, 1) */
static float unit(void)
{
	return (float)((int32_t)next_u32()) / 2147483648.0f;
}

/* Block kind k of NKIND into xb. */
enum { NKIND = 9 };
static void fill(int k, float *xb)
{
	const float scales[] = { 1.0f, 1e-3f, 1e3f, 1e-38f, 1e-42f, 1e37f };
	for (int j = 0; j < KVT_QBLOCK; j++) {
		switch (k) {
		case 0: case 1: case 2: case 3: case 4: case 5:
			xb[j] = unit() * scales[k];
			break;
		case 6: /* a wide spread inside one block */
			xb[j] = unit() * ldexpf(1.0f, (int)(next_u32() % 60) - 30);
			break;
		case 7: /* zeros, and one lane set */
			xb[j] = 0.0f;
			break;
		default: /* the largest values fp32 holds */
			xb[j] = (next_u32() & 1 ? -1.0f : 1.0f) * (FLT_MAX - (float)(next_u32() % 1000) * 1e30f);
			break;
		}
	}
	if (k == 7 && next_u32() % 4)
		xb[next_u32() % KVT_QBLOCK] = unit() * 3.0f;
}

/*
 * The int8 rounding (act_int8) of nblk blocks at xg as one group (1, or 8 as
 * for the K-quants), vector against scalar: levels, scales and sums; 1 if
 * they agree bit for bit.
 */
static int same8(const float *xg, int nblk)
{
	int8_t qv[8 * KVT_QBLOCK], qs[8 * KVT_QBLOCK];
	float sv[8], ss[8], mv[8], ms[8];
	memset(qv, 0x55, sizeof(qv));
	memset(qs, 0xaa, sizeof(qs));
	xq8_group(xg, nblk, qv, sv, mv);
	xq8_group_scalar(xg, nblk, qs, ss, ms);
	return !memcmp(qv, qs, (size_t)nblk * KVT_QBLOCK) && !memcmp(sv, ss, 4 * (size_t)nblk) &&
	       !memcmp(mv, ms, 4 * (size_t)nblk);
}

/* Both quantizers on xb; 1 if they agree bit for bit. */
static int same(const float *xb)
{
	int16_t qv[KVT_QBLOCK], qs[KVT_QBLOCK];
	float sv, ss, mv, ms;
	memset(qv, 0x55, sizeof(qv));
	memset(qs, 0xaa, sizeof(qs));
	xq16_block(xb, qv, &sv, &mv);
	xq16_block_scalar(xb, qs, &ss, &ms);
	if (memcmp(qv, qs, sizeof(qv)) || memcmp(&sv, &ss, 4) || memcmp(&mv, &ms, 4))
		return 0;
	return same8(xb, 1);
}

int main(void)
{
#ifndef KVT_HAVE_F16C
	return check_skip("test_cpu_xq16", "no F16C/FMA: the GEMV and its vector quantizer are not built");
#endif
	float xb[KVT_QBLOCK];
	int bad[NKIND + 1] = { 0 };
	for (int k = 0; k < NKIND; k++)
		for (int trial = 0; trial < 20000; trial++) {
			fill(k, xb);
			bad[k] += !same(xb);
		}
	/* a NaN or an infinity in any lane of a block of any kind */
	const float odd[] = { NAN, -NAN, INFINITY, -INFINITY };
	for (int trial = 0; trial < 4000; trial++) {
		fill((int)(next_u32() % NKIND), xb);
		xb[next_u32() % KVT_QBLOCK] = odd[trial % 4];
		bad[NKIND] += !same(xb);
	}
	for (int k = 0; k <= NKIND; k++)
		CHECKF(bad[k] == 0, "block kind %d: %d blocks differ from the scalar quantizer", k, bad[k]);
	/* int8 groups of 8 blocks (the K-quants' one scale per 256): blocks of mixed kinds, a NaN or infinity at times */
	float xg[8 * KVT_QBLOCK];
	int bad_groups = 0;
	for (int trial = 0; trial < 20000; trial++) {
		for (int b = 0; b < 8; b++)
			fill((int)(next_u32() % NKIND), xg + b * KVT_QBLOCK);
		if (trial % 8 == 0)
			xg[next_u32() % (8 * KVT_QBLOCK)] = odd[trial % 4];
		bad_groups += !same8(xg, 8);
	}
	CHECKF(bad_groups == 0, "%d groups of 8 blocks differ from the scalar int8 quantizer", bad_groups);
	return check_done("test_cpu_xq16");
}
