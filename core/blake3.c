/*
 * core/blake3.c — BLAKE3, the hash mode (see blake3.h).
 *
 * The input is cut into 1 KiB chunks; a chunk is 16 compressions of 64-byte
 * blocks chained from the IV, with the chunk's index as the counter and
 * CHUNK_START / CHUNK_END on its first and last block. Chunk chaining values
 * (CVs) are joined pairwise by PARENT compressions into a binary tree whose
 * left subtree always holds the largest power of two of chunks that is
 * fewer than the whole; the last compression (the root parent, or the only
 * chunk's last block) carries ROOT, and its first 8 output words are the hash.
 *
 * Here the length is known up front, so the tree is built with the usual
 * stack of CVs: after each completed subtree before the last chunk, its CV is
 * pushed and merged with the stack's top while the number of chunks so far
 * is even at that level; the last chunk's CV is then folded into the stack
 * from the top, the final fold with ROOT. A stack entry is a completed
 * subtree of 2^level chunks, so at most 64 levels.
 *
 * With SIMD (AVX2, eight inputs a step, one per 32-bit lane: state and
 * message words transposed), the chunks go as the largest complete subtree
 * that starts at the current chunk (aligned to its size, up to 1,024 chunks,
 * with more input after it): its chunks eight at a time, then its parents a
 * level at a time, eight at a time too (a scalar parent per chunk took a
 * third of the time). A subtree of fewer than eight chunks goes chunk by
 * chunk, as the portable path does for everything: both build the same tree.
 */
#include "blake3.h"

#include <string.h>

#define CHUNK_LEN 1024
#define BLOCK_LEN 64

enum { CHUNK_START = 1, CHUNK_END = 2, PARENT = 4, ROOT = 8 };

static const uint32_t IV[8] = { 0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A,
				0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19 };

/* Message word order of each of the 7 rounds: round r + 1 is round r permuted by (2 6 3 10 7 0 4 13 1 11 12 5 9 14 15 8). */
static const uint8_t SCHED[7][16] = {
	{ 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15 },
	{ 2, 6, 3, 10, 7, 0, 4, 13, 1, 11, 12, 5, 9, 14, 15, 8 },
	{ 3, 4, 10, 12, 13, 2, 7, 14, 6, 5, 9, 0, 11, 15, 8, 1 },
	{ 10, 7, 12, 9, 14, 3, 13, 15, 4, 0, 11, 2, 5, 8, 1, 6 },
	{ 12, 13, 9, 11, 15, 10, 14, 8, 7, 2, 5, 3, 0, 1, 6, 4 },
	{ 9, 14, 11, 5, 8, 12, 15, 1, 13, 3, 0, 10, 2, 6, 4, 7 },
	{ 11, 15, 5, 0, 1, 9, 8, 6, 14, 10, 2, 12, 3, 4, 7, 13 },
};

/* One round: G on the four columns, then the four diagonals, of state s with message m in the order k. */
#define ROUND(G, s, m, k)                                      \
	do {                                                   \
		const uint8_t *k_ = (k);                       \
		G(s, 0, 4, 8, 12, m[k_[0]], m[k_[1]]);         \
		G(s, 1, 5, 9, 13, m[k_[2]], m[k_[3]]);         \
		G(s, 2, 6, 10, 14, m[k_[4]], m[k_[5]]);        \
		G(s, 3, 7, 11, 15, m[k_[6]], m[k_[7]]);        \
		G(s, 0, 5, 10, 15, m[k_[8]], m[k_[9]]);        \
		G(s, 1, 6, 11, 12, m[k_[10]], m[k_[11]]);      \
		G(s, 2, 7, 8, 13, m[k_[12]], m[k_[13]]);       \
		G(s, 3, 4, 9, 14, m[k_[14]], m[k_[15]]);       \
	} while (0)

static inline uint32_t load32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint32_t rotr(uint32_t x, int n)
{
	return x >> n | x << (32 - n);
}

static inline void g(uint32_t *s, int a, int b, int c, int d, uint32_t x, uint32_t y)
{
	s[a] += s[b] + x;
	s[d] = rotr(s[d] ^ s[a], 16);
	s[c] += s[d];
	s[b] = rotr(s[b] ^ s[c], 12);
	s[a] += s[b] + y;
	s[d] = rotr(s[d] ^ s[a], 8);
	s[c] += s[d];
	s[b] = rotr(s[b] ^ s[c], 7);
}

