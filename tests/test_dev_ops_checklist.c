/* ctest-labels: unit */
/*
 * tests/test_dev_ops_checklist.c — every op of the device table has a parity
 * case, and an op added without one fails here (as ggml's test-backend-ops
 * does for its backends).
 *
 * The ops are KVT_DEV_OPS (gpu/dev_impl.h), which dev.c checks at compile
 * time against struct kvt_dev_ops field for field: a field added to the
 * struct without an entry there fails the build, and an entry added there
 * without a row in cases[] below fails this test, naming the op.
 *
 * A row names the op's public wrapper (dev.h) and the functions of the
 * parity tests that run it on the CUDA backend against the CPU reference (on
 * a GPU, and in CI on the emulator: test_gpu_parity, test_gpu_graph and
 * test_manager_layered all have _emu builds). For each named function the
 * test reads the test's source and checks that the function is defined
 * there and that its body calls the wrapper, so a row cannot name a case
 * that does not exist or does not exercise the op. Runs without a GPU.
 */
#include "check.h"
#include "dev_impl.h"

#define MAX_CASES 4

typedef struct op_cases {
	const char *op;                /* field of struct kvt_dev_ops */
	const char *wrapper;           /* the dev.h function that dispatches to it */
	const char *cases[MAX_CASES];  /* "file.c:function" in tests/, NULL-terminated */
} op_cases;

