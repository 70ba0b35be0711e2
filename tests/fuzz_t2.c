/*
 * tests/fuzz_t2.c — libFuzzer target for the T2 on-disk parsers: the record
 * header and payload (kvt_t2_record_peek, kvt_t2_record_verify) and a whole
 * data file (the superblock check of kvt_t2_open, kvt_t2_scan, kvt_t2_read).
 *
 * Byte 0 of an input chooses what the rest is:
 *   bit 0   0: one record read from offset OFF; 1: a whole T2 file
 *   bit 1   fix the checksums first (record: its own; file: the superblock's
 *           and every record's), so the mutations reach the checks behind them
 *           (lengths, model, tokens, LZ4) instead of all stopping at XXH3
 *   bit 2   record: take OFF from the header's own offset field (else 4096)
 * Records are verified against the model fingerprint they carry (the file:
 * the superblock's), so that check passes as often as the checksum does.
 *
 * Invariants checked (abort = a finding), beyond the sanitizers':
 *  - a record that verifies verifies again against the loc it reported;
 *  - every record kvt_t2_scan reports reads back through kvt_t2_read (an
 *    uncompressed one, at least: see fuzz_t2_scan_fn).
 * Errors go to a silent log sink. The file mode writes the input to a memfd
 * and opens it by /proc/self/fd path with the thread-pool I/O engine, so the
 * real open, scan and read code runs on it.
 *
 * Build and run: CMake builds it with clang (-fsanitize=fuzzer,address,undefined)
 * when clang is found; ctest -L fuzz runs it for KVT_FUZZ_SECONDS on a scratch
 * corpus seeded from tests/data/t2_corpus/. By hand:
 *   build-asan/fuzz_t2 -max_len=65536 -max_total_time=60 CORPUS tests/data/t2_corpus
 * A crashing input goes into tests/data/t2_regress/, which test_fuzz_replay
 * replays under the gcc ASan build (with the corpus).
 */
#define _GNU_SOURCE /* memfd_create */
#include "t2_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

#define FUZZ_T2_PAYLOAD_CAP (1u << 20)

static void fuzz_t2_quiet(int level, const char *msg, void *user)
{
	(void)level;
	(void)msg;
	(void)user;
}

static uint32_t fuzz_t2_get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t fuzz_t2_get64(const uint8_t *p)
{
	return (uint64_t)fuzz_t2_get32(p) | (uint64_t)fuzz_t2_get32(p + 4) << 32;
}
static void fuzz_t2_put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* Reseal the record at rec (avail bytes) for offset off: its checksum as t2_record.c computes it. */
static void fuzz_t2_fix_record(uint8_t *rec, size_t avail, uint64_t off)
{
	if (avail < KVT_T2_MIN_HEADER_BYTES)
		return;
	uint32_t ext = fuzz_t2_get32(rec + 136);
	if (ext < KVT_T2_MIN_HEADER_BYTES || ext > avail)
		return;
	memset(rec + 152, 0, 8); /* the checksum covers the extent with its own field read as zero */
	fuzz_t2_put64(rec + 152, XXH3_64bits_withSeed(rec, ext, kvt_t2_seed(off, fuzz_t2_get64(rec + 112))));
}

static uint8_t *fuzz_t2_payload, *fuzz_t2_scratch;

static void fuzz_t2_record(const uint8_t *data, size_t size, unsigned mode)
{
	kvt_t2_block_meta meta;
	kvt_t2_loc loc, again;
	const char *why = NULL;
	uint32_t ext = 0;
	uint8_t *rec = malloc(size ? size : 1);
	if (!rec)
		return;
	memcpy(rec, data, size);
	uint64_t off = KVT_T2_UNIT_BYTES;
	if ((mode & 4) && size >= 128)
		off = fuzz_t2_get64(rec + 120);
	if (mode & 2)
		fuzz_t2_fix_record(rec, size, off);
	uint8_t fp[32] = { 0 };
	if (size >= 48)
		memcpy(fp, rec + 16, 32);
	if (size >= KVT_T2_MIN_HEADER_BYTES && off < UINT64_MAX - size)
		(void)kvt_t2_record_peek(rec, off, off + size, &ext);
	int rc = kvt_t2_record_verify(rec, size, off, NULL, fp, NULL, &meta, fuzz_t2_payload, FUZZ_T2_PAYLOAD_CAP,
				      fuzz_t2_scratch, &loc, &why);
	if (rc == KVT_OK) {
		if (meta.n_tokens > KVT_T2_MAX_TOKENS || meta.raw_bytes > FUZZ_T2_PAYLOAD_CAP)
			abort();
		if (kvt_t2_record_verify(rec, size, off, &loc, fp, meta.hash, NULL, fuzz_t2_payload,
					 FUZZ_T2_PAYLOAD_CAP, fuzz_t2_scratch, &again, &why) != KVT_OK)
			abort(); /* verified once, refused against its own loc */
	}
	free(rec);
}