/* One compression: the first 8 output words (a chaining value, or the hash under ROOT) into cv_out. */
static void compress(const uint32_t cv[8], const uint8_t block[BLOCK_LEN], uint64_t counter, uint32_t len,
		     uint32_t flags, uint32_t cv_out[8])
{
	uint32_t m[16], s[16];
	for (int i = 0; i < 16; i++)
		m[i] = load32(block + 4 * i);
	memcpy(s, cv, 32);
	memcpy(s + 8, IV, 16);
	s[12] = (uint32_t)counter;
	s[13] = (uint32_t)(counter >> 32);
	s[14] = len;
	s[15] = flags;
	for (int r = 0; r < 7; r++)
		ROUND(g, s, m, SCHED[r]);
	for (int i = 0; i < 8; i++)
		cv_out[i] = s[i] ^ s[i + 8];
}

/* The CV of one chunk of n bytes (1..CHUNK_LEN; 0 only for the empty input), flags_last added to its last block. */
static void chunk_cv(const uint8_t *p, size_t n, uint64_t counter, uint32_t flags_last, uint32_t cv[8])
{
	const size_t n_blocks = n ? (n + BLOCK_LEN - 1) / BLOCK_LEN : 1;
	memcpy(cv, IV, 32);
	for (size_t b = 0; b < n_blocks; b++) {
		uint8_t block[BLOCK_LEN] = { 0 };
		const size_t len = b + 1 < n_blocks ? BLOCK_LEN : n - b * BLOCK_LEN;
		memcpy(block, p + b * BLOCK_LEN, len);
		uint32_t flags = (b == 0 ? CHUNK_START : 0) | (b + 1 == n_blocks ? CHUNK_END | flags_last : 0);
		compress(cv, block, counter, (uint32_t)len, flags, cv);
	}
}

static void parent_cv(const uint32_t left[8], const uint32_t right[8], uint32_t flags, uint32_t out[8])
{
	uint8_t block[BLOCK_LEN];
	for (int i = 0; i < 8; i++)
		for (int j = 0; j < 4; j++) {
			block[4 * i + j] = (uint8_t)(left[i] >> (8 * j));
			block[32 + 4 * i + j] = (uint8_t)(right[i] >> (8 * j));
		}
	compress(IV, block, 0, BLOCK_LEN, PARENT | flags, out);
}

/* Completed subtrees, largest first (see the opening comment). */
typedef struct cv_stack {
	uint32_t cv[64][8]; /* [depth] a subtree's CV */
	int depth;          /* entries */
} cv_stack;

/*
 * A complete subtree of 2^level chunks, ending at chunk number `done` (counting
 * from 1; more chunks follow it), has the CV cv: push it, merging completed
 * pairs.
 */
static void stack_push(cv_stack *st, uint32_t cv[8], uint64_t done, int level)
{
	for (uint64_t t = done >> level; (t & 1) == 0; t >>= 1)
		parent_cv(st->cv[--st->depth], cv, 0, cv);
	memcpy(st->cv[st->depth++], cv, 32);
}

/* The hash: the last chunk's CV folded into the stack from its top, the last fold under ROOT. */
static void stack_finish(cv_stack *st, uint32_t cv[8], uint8_t out[32])
{
	while (st->depth > 0) {
		st->depth--;
		parent_cv(st->cv[st->depth], cv, st->depth == 0 ? ROOT : 0, cv);
	}
	for (int i = 0; i < 8; i++)
		for (int j = 0; j < 4; j++)
			out[4 * i + j] = (uint8_t)(cv[i] >> (8 * j));
}

/*
 * The CVs of eight inputs of n_blocks full blocks each, input i at p + i *
 * stride, chained from the IV, with counter + i * counter_step and, on every
 * block, flags (plus first on the first block and last on the last): eight
 * chunks, or eight parents (stride 64: a parent's block is its two children's
 * CVs as they lie in memory on a little-endian CPU). out may overlap the
 * input: every input byte is read before out is written when n_blocks is 1.
 */
typedef void (*hash8_fn)(const uint8_t *p, size_t stride, int n_blocks, uint64_t counter, int counter_step,
			 uint32_t flags, uint32_t first, uint32_t last, uint32_t out[8][8]);

#define SUBTREE_MAX_LEVEL 10 /* 1,024 chunks (32 KiB of CVs on the stack) */