static const op_cases cases[] = {
	{ "destroy", "kvt_dev_destroy",
	  { "test_gpu_parity.c:test_decode_variants", "test_gpu_graph.c:test_decode_fused" } },
	{ "supports_dtype", "kvt_dev_supports_dtype", { "test_gpu_graph.c:test_random_model" } },
	{ "alloc", "kvt_dev_alloc", { "test_gpu_parity.c:up", "test_gpu_parity.c:ws" } },
	{ "free", "kvt_dev_free", { "test_gpu_parity.c:test_copies", "test_gpu_parity.c:both_free" } },
	{ "copy_h2d", "kvt_dev_copy_h2d", { "test_gpu_parity.c:up", "test_gpu_parity.c:test_attention" } },
	{ "copy_d2h", "kvt_dev_copy_d2h", { "test_gpu_parity.c:down", "test_gpu_graph.c:test_capture_rules" } },
	{ "copy_d2d", "kvt_dev_copy_d2d", { "test_gpu_parity.c:test_copies", "test_gpu_graph.c:test_capture_rules" } },
	{ "sync", "kvt_dev_sync", { "test_gpu_parity.c:down", "test_gpu_parity.c:test_attention" } },
	{ "matmul_workspace", "kvt_dev_matmul_workspace_bytes",
	  { "test_gpu_parity.c:test_matmul", "test_gpu_parity.c:test_matmul_quant" } },
	{ "matmul", "kvt_dev_matmul", { "test_gpu_parity.c:test_matmul", "test_gpu_parity.c:test_matmul_quant" } },
	{ "rmsnorm", "kvt_dev_rmsnorm", { "test_gpu_parity.c:test_rows" } },
	{ "rope", "kvt_dev_rope", { "test_gpu_parity.c:test_rope_embed" } },
	{ "swiglu", "kvt_dev_swiglu", { "test_gpu_parity.c:test_rows" } },
	{ "add", "kvt_dev_add", { "test_gpu_parity.c:test_rows" } },
	{ "embed", "kvt_dev_embed", { "test_gpu_parity.c:test_rope_embed", "test_gpu_parity.c:test_matmul_quant" } },
	{ "kv_store", "kvt_dev_kv_store", { "test_gpu_parity.c:test_attention", "test_gpu_graph.c:test_dyn_pos" } },
	{ "attention_workspace", "kvt_dev_attention_workspace_bytes",
	  { "test_gpu_parity.c:test_attention", "test_gpu_parity.c:test_decode_variants" } },
	{ "attention", "kvt_dev_attention",
	  { "test_gpu_parity.c:test_attention", "test_gpu_parity.c:test_decode_variants", "test_gpu_graph.c:test_dyn_pos" } },
	{ "argmax", "kvt_dev_argmax", { "test_gpu_parity.c:test_rows" } },
	{ "host_alloc", "kvt_dev_host_alloc", { "test_gpu_parity.c:test_copies", "test_manager_layered.c:test_copy_2d" } },
	{ "host_free", "kvt_dev_host_free", { "test_gpu_parity.c:test_copies", "test_manager_layered.c:test_copy_2d" } },
	{ "stream_create", "kvt_dev_stream_create", { "test_gpu_parity.c:test_copies", "test_gpu_parity.c:test_codecs" } },
	{ "stream_destroy", "kvt_dev_stream_destroy", { "test_gpu_parity.c:test_copies", "test_gpu_parity.c:test_codecs" } },
	{ "stream_sync", "kvt_dev_stream_sync", { "test_gpu_parity.c:test_copies", "test_gpu_parity.c:test_codecs" } },
	{ "event_create", "kvt_dev_event_create", { "test_gpu_parity.c:test_copies" } },
	{ "event_destroy", "kvt_dev_event_destroy", { "test_gpu_parity.c:test_copies" } },
	{ "event_record", "kvt_dev_event_record", { "test_gpu_parity.c:test_copies" } },
	{ "stream_wait_event", "kvt_dev_stream_wait_event", { "test_gpu_parity.c:test_copies" } },
	{ "event_sync", "kvt_dev_event_sync", { "test_gpu_parity.c:test_copies" } },
	{ "event_done", "kvt_dev_event_done", { "test_gpu_parity.c:test_copies" } },
	{ "copy_async", "kvt_dev_copy_async", { "test_gpu_parity.c:test_copies" } },
	{ "kv_pack", "kvt_dev_kv_pack", { "test_gpu_parity.c:test_codecs" } },
	{ "kv_unpack", "kvt_dev_kv_unpack", { "test_gpu_parity.c:test_codecs" } },
	{ "sample_workspace", "kvt_dev_sample_workspace_bytes", { "test_gpu_parity.c:test_sample" } },
	{ "sample", "kvt_dev_sample", { "test_gpu_parity.c:test_sample" } },
	{ "capture_begin", "kvt_dev_capture_begin", { "test_gpu_graph.c:test_capture_rules" } },
	{ "capture_end", "kvt_dev_capture_end", { "test_gpu_graph.c:test_capture_rules" } },
	{ "graph_launch", "kvt_dev_graph_launch", { "test_gpu_graph.c:test_capture_rules" } },
	{ "graph_destroy", "kvt_dev_graph_destroy", { "test_gpu_graph.c:test_capture_rules" } },
	{ "norm_matmul", "kvt_dev_norm_matmul", { "test_gpu_graph.c:test_fused" } },
	{ "matmul_swiglu", "kvt_dev_matmul_swiglu", { "test_gpu_graph.c:test_fused" } },
	{ "rope_store", "kvt_dev_rope_store", { "test_gpu_graph.c:test_fused" } },
	{ "copy_2d_async", "kvt_dev_copy_2d_async", { "test_manager_layered.c:test_copy_2d" } },
	{ "kv_load", "kvt_dev_kv_load", { "test_gpu_parity.c:test_kv_load", "test_dev_parity.c:test_kv_load" } },
};
#define N_ROWS (sizeof cases / sizeof cases[0])

/* The ops of the table, from KVT_DEV_OPS. */
#define KVT_DEV_OP_NAME(op) #op,
static const char *const ops[KVT_DEV_N_OPS] = { KVT_DEV_OPS(KVT_DEV_OP_NAME) };
#undef KVT_DEV_OP_NAME

static const op_cases *row_of(const char *op)
{
	for (size_t i = 0; i < N_ROWS; i++)
		if (strcmp(cases[i].op, op) == 0)
			return &cases[i];
	return NULL;
}

static bool is_op(const char *op)
{
	for (int i = 0; i < KVT_DEV_N_OPS; i++)
		if (strcmp(ops[i], op) == 0)
			return true;
	return false;
}

/* tests/<file> read whole (NUL-terminated; the caller frees), or NULL. */
static char *read_test(const char *file)
{
	char path[512];
	snprintf(path, sizeof path, "%s/tests/%s", KVT_SOURCE_DIR, file);
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	char *buf = NULL;
	long n = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
	if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)n + 1))) {
		if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
			free(buf);
			buf = NULL;
		} else {
			buf[n] = '\0';
		}
	}
	fclose(f);
	return buf;
}