typedef struct fuzz_t2_scan_ctx {
	kvt_t2_store *s; /* the store being scanned */
	int n;           /* records seen */
} fuzz_t2_scan_ctx;

static int fuzz_t2_scan_fn(void *arg, const kvt_t2_block_meta *meta, const kvt_t2_loc *loc)
{
	fuzz_t2_scan_ctx *c = arg;
	kvt_t2_block_meta m;
	if (++c->n > 64)
		return KVT_EFULL; /* enough: stop the walk */
	(void)kvt_t2_mark_used(c->s, loc);
	int rc = kvt_t2_read(c->s, loc, meta->hash, &m, fuzz_t2_payload, FUZZ_T2_PAYLOAD_CAP);
	/*
	 * NOTE: scan checks the checksum but does not decompress (t2_store.h), so
	 * a compressed record whose LZ4 stream is bad under a valid checksum (a
	 * writer bug, never a disk fault) is reported by scan and refused by the
	 * read; tests/data/t2_regress/scan_lz4_undecodable is such a file.
	 */
	if (rc != KVT_OK && rc != KVT_EFULL && !(rc == KVT_ECORRUPT && loc->compressed))
		abort(); /* scan reported a record that does not read back */
	return 0;
}

static void fuzz_t2_file(const uint8_t *data, size_t size, unsigned mode)
{
	/* at least the superblock and one record unit; whole units */
	size_t n = kvt_t2_round_up(size < 2 * KVT_T2_UNIT_BYTES ? 2 * KVT_T2_UNIT_BYTES : size, KVT_T2_UNIT_BYTES);
	uint8_t *file = calloc(1, n);
	if (!file)
		return;
	memcpy(file, data, size);
	if (mode & 2) {
		fuzz_t2_put64(file + 16, n);
		for (size_t u = KVT_T2_UNIT_BYTES; u < n; u += KVT_T2_UNIT_BYTES)
			if (memcmp(file + u, KVT_T2_REC_MAGIC, 8) == 0)
				fuzz_t2_fix_record(file + u, n - u, u);
		fuzz_t2_put64(file + 64, XXH3_64bits(file, 64));
	}
	int fd = memfd_create("fuzz_t2", MFD_CLOEXEC);
	if (fd < 0 || pwrite(fd, file, n, 0) != (ssize_t)n) {
		if (fd >= 0)
			close(fd);
		free(file);
		return;
	}
	char path[64];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	kvt_t2_config cfg;
	memset(&cfg, 0, sizeof(cfg));
	cfg.path = path;
	cfg.io_mode = KVT_T2_IO_THREADS;
	cfg.buffered_ok = true; /* tmpfs refuses O_DIRECT */
	cfg.queue_depth = 4;
	cfg.n_io_ctx = 1;
	cfg.max_raw_bytes = FUZZ_T2_PAYLOAD_CAP;
	cfg.staging_cap_bytes = 4 * (KVT_T2_UNIT_BYTES + FUZZ_T2_PAYLOAD_CAP);
	memcpy(cfg.model_fp, file + 24, 32);
	kvt_t2_store *s = NULL;
	if (kvt_t2_open(&cfg, &s) == KVT_OK) {
		fuzz_t2_scan_ctx c = { s, 0 };
		(void)kvt_t2_scan(s, fuzz_t2_scan_fn, &c);
		kvt_t2_close(s);
	}
	close(fd);
	free(file);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static int init;
	if (!init) {
		kvt_log_set_sink(fuzz_t2_quiet, NULL);
		fuzz_t2_payload = malloc(FUZZ_T2_PAYLOAD_CAP);
		fuzz_t2_scratch = malloc(FUZZ_T2_PAYLOAD_CAP);
		if (!fuzz_t2_payload || !fuzz_t2_scratch)
			abort();
		init = 1;
	}
	if (size < 1)
		return 0;
	unsigned mode = data[0];
	if (mode & 1)
		fuzz_t2_file(data + 1, size - 1, mode);
	else
		fuzz_t2_record(data + 1, size - 1, mode);
	return 0;
}