/* The CV of the complete subtree of 2^level (8..1,024) chunks at p, the first of them chunk number c. */
static void subtree_cv(const uint8_t *p, uint64_t c, int level, hash8_fn h8, uint32_t out[8])
{
	uint32_t cvs[1 << SUBTREE_MAX_LEVEL][8];
	size_t n = (size_t)1 << level;
	for (size_t i = 0; i < n; i += 8)
		h8(p + i * CHUNK_LEN, CHUNK_LEN, CHUNK_LEN / BLOCK_LEN, c + i, 1, 0, CHUNK_START, CHUNK_END, &cvs[i]);
	for (; n > 1; n /= 2) { /* one level of parents: pairs (2j, 2j + 1) into j */
		size_t j = 0;
		for (; j + 8 <= n / 2; j += 8)
			h8((const uint8_t *)cvs[2 * j], BLOCK_LEN, 1, 0, 0, PARENT, 0, 0, &cvs[j]);
		for (; j < n / 2; j++)
			parent_cv(cvs[2 * j], cvs[2 * j + 1], 0, cvs[j]);
	}
	memcpy(out, cvs[0], 32);
}

static void blake3_with(const uint8_t *p, size_t n, hash8_fn h8, uint8_t out[32])
{
	cv_stack st;
	uint32_t cv[8];
	const uint64_t n_chunks = n ? (n + CHUNK_LEN - 1) / CHUNK_LEN : 1;
	uint64_t c = 0;

	st.depth = 0;
	if (n_chunks == 1) {
		chunk_cv(p, n, 0, ROOT, cv);
		stack_finish(&st, cv, out);
		return;
	}
	/*
	 * Every chunk but the last, with SIMD as the largest complete subtree that
	 * starts here (aligned, at most SUBTREE_MAX_LEVEL, more chunks after it),
	 * when it has eight chunks or more; one chunk at a time otherwise.
	 */
	while (c + 1 < n_chunks) {
		int level = 0;
		while (h8 && level < SUBTREE_MAX_LEVEL && (c & ((2ull << level) - 1)) == 0 && c + (2ull << level) < n_chunks)
			level++;
		if (level >= 3) {
			subtree_cv(p + c * CHUNK_LEN, c, level, h8, cv);
		} else {
			level = 0;
			chunk_cv(p + c * CHUNK_LEN, CHUNK_LEN, c, 0, cv);
		}
		c += 1ull << level;
		stack_push(&st, cv, c, level);
	}
	chunk_cv(p + c * CHUNK_LEN, n - c * CHUNK_LEN, c, 0, cv);
	stack_finish(&st, cv, out);
}

