/*
 * tests/test_index_hash.c — block hashing, tenant salts, name validation.
 *
 * Known answers were computed independently (Python hashlib/hmac from the
 * format in index/index.h), so a change of the byte format fails here: block
 * hashes are persisted, and a silent format change would orphan every stored
 * block. Stability across processes: the test re-executes itself
 * (/proc/self/exe --print-hashes) and compares the child's output.
 */
/* ctest-labels: unit */
#include "check.h"
#include "index.h"

#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void fill_fixture(uint8_t fp[32], uint8_t salt[32], int32_t toks[33])
{
	for (int i = 0; i < 32; i++) {
		fp[i] = (uint8_t)i;
		salt[i] = 0xA5;
	}
	for (int i = 0; i < 32; i++)
		toks[i] = i - 3;
	toks[32] = INT32_MAX;
}

static void hex_of(const uint8_t h[32], char out[65])
{
	kvt_hash_hex(h, out);
}

/* Print root and the two block hashes of the fixture, one per line. */
static int print_hashes(void)
{
	uint8_t fp[32], salt[32], root[32], h[2][32];
	int32_t toks[33];
	uint32_t n = 0;
	char hex[65];
	fill_fixture(fp, salt, toks);
	if (kvt_hash_root(fp, 1, 16, salt, root) || kvt_hash_chain(root, toks, 33, 16, h, 2, &n) || n != 2)
		return 1;
	hex_of(root, hex);
	printf("%s\n", hex);
	for (int i = 0; i < 2; i++) {
		hex_of(h[i], hex);
		printf("%s\n", hex);
	}
	return 0;
}

static void test_known_answers(void)
{
	uint8_t fp[32], salt[32], root[32], h[4][32], hb[32];
	int32_t toks[33];
	uint32_t n = 99;
	char hex[65];

	fill_fixture(fp, salt, toks);
	CHECK(kvt_hash_root(fp, 1, 16, salt, root) == KVT_OK);
	hex_of(root, hex);
	CHECKF(strcmp(hex, "4f20a43aa87efb793cd1e34716e2c4004906c3884433f2747ebdda4bd532ece1") == 0, "root %s", hex);
	/* 33 tokens = 2 full blocks + 1 (the partial block is not hashed) */
	CHECK(kvt_hash_chain(root, toks, 33, 16, h, 4, &n) == KVT_OK);
	CHECK_EQ_INT(n, 2);
	hex_of(h[0], hex);
	CHECKF(strcmp(hex, "780272d1a23491ac428bb51800135335e1c0e66a0b9f01116819018894e5adb9") == 0, "h0 %s", hex);
	hex_of(h[1], hex);
	CHECKF(strcmp(hex, "df904e82ca82c215ec6ff48380c52f68478b591c5f3123c16531519160d11070") == 0, "h1 %s", hex);
	/* chain = iterated single steps */
	CHECK(kvt_hash_block(root, toks, 16, hb) == KVT_OK);
	CHECK(memcmp(hb, h[0], 32) == 0);
	CHECK(kvt_hash_block(hb, toks + 16, 16, hb) == KVT_OK); /* out aliases parent */
	CHECK(memcmp(hb, h[1], 32) == 0);
	/* cap limits the count */
	CHECK(kvt_hash_chain(root, toks, 33, 16, h, 1, &n) == KVT_OK);
	CHECK_EQ_INT(n, 1);
	CHECK(kvt_hash_chain(root, toks, 15, 16, h, 4, &n) == KVT_OK);
	CHECK_EQ_INT(n, 0);

	uint8_t salt_a[32];
	const char *secret = "0123456789abcdef-secret";
	CHECK(kvt_tenant_salt((const uint8_t *)secret, strlen(secret), "tenant-A", salt_a) == KVT_OK);
	hex_of(salt_a, hex);
	CHECKF(strcmp(hex, "292976235bb4b8324ac794bccade1dc2c797584f3acf0b34d55d31b994fc05a7") == 0, "salt %s", hex);
}

static void test_sensitivity(void)
{
	uint8_t fp[32], salt[32], root[32], r2[32], h[2][32], g[2][32];
	int32_t toks[33];
	uint32_t n;

	fill_fixture(fp, salt, toks);
	CHECK(kvt_hash_root(fp, 1, 16, salt, root) == KVT_OK);
	CHECK(kvt_hash_chain(root, toks, 32, 16, h, 2, &n) == KVT_OK);
	/* every root ingredient matters */
	fp[31] ^= 1;
	CHECK(kvt_hash_root(fp, 1, 16, salt, r2) == KVT_OK);
	CHECK(memcmp(r2, root, 32) != 0);
	fp[31] ^= 1;
	CHECK(kvt_hash_root(fp, 2, 16, salt, r2) == KVT_OK);
	CHECK(memcmp(r2, root, 32) != 0);
	CHECK(kvt_hash_root(fp, 1, 32, salt, r2) == KVT_OK);
	CHECK(memcmp(r2, root, 32) != 0);
	salt[0] ^= 0x80;
	CHECK(kvt_hash_root(fp, 1, 16, salt, r2) == KVT_OK);
	CHECK(memcmp(r2, root, 32) != 0);
	salt[0] ^= 0x80;
	/* a change in block 0 changes both hashes; in block 1 only the second */
	toks[5]++;
	CHECK(kvt_hash_chain(root, toks, 32, 16, g, 2, &n) == KVT_OK);
	CHECK(memcmp(g[0], h[0], 32) != 0 && memcmp(g[1], h[1], 32) != 0);
	toks[5]--;
	toks[20] = -toks[20] - 1;
	CHECK(kvt_hash_chain(root, toks, 32, 16, g, 2, &n) == KVT_OK);
	CHECK(memcmp(g[0], h[0], 32) == 0 && memcmp(g[1], h[1], 32) != 0);
	/* bad sizes */
	check_log_capture();
	CHECK(kvt_hash_root(fp, 1, 0, salt, r2) == KVT_EINVAL);
	CHECK(kvt_hash_root(fp, 1, 257, salt, r2) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "block_tokens 257") != NULL);
	CHECK(kvt_hash_block(root, toks, 0, r2) == KVT_EINVAL);
	CHECK(kvt_hash_chain(root, toks, 32, 0, g, 2, &n) == KVT_EINVAL);
	kvt_log_set_sink(NULL, NULL);
}

