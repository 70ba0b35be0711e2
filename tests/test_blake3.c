/*
 * tests/test_blake3.c — core/blake3.c against the BLAKE3 team's implementation
 * (tests/ref/blake3_ref.txt, tests/ref/gen_blake3_refs.py) on every tree
 * shape near the chunk and block edges; the AVX2 path against the portable
 * one on random lengths and on data that is not the reference pattern; and
 * the speed of each, and of libcrypto's SHA-256 (fingerprint version 1's
 * hash), on the same bytes (printed only).
 */
/* ctest-labels: unit */
#include "blake3.h"
#include "check.h"

#include <openssl/evp.h>
#include <stdlib.h>

static void hex(const uint8_t h[32], char out[65])
{
	for (int i = 0; i < 32; i++)
		snprintf(out + 2 * i, 3, "%02x", h[i]);
}

int main(void)
{
	char path[4096], line[256], want[65], got[65];
	const size_t max_n = (8u << 20) + 4096;
	uint8_t *data = malloc(max_n), h[32], h2[32];
	CHECK(data != NULL);
	if (!data)
		return check_done("test_blake3");
	for (size_t i = 0; i < max_n; i++)
		data[i] = (uint8_t)(i % 251);
	printf("kvt_blake3 takes the %s path on this CPU\n", kvt_blake3_impl());

	/* the reference outputs */
	snprintf(path, sizeof(path), "%s/tests/ref/blake3_ref.txt", KVT_SOURCE_DIR);
	FILE *f = fopen(path, "r");
	CHECKF(f != NULL, "cannot open %s", path);
	int n_lines = 0;
	while (f && fgets(line, sizeof(line), f)) {
		unsigned long long n;
		if (line[0] == '#' || sscanf(line, "%llu %64s", &n, want) != 2)
			continue;
		CHECK(n <= max_n);
		if (n > max_n)
			continue;
		kvt_blake3(data, (size_t)n, h);
		hex(h, got);
		CHECKF(strcmp(got, want) == 0, "blake3 of %llu bytes: %s, the reference %s", n, got, want);
		kvt_blake3_portable(data, (size_t)n, h);
		hex(h, got);
		CHECKF(strcmp(got, want) == 0, "portable blake3 of %llu bytes: %s, the reference %s", n, got, want);
		n_lines++;
	}
	if (f)
		fclose(f);
	CHECKF(n_lines >= 100, "%d reference lines", n_lines);

	/* both paths on other bytes and other lengths, and one bit anywhere changes the hash */
	srand(7);
	for (size_t i = 0; i < max_n; i++)
		data[i] = (uint8_t)rand();
	for (int t = 0; t < 60; t++) {
		size_t n = t < 40 ? (size_t)rand() % 40000 : (size_t)rand() % max_n;
		kvt_blake3(data, n, h);
		kvt_blake3_portable(data, n, h2);
		CHECKF(memcmp(h, h2, 32) == 0, "blake3 of %zu random bytes: the two paths differ", n);
		if (n) {
			size_t at = (size_t)rand() % n;
			data[at] ^= 1;
			kvt_blake3(data, n, h2);
			data[at] ^= 1;
			CHECKF(memcmp(h, h2, 32) != 0, "a bit at byte %zu of %zu went unseen", at, n);
		}
	}

	/* speed on 8 MiB (informational) */
	double t0 = kvt_now_s();
	for (int r = 0; r < 8; r++)
		kvt_blake3(data, 8u << 20, h);
	double t1 = kvt_now_s();
	kvt_blake3_portable(data, 8u << 20, h2);
	double t2 = kvt_now_s();
	CHECK(memcmp(h, h2, 32) == 0);
	unsigned n_sha = 0;
	for (int r = 0; r < 8; r++)
		CHECK(EVP_Digest(data, 8u << 20, h2, &n_sha, EVP_sha256(), NULL) == 1 && n_sha == 32);
	double t3 = kvt_now_s();
	printf("8 MiB: %s %.2f GB/s, portable %.2f GB/s, libcrypto SHA-256 %.2f GB/s\n", kvt_blake3_impl(),
	       8 * 8.388608e6 / (t1 - t0) / 1e9, 8.388608e6 / (t2 - t1) / 1e9, 8 * 8.388608e6 / (t3 - t2) / 1e9);
	free(data);
	return check_done("test_blake3");
}