void kvt_blake3_portable(const void *data, size_t n, uint8_t out[32])
{
	blake3_with(data, n, NULL, out);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* The AVX2 path's functions: compiled for AVX2 whatever the build targets (GCC and clang alike), called only
 * where the CPU has it. */
#define AVX2_INLINE static inline __attribute__((always_inline, target("avx2")))

AVX2_INLINE __m256i rot16(__m256i x)
{
	return _mm256_shuffle_epi8(x, _mm256_setr_epi8(2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13, 2, 3, 0, 1, 6, 7,
						       4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
}

AVX2_INLINE __m256i rot8(__m256i x)
{
	return _mm256_shuffle_epi8(x, _mm256_setr_epi8(1, 2, 3, 0, 5, 6, 7, 4, 9, 10, 11, 8, 13, 14, 15, 12, 1, 2, 3, 0, 5, 6,
						       7, 4, 9, 10, 11, 8, 13, 14, 15, 12));
}

#ifdef __AVX512VL__ /* a build for this CPU (KVT_NATIVE) that has it: one instruction */
#define rotn(x, n) _mm256_ror_epi32((x), (n))
#else
AVX2_INLINE __m256i rotn(__m256i x, int n)
{
	return _mm256_or_si256(_mm256_srli_epi32(x, n), _mm256_slli_epi32(x, 32 - n));
}
#endif

AVX2_INLINE void g8(__m256i *s, int a, int b, int c, int d, __m256i x, __m256i y)
{
	s[a] = _mm256_add_epi32(_mm256_add_epi32(s[a], s[b]), x);
	s[d] = rot16(_mm256_xor_si256(s[d], s[a]));
	s[c] = _mm256_add_epi32(s[c], s[d]);
	s[b] = rotn(_mm256_xor_si256(s[b], s[c]), 12);
	s[a] = _mm256_add_epi32(_mm256_add_epi32(s[a], s[b]), y);
	s[d] = rot8(_mm256_xor_si256(s[d], s[a]));
	s[c] = _mm256_add_epi32(s[c], s[d]);
	s[b] = rotn(_mm256_xor_si256(s[b], s[c]), 7);
}

/* In place: v[i] lane j becomes v[j] lane i (8 x 8 words). */
AVX2_INLINE void transpose8(__m256i v[8])
{
	__m256i a[8], b[8];
	for (int i = 0; i < 8; i += 2) {
		a[i] = _mm256_unpacklo_epi32(v[i], v[i + 1]);
		a[i + 1] = _mm256_unpackhi_epi32(v[i], v[i + 1]);
	}
	for (int i = 0; i < 8; i += 4) {
		b[i] = _mm256_unpacklo_epi64(a[i], a[i + 2]);
		b[i + 1] = _mm256_unpackhi_epi64(a[i], a[i + 2]);
		b[i + 2] = _mm256_unpacklo_epi64(a[i + 1], a[i + 3]);
		b[i + 3] = _mm256_unpackhi_epi64(a[i + 1], a[i + 3]);
	}
	for (int i = 0; i < 4; i++) {
		v[i] = _mm256_permute2x128_si256(b[i], b[i + 4], 0x20);
		v[i + 4] = _mm256_permute2x128_si256(b[i], b[i + 4], 0x31);
	}
}

/* hash8_fn on AVX2: one input per 32-bit lane (x86 is little-endian). */
__attribute__((target("avx2"))) static void hash8_avx2(const uint8_t *p, size_t stride, int n_blocks, uint64_t counter, int counter_step,
		       uint32_t flags, uint32_t first, uint32_t last, uint32_t out[8][8])
{
	__m256i cv[8], s[16], m[16];
	const __m256i start = _mm256_set1_epi32((int)(uint32_t)counter), sign = _mm256_set1_epi32(INT32_MIN);
	const __m256i lo = _mm256_add_epi32(start, _mm256_mullo_epi32(_mm256_set1_epi32(counter_step),
								      _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
	/* the high word carries where the low one wrapped (unsigned lo < its start) */
	const __m256i carry = _mm256_cmpgt_epi32(_mm256_xor_si256(start, sign), _mm256_xor_si256(lo, sign));
	const __m256i hi = _mm256_sub_epi32(_mm256_set1_epi32((int)(uint32_t)(counter >> 32)), carry);

	for (int i = 0; i < 8; i++)
		cv[i] = _mm256_set1_epi32((int)IV[i]);
	for (int b = 0; b < n_blocks; b++) {
		for (int half = 0; half < 2; half++) {
			for (int i = 0; i < 8; i++)
				m[8 * half + i] = _mm256_loadu_si256((const __m256i *)(p + (size_t)i * stride + (size_t)b * BLOCK_LEN + 32 * half));
			transpose8(m + 8 * half);
		}
		const uint32_t f = flags | (b == 0 ? first : 0) | (b == n_blocks - 1 ? last : 0);
		for (int i = 0; i < 8; i++)
			s[i] = cv[i];
		for (int i = 0; i < 4; i++)
			s[8 + i] = _mm256_set1_epi32((int)IV[i]);
		s[12] = lo;
		s[13] = hi;
		s[14] = _mm256_set1_epi32(BLOCK_LEN);
		s[15] = _mm256_set1_epi32((int)f);
		_Pragma("GCC unroll 7") for (int r = 0; r < 7; r++)
			ROUND(g8, s, m, SCHED[r]);
		for (int i = 0; i < 8; i++)
			cv[i] = _mm256_xor_si256(s[i], s[i + 8]);
	}
	transpose8(cv);
	for (int i = 0; i < 8; i++)
		_mm256_storeu_si256((__m256i *)out[i], cv[i]);
}

static hash8_fn pick_hash8(void)
{
	return __builtin_cpu_supports("avx2") ? hash8_avx2 : NULL;
}
#else
static hash8_fn pick_hash8(void)
{
	return NULL;
}
#endif

void kvt_blake3(const void *data, size_t n, uint8_t out[32])
{
	blake3_with(data, n, pick_hash8(), out);
}

const char *kvt_blake3_impl(void)
{
	return pick_hash8() ? "avx2" : "portable";
}