static void test_salts(void)
{
	const uint8_t secret[] = "server-secret-of-32-bytes-length";
	uint8_t a[32], b[32], a2[32];
	CHECK(kvt_tenant_salt(secret, 32, "alice", a) == KVT_OK);
	CHECK(kvt_tenant_salt(secret, 32, "bob", b) == KVT_OK);
	CHECK(kvt_tenant_salt(secret, 32, "alice", a2) == KVT_OK);
	CHECK(memcmp(a, b, 32) != 0);
	CHECK(memcmp(a, a2, 32) == 0);
	uint8_t other[32];
	memcpy(other, secret, 32);
	other[0] ^= 1;
	CHECK(kvt_tenant_salt(other, 32, "alice", a2) == KVT_OK);
	CHECK(memcmp(a, a2, 32) != 0);
	check_log_capture();
	CHECK(kvt_tenant_salt(secret, 8, "alice", a2) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "at least 16") != NULL);
	CHECK(kvt_tenant_salt(secret, 32, "../alice", a2) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "tenant \"../alice\"") != NULL);
	kvt_log_set_sink(NULL, NULL);
}

static void test_names(void)
{
	char long_ok[129], long_bad[130];
	memset(long_ok, 'a', 128);
	long_ok[128] = '\0';
	memset(long_bad, 'b', 129);
	long_bad[129] = '\0';
	const char *good[] = { "a", "session-1", "Tenant_A.v2", "0", "x.y.z", "-lead", long_ok };
	const char *bad[] = { "", ".hidden", "..", "../etc/passwd", "a/b", "a b", "a\\b", "tab\t", "caf\xc3\xa9",
			      "semi;colon", "nul%00", long_bad };
	for (size_t i = 0; i < sizeof(good) / sizeof(*good); i++)
		CHECKF(kvt_name_valid(good[i]), "should accept \"%s\"", good[i]);
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
		CHECKF(!kvt_name_valid(bad[i]), "should reject \"%s\"", bad[i]);
	CHECK(!kvt_name_valid(NULL));
	check_log_capture();
	CHECK(kvt_name_check("session id", "a/b") == KVT_EINVAL);
	CHECK(strstr(check_log_text, "session id \"a/b\": has a character outside [A-Za-z0-9._-]") != NULL);
	CHECK(kvt_name_check("tenant", ".x") == KVT_EINVAL);
	CHECK(strstr(check_log_text, "starts with '.'") != NULL);
	CHECK(kvt_name_check("tenant", long_bad) == KVT_EINVAL);
	CHECK(strstr(check_log_text, "longer than 128 bytes") != NULL);
	CHECK(kvt_name_check("tenant", "") == KVT_EINVAL);
	CHECK(strstr(check_log_text, "empty") != NULL);
	CHECK(kvt_name_check("tenant", "ok") == KVT_OK);
	kvt_log_set_sink(NULL, NULL);
}

/* The same hashes from a fresh process (another address space, another run). */
static void test_across_processes(void)
{
	int fds[2];
	char buf[512] = { 0 };
	size_t got = 0;
	CHECK(pipe(fds) == 0);
	fflush(stdout);
	fflush(stderr);
	pid_t pid = fork();
	if (pid == 0) {
		dup2(fds[1], 1);
		close(fds[0]);
		execl("/proc/self/exe", "test_index_hash", "--print-hashes", (char *)NULL);
		_exit(127);
	}
	close(fds[1]);
	for (ssize_t r; (r = read(fds[0], buf + got, sizeof(buf) - 1 - got)) > 0;)
		got += (size_t)r;
	close(fds[0]);
	int st = 0;
	waitpid(pid, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CHECKF(strcmp(buf, "4f20a43aa87efb793cd1e34716e2c4004906c3884433f2747ebdda4bd532ece1\n"
			   "780272d1a23491ac428bb51800135335e1c0e66a0b9f01116819018894e5adb9\n"
			   "df904e82ca82c215ec6ff48380c52f68478b591c5f3123c16531519160d11070\n") == 0,
	       "child printed:\n%s", buf);
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "--print-hashes") == 0)
		return print_hashes();
	test_known_answers();
	test_sensitivity();
	test_salts();
	test_names();
	test_across_processes();
	return check_done("test_index_hash");
}