static bool ident_char(char c)
{
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* Whether s calls name: `name(` not preceded by an identifier character. */
static bool calls(const char *s, size_t n, const char *name)
{
	const size_t k = strlen(name);
	for (size_t i = 0; i + k < n; i++)
		if (memcmp(s + i, name, k) == 0 && s[i + k] == '(' && (i == 0 || !ident_char(s[i - 1])))
			return true;
	return false;
}

/*
 * The body of function fn in src: from its definition (a line at column 0,
 * not a declaration, with `fn(` in it) to the first line that is "}".
 * Returns its start and sets *len, or NULL where src defines no such function.
 */
static const char *body_of(const char *src, const char *fn, size_t *len)
{
	for (const char *line = src; *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : line + strlen(line)) {
		const char *eol = strchr(line, '\n');
		const size_t n = eol ? (size_t)(eol - line) : strlen(line);
		if (n == 0 || line[0] == ' ' || line[0] == '\t' || line[0] == '#' || line[0] == '/' || line[0] == '*' ||
		    line[n - 1] == ';' || !calls(line, n, fn))
			continue;
		const char *end = strstr(line, "\n}\n");
		if (!end)
			return NULL;
		*len = (size_t)(end - line) + 2;
		return line;
	}
	return NULL;
}

/* One named case: file:function exists and calls the wrapper. */
static void check_case(const op_cases *r, const char *c)
{
	const char *colon = strchr(c, ':');
	CHECKF(colon != NULL, "op %s: case \"%s\" is not file.c:function", r->op, c);
	if (!colon)
		return;
	char file[128];
	snprintf(file, sizeof file, "%.*s", (int)(colon - c), c);
	char *src = read_test(file);
	CHECKF(src != NULL, "op %s: case %s: cannot read tests/%s", r->op, c, file);
	if (!src)
		return;
	size_t len = 0;
	const char *body = body_of(src, colon + 1, &len);
	CHECKF(body != NULL, "op %s: case %s: tests/%s defines no function %s", r->op, c, file, colon + 1);
	if (body)
		CHECKF(calls(body, len, r->wrapper), "op %s: case %s does not call %s", r->op, c, r->wrapper);
	free(src);
}

/* The test's own matcher, on a known text: it finds what is there and nothing else. */
static void test_matcher(void)
{
	const char *src = "static void helper(void);\n"
			  "static void helper(void)\n{\n\tkvt_dev_sync(d);\n}\n"
			  "static void other(void)\n{\n\tmy_kvt_dev_matmul(d);\n}\n";
	size_t len = 0;
	const char *b = body_of(src, "helper", &len);
	CHECK(b != NULL && strncmp(b, "static void helper(void)\n{", 26) == 0);
	CHECK(b && calls(b, len, "kvt_dev_sync") && !calls(b, len, "kvt_dev_matmul"));
	b = body_of(src, "other", &len);
	CHECK(b && !calls(b, len, "kvt_dev_matmul") && !calls(b, len, "kvt_dev_sync"));
	CHECK(body_of(src, "missing", &len) == NULL);
}

int main(void)
{
	test_matcher();

	/* every op has a row with at least one case */
	for (int i = 0; i < KVT_DEV_N_OPS; i++) {
		const op_cases *r = row_of(ops[i]);
		CHECKF(r != NULL && r->cases[0] != NULL,
		       "op %s (struct kvt_dev_ops) has no parity case: name one in cases[] of %s", ops[i], __FILE__);
	}
	/* every row is an op, once, and each of its cases exists and calls the op */
	for (size_t i = 0; i < N_ROWS; i++) {
		CHECKF(is_op(cases[i].op), "cases[] row %s: not an op of KVT_DEV_OPS", cases[i].op);
		CHECKF(row_of(cases[i].op) == &cases[i], "cases[] row %s: listed twice", cases[i].op);
		for (int k = 0; k < MAX_CASES && cases[i].cases[k]; k++)
			check_case(&cases[i], cases[i].cases[k]);
	}
	CHECK_EQ_INT(N_ROWS, KVT_DEV_N_OPS);
	return check_done("test_dev_ops_checklist");
}
