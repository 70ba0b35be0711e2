/*
 * engine/serve/structured.c — JSON Schema to grammar, response_format, tools
 * and tool calls, logprob objects (structured.h).
 *
 * The schema subset (OpenAI's strict mode, plus a little): type (one or a
 * list), properties, required, additionalProperties (false, true or absent:
 * only the declared properties are generated either way, which validates
 * under both), enum, const, anyOf, $defs / definitions with $ref (JSON
 * pointers into the root, recursion included), items, minItems, maxItems,
 * minLength, maxLength, pattern (a regex subset: literals, classes, \d \w
 * \s, groups, |, * + ? {m,n}, ^ and $ at the ends), nested objects; the
 * annotations title, description, default, examples, $schema, $id,
 * $comment are read and ignored. Any other keyword is refused, naming it.
 *
 * Generated JSON: properties in the schema's order, optional ones may be
 * left out; digits are bounded (16 before the point), and so is whitespace,
 * to what a pretty-printer writes: after "{", "[" and "," nothing, a space,
 * or a newline and an indent of at most 4 spaces or tabs per level of
 * nesting; before "}" and "]" the same, one level less; after ":" at most a
 * space; before ":" and "," nothing. A weak model then cannot spend its
 * tokens on blank lines and stray breaks ("\n,\n", "\"a\"\n:\n") inside
 * a value, and compact or indented output (json.dumps with indent 2 or 4, a
 * tab) stays as it is. The level is known where a rule is made: the
 * generic rules (value, object, array) exist once per level up to LEVEL_MAX
 * (indent 24, deeper levels share it), and a $ref target is made once per
 * level it is used at. Strings are UTF-8 (multi-byte sequences checked) or
 * JSON escapes.
 */
#define _GNU_SOURCE /* memmem */
#include "structured.h"

#include "request.h"
#include "tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* A grammar literal for raw bytes. */
static void sbuf_lit(kvt_sbuf *b, const char *s, size_t n)
{
	kvt_sbuf_add(b, "\"", 1);
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '"')
			kvt_sbuf_add(b, "\\\"", 2);
		else if (c == '\\')
			kvt_sbuf_add(b, "\\\\", 2);
		else if (c < 0x20 || c >= 0x7f)
			kvt_sbuf_printf(b, "\\x%02x", c);
		else
			kvt_sbuf_add(b, (const char *)&c, 1);
	}
	kvt_sbuf_add(b, "\"", 1);
}

/* ---- JSON Schema -> grammar ---- */

#define LEVEL_MAX 6     /* nesting levels with their own indent bound; deeper ones share the last */
#define INDENT_STEP 4   /* indent bytes (spaces or tabs) allowed per level */

/* The rules of scalars: strings, numbers (bounded digits), the literals. */
static const char FIXED_RULES[] =
	"string ::= \"\\\"\" char* \"\\\"\"\n"
	"char ::= [^\"\\\\\\x00-\\x1f\\x7f-\\xff] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" hex hex hex hex ) | [\\xc2-\\xdf] cont"
	" | [\\xe0-\\xef] cont cont | [\\xf0-\\xf4] cont cont cont\n"
	"cont ::= [\\x80-\\xbf]\n"
	"hex ::= [0-9a-fA-F]\n"
	"int ::= \"0\" | [1-9] [0-9]{0,15}\n"
	"integer ::= \"-\"? int\n"
	"number ::= \"-\"? int ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?\n"
	"boolean ::= \"true\" | \"false\"\n"
	"null ::= \"null\"\n"
	"pchar ::= [\\x20-\\x21\\x23-\\x5b\\x5d-\\x7e]\n";

/*
 * The rules that do not depend on the schema. Per level L (1..LEVEL_MAX; a
 * value inside L brackets): wsL, the gap before a member or an item (none,
 * a space, or a newline and at most INDENT_STEP * L indent bytes); weL, the
 * gap before the bracket that closes such members (the indent one level
 * less). Per level L (0..LEVEL_MAX): valueL, objectL, arrayL, any JSON at
 * that level (an object's members one level in).
 */
static void common_rules(kvt_sbuf *b)
{
	for (int l = 1; l <= LEVEL_MAX; l++) {
		kvt_sbuf_printf(b, "ws%d ::= ( \" \" | \"\\n\" [ \\t]{0,%d} )?\n", l, INDENT_STEP * l);
		kvt_sbuf_printf(b, "we%d ::= ( \" \" | \"\\n\" [ \\t]{0,%d} )?\n", l, INDENT_STEP * (l - 1));
	}
	for (int l = 0; l <= LEVEL_MAX; l++) {
		int m = l < LEVEL_MAX ? l + 1 : LEVEL_MAX;
		kvt_sbuf_printf(b, "value%d ::= object%d | array%d | string | number | \"true\" | \"false\" | \"null\"\n", l,
				l, l);
		kvt_sbuf_printf(b,
				"object%d ::= \"{\" ( ws%d string \":\" \" \"? value%d ( \",\" ws%d string \":\" \" \"? value%d )* we%d"
				" | \" \"? ) \"}\"\n",
				l, m, m, m, m, m);
		kvt_sbuf_printf(b, "array%d ::= \"[\" ( ws%d value%d ( \",\" ws%d value%d )* we%d | \" \"? ) \"]\"\n", l, m,
				m, m, m, m);
	}
	kvt_sbuf_puts(b, FIXED_RULES);
}

typedef struct sref {
	char *ref;           /* the $ref string */
	int level;           /* the nesting level its rule is for */
	char name[24];       /* its rule */
} sref;

typedef struct sctx {
	json_t *root;
	kvt_sbuf out;            /* rules */
	uint32_t n_rules;
	sref *refs;
	uint32_t n_refs, cap_refs;
	const char *param;
	kvt_req_err *e;
	int depth;               /* schemas open (the nesting limit) */
	int level;               /* JSON nesting of the value being made: 0 the document, at most LEVEL_MAX */
} sctx;

static const char *const KNOWN_KEYS[] = {
	"type", "properties", "required", "additionalProperties", "enum", "const", "anyOf", "$defs",
	"definitions", "$ref", "items", "minItems", "maxItems", "minLength", "maxLength", "pattern",
	"title", "description", "default", "examples", "$schema", "$id", "$comment",
};

static void new_name(sctx *c, char name[24])
{
	snprintf(name, 24, "s%u", c->n_rules++);
}

/* The level of the members or items of a container made at the current level. */
static int level_in(const sctx *c)
{
	return c->level < LEVEL_MAX ? c->level + 1 : LEVEL_MAX;
}

static int gen(sctx *c, json_t *s, const char *path, char name[24]);

/* A JSON value as a grammar literal (enum / const). */
static int gen_literal(sctx *c, kvt_sbuf *x, json_t *v)
{
	char *d = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
	if (!d)
		return kvt_req_fail(c->e, c->param, NULL, "out of memory");
	sbuf_lit(x, d, strlen(d));
	free(d);
	return KVT_OK;
}

static int get_count(sctx *c, json_t *s, const char *key, const char *path, long long *out)
{
	json_t *v = json_object_get(s, key);
	if (!v)
		return KVT_OK;
	if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 10000)
		return kvt_req_fail(c->e, c->param, NULL, "'%s' at %s must be an integer in [0, 10000]", key, path);
	*out = json_integer_value(v);
	return KVT_OK;
}

/* ---- regex (pattern) -> grammar: the bytes of the JSON string's contents ---- */

typedef struct rx {
	const char *s, *end;
	sctx *c;
	const char *path;
	int depth;           /* groups open */
} rx;

static int rx_alt(rx *r, kvt_sbuf *x);

static int rx_fail(rx *r, const char *what)
{
	return kvt_req_fail(r->c->e, r->c->param, NULL, "'pattern' at %s: %s is not supported", r->path, what);
}

/* A byte class limited to printable ASCII that needs no JSON escape (no '"', '\\'). */
static void rx_emit_class(kvt_sbuf *x, const bool in[128])
{
	kvt_sbuf_add(x, "[", 1);
	for (int b = 0x20; b < 0x7f; b++) {
		if (!in[b] || b == '"' || b == '\\')
			continue;
		int e = b;
		while (e + 1 < 0x7f && in[e + 1] && e + 1 != '"' && e + 1 != '\\')
			e++;
		kvt_sbuf_printf(x, "\\x%02x", b);
		if (e > b)
			kvt_sbuf_printf(x, "-\\x%02x", e);
		b = e;
	}
	kvt_sbuf_add(x, "]", 1);
}

static bool rx_class_empty(const bool in[128])
{
	for (int b = 0x20; b < 0x7f; b++)
		if (in[b] && b != '"' && b != '\\')
			return false;
	return true;
}

/* \d \w \s and their negations into in[] (printable ASCII); false if c is not one of them. */
static bool rx_shorthand(char c, bool in[128])
{
	bool t[128] = { false };
	char lc = (char)(c | 0x20);
	if (lc != 'd' && lc != 'w' && lc != 's')
		return false;
	for (int b = 0x20; b < 0x7f; b++) {
		bool d = b >= '0' && b <= '9';
		bool w = d || (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || b == '_';
		t[b] = lc == 'd' ? d : lc == 'w' ? w : b == ' ';
		if (c != lc)
			t[b] = !t[b];
		in[b] = in[b] || t[b];
	}
	return true;
}

/* One literal byte of the pattern, as the JSON string bytes that stand for it. */
static int rx_lit(rx *r, kvt_sbuf *x, unsigned char ch)
{
	if (ch == '"')
		sbuf_lit(x, "\\\"", 2);
	else if (ch == '\\')
		sbuf_lit(x, "\\\\", 2);
	else if (ch == '\n')
		sbuf_lit(x, "\\n", 2);
	else if (ch == '\t')
		sbuf_lit(x, "\\t", 2);
	else if (ch < 0x20)
		return rx_fail(r, "a control character");
	else
		sbuf_lit(x, (const char *)&ch, 1);
	return KVT_OK;
}

static int rx_atom(rx *r, kvt_sbuf *x)
{
	unsigned char ch = (unsigned char)*r->s++;
	if (ch == '(') {
		if (++r->depth > 32)
			return rx_fail(r, "nesting groups deeper than 32");
		if (r->end - r->s >= 2 && r->s[0] == '?') {
			if (r->s[1] != ':')
				return rx_fail(r, "a lookaround or named group");
			r->s += 2;
		}
		kvt_sbuf_add(x, "( ", 2);
		if (rx_alt(r, x))
			return KVT_EINVAL;
		if (r->s >= r->end || *r->s != ')')
			return rx_fail(r, "an unclosed group");
		r->s++;
		r->depth--;
		kvt_sbuf_add(x, " )", 2);
		return KVT_OK;
	}
	if (ch == '[') {
		bool in[128] = { false }, neg = false;
		if (r->s < r->end && *r->s == '^') {
			neg = true;
			r->s++;
		}
		bool first = true;
		while (r->s < r->end && (*r->s != ']' || first)) {
			first = false;
			unsigned char a = (unsigned char)*r->s++;
			if (a == '\\' && r->s < r->end) {
				char esc = *r->s++;
				if (rx_shorthand(esc, in))
					continue;
				a = esc == 'n' ? '\n' : esc == 't' ? '\t' : (unsigned char)esc;
			}
			unsigned char b = a;
			if (r->end - r->s >= 2 && r->s[0] == '-' && r->s[1] != ']') {
				r->s++;
				b = (unsigned char)*r->s++;
				if (b == '\\' && r->s < r->end)
					b = (unsigned char)*r->s++;
			}
			if (a >= 0x80 || b >= 0x80)
				return rx_fail(r, "a non-ASCII character class");
			for (unsigned k = a; k <= b; k++)
				in[k] = true;
		}
		if (r->s >= r->end)
			return rx_fail(r, "an unclosed class");
		r->s++;
		if (neg)
			for (int k = 0; k < 128; k++)
				in[k] = !in[k];
		if (rx_class_empty(in))
			return rx_fail(r, "a class of only characters that need escaping");
		rx_emit_class(x, in);
		return KVT_OK;
	}
	if (ch == '.') {
		kvt_sbuf_puts(x, "pchar");
		return KVT_OK;
	}
	if (ch == '\\') {
		if (r->s >= r->end)
			return rx_fail(r, "a trailing backslash");
		char esc = *r->s++;
		bool in[128] = { false };
		if (rx_shorthand(esc, in)) {
			rx_emit_class(x, in);
			return KVT_OK;
		}
		if ((esc >= '0' && esc <= '9') || esc == 'b' || esc == 'B' || esc == 'p' || esc == 'P' || esc == 'u' ||
		    esc == 'x' || esc == 'k')
			return rx_fail(r, "this escape");
		return rx_lit(r, x, esc == 'n' ? '\n' : esc == 't' ? '\t' : (unsigned char)esc);
	}
	if (ch == '^' || ch == '$')
		return rx_fail(r, "an anchor inside the pattern");
	if (ch == ')' || ch == '*' || ch == '+' || ch == '?' || ch == '{' || ch == '|')
		return rx_fail(r, "a misplaced operator");
	if (ch >= 0x80) { /* a UTF-8 character: its bytes */
		kvt_sbuf_add(x, "\"", 1);
		kvt_sbuf_printf(x, "\\x%02x", ch);
		while (r->s < r->end && ((unsigned char)*r->s & 0xc0) == 0x80)
			kvt_sbuf_printf(x, "\\x%02x", (unsigned char)*r->s++);
		kvt_sbuf_add(x, "\"", 1);
		return KVT_OK;
	}
	return rx_lit(r, x, ch);
}

static int rx_seq(rx *r, kvt_sbuf *x)
{
	bool any = false;
	while (r->s < r->end && *r->s != '|' && *r->s != ')') {
		if (*r->s == '$' && r->s + 1 == r->end)
			break;
		kvt_sbuf a = { 0 };
		if (rx_atom(r, &a)) {
			free(a.p);
			return KVT_EINVAL;
		}
		kvt_sbuf_add(x, "( ", 2);
		kvt_sbuf_add(x, a.p ? a.p : "\"\"", a.p ? a.n : 2);
		kvt_sbuf_add(x, " )", 2);
		free(a.p);
		if (r->s < r->end && (*r->s == '*' || *r->s == '+' || *r->s == '?')) {
			kvt_sbuf_add(x, r->s, 1);
			r->s++;
		} else if (r->s < r->end && *r->s == '{') {
			const char *q = r->s + 1;
			while (q < r->end && ((*q >= '0' && *q <= '9') || *q == ','))
				q++;
			if (q >= r->end || *q != '}' || q == r->s + 1)
				return rx_fail(r, "a malformed {m,n}");
			kvt_sbuf_add(x, r->s, (size_t)(q - r->s + 1));
			r->s = q + 1;
		}
		if (r->s < r->end && *r->s == '?') /* lazy: the same language */
			r->s++;
		kvt_sbuf_add(x, " ", 1);
		any = true;
	}
	if (!any)
		kvt_sbuf_add(x, "\"\"", 2);
	return KVT_OK;
}

static int rx_alt(rx *r, kvt_sbuf *x)
{
	for (;;) {
		if (rx_seq(r, x))
			return KVT_EINVAL;
		if (r->s < r->end && *r->s == '|') {
			r->s++;
			kvt_sbuf_add(x, " | ", 3);
			continue;
		}
		return KVT_OK;
	}
}

static int gen_pattern(sctx *c, kvt_sbuf *x, const char *pat, size_t n, const char *path)
{
	rx r = { pat, pat + n, c, path, 0 };
	if (n > 1024)
		return kvt_req_fail(c->e, c->param, NULL, "'pattern' at %s is longer than 1024 bytes", path);
	bool start = n && pat[0] == '^', end = n && pat[n - 1] == '$' && (n < 2 || pat[n - 2] != '\\');
	if (start)
		r.s++;
	kvt_sbuf body = { 0 };
	if (rx_alt(&r, &body)) {
		free(body.p);
		return KVT_EINVAL;
	}
	if (r.s < r.end && !(end && r.s + 1 == r.end)) {
		free(body.p);
		return rx_fail(&r, "an unbalanced ')'");
	}
	kvt_sbuf_puts(x, "\"\\\"\" ");
	if (!start)
		kvt_sbuf_puts(x, "char* ");
	kvt_sbuf_puts(x, "( ");
	kvt_sbuf_add(x, body.p ? body.p : "", body.n);
	kvt_sbuf_puts(x, " ) ");
	if (!end)
		kvt_sbuf_puts(x, "char* ");
	kvt_sbuf_puts(x, "\"\\\"\"");
	free(body.p);
	return body.failed ? kvt_req_fail(c->e, c->param, NULL, "out of memory") : 0;
}

/* ---- schema nodes ---- */

static int gen_object(sctx *c, json_t *s, kvt_sbuf *x, const char *path)
{
	json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
	json_t *ap = json_object_get(s, "additionalProperties");
	if (ap && !json_is_boolean(ap))
		return kvt_req_fail(c->e, c->param, NULL, "'additionalProperties' at %s: only false or true is supported, not a schema",
			     path);
	if (req && !json_is_array(req))
		return kvt_req_fail(c->e, c->param, NULL, "'required' at %s must be an array of property names", path);
	if (!props || (json_is_object(props) && json_object_size(props) == 0)) {
		if (req && json_array_size(req))
			return kvt_req_fail(c->e, c->param, NULL, "'required' at %s names properties, but there are none", path);
		if (json_is_false(ap) || props)
			kvt_sbuf_puts(x, "\"{\" \" \"? \"}\"");
		else
			kvt_sbuf_printf(x, "object%d", c->level);
		return KVT_OK;
	}
	if (!json_is_object(props))
		return kvt_req_fail(c->e, c->param, NULL, "'properties' at %s must be an object", path);
	size_t n = json_object_size(props), i = 0;
	char (*vn)[24] = calloc(n, 24);
	bool *required = calloc(n, 1);
	const char **keys = calloc(n, sizeof(char *));
	size_t *key_lens = calloc(n, sizeof(size_t)); /* a property name may hold NUL bytes */
	int ret = KVT_EINVAL;
	if (!vn || !required || !keys || !key_lens) {
		kvt_req_fail(c->e, c->param, NULL, "out of memory");
		goto out;
	}
	const char *k;
	size_t k_len;
	json_t *v;
	const int outer = c->level, m = level_in(c);
	json_object_keylen_foreach(props, k, k_len, v)
	{
		char sub[256];
		snprintf(sub, sizeof(sub), "%s/properties/%s", path, k);
		keys[i] = k;
		key_lens[i] = k_len;
		c->level = m;
		int rc = gen(c, v, sub, vn[i]);
		c->level = outer;
		if (rc)
			goto out;
		i++;
	}
	size_t ri;
	json_t *rv;
	json_array_foreach(req, ri, rv)
	{
		bool found = false;
		for (size_t j = 0; j < n && json_is_string(rv); j++)
			if (key_lens[j] == json_string_length(rv) && !memcmp(keys[j], json_string_value(rv), key_lens[j]))
				required[j] = found = true;
		if (!found) {
			kvt_req_fail(c->e, c->param, NULL, "'required' at %s names %s%s%s, which is not in 'properties'", path,
			      json_is_string(rv) ? "'" : "", json_is_string(rv) ? json_string_value(rv) : "a non-string",
			      json_is_string(rv) ? "'" : "");
			goto out;
		}
	}
	/*
	 * R(i, first) ::= [","] gap member_i R(i + 1, false) | R(i + 1, first) when member i is optional;
	 * R(n, false) is the gap before "}", R(n, true) (no member at all) at most a space
	 */
	char base[24];
	new_name(c, base);
	for (size_t j = n + 1; j-- > 0;) {
		for (int first = 0; first < 2; first++) {
			kvt_sbuf_printf(&c->out, "%s-%zu-%d ::= ", base, j, first);
			if (j == n) {
				if (first)
					kvt_sbuf_puts(&c->out, "\" \"?\n");
				else
					kvt_sbuf_printf(&c->out, "we%d\n", m);
				continue;
			}
			kvt_sbuf_printf(&c->out, "%sws%d ", first ? "" : "\",\" ", m);
			json_t *ks = json_stringn(keys[j], key_lens[j]);
			char *kd = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
			json_decref(ks);
			if (!kd) {
				kvt_req_fail(c->e, c->param, NULL, "out of memory");
				goto out;
			}
			sbuf_lit(&c->out, kd, strlen(kd));
			free(kd);
			kvt_sbuf_printf(&c->out, " \":\" \" \"? %s %s-%zu-0", vn[j], base, j + 1);
			if (!required[j])
				kvt_sbuf_printf(&c->out, " | %s-%zu-%d", base, j + 1, first);
			kvt_sbuf_puts(&c->out, "\n");
		}
	}
	kvt_sbuf_printf(x, "\"{\" %s-0-1 \"}\"", base);
	ret = KVT_OK;
out:
	free(vn);
	free(required);
	free(keys);
	free(key_lens);
	return ret;
}

static int gen_type(sctx *c, json_t *s, const char *type, kvt_sbuf *x, const char *path)
{
	if (!strcmp(type, "object"))
		return gen_object(c, s, x, path);
	if (!strcmp(type, "array")) {
		json_t *items = json_object_get(s, "items");
		const int outer = c->level, m = level_in(c);
		char item[24];
		long long mn = 0, mx = -1;
		snprintf(item, sizeof(item), "value%d", m);
		if (get_count(c, s, "minItems", path, &mn) || get_count(c, s, "maxItems", path, &mx))
			return KVT_EINVAL;
		if (mx >= 0 && mx < mn)
			return kvt_req_fail(c->e, c->param, NULL, "'maxItems' at %s is below 'minItems'", path);
		if (items) {
			char sub[256];
			snprintf(sub, sizeof(sub), "%s/items", path);
			if (json_is_array(items))
				return kvt_req_fail(c->e, c->param, NULL, "'items' at %s: an array of schemas (tuple) is not supported", path);
			c->level = m;
			int rc = gen(c, items, sub, item);
			c->level = outer;
			if (rc)
				return KVT_EINVAL;
		}
		/* "[" gap item ( "," gap item ){...} gap "]", or (none required) "[" " "? "]" */
		if (mx == 0)
			kvt_sbuf_puts(x, "\"[\" \" \"? \"]\"");
		else if (mn == 0 && mx < 0)
			kvt_sbuf_printf(x, "\"[\" ( ws%d %s ( \",\" ws%d %s )* we%d | \" \"? ) \"]\"", m, item, m, item, m);
		else if (mn == 0)
			kvt_sbuf_printf(x, "\"[\" ( ws%d %s ( \",\" ws%d %s ){0,%lld} we%d | \" \"? ) \"]\"", m, item, m, item,
					mx - 1, m);
		else if (mx < 0)
			kvt_sbuf_printf(x, "\"[\" ws%d %s ( \",\" ws%d %s ){%lld,} we%d \"]\"", m, item, m, item, mn - 1, m);
		else
			kvt_sbuf_printf(x, "\"[\" ws%d %s ( \",\" ws%d %s ){%lld,%lld} we%d \"]\"", m, item, m, item, mn - 1,
					mx - 1, m);
		return KVT_OK;
	}
	if (!strcmp(type, "string")) {
		json_t *pat = json_object_get(s, "pattern");
		long long mn = 0, mx = -1;
		if (get_count(c, s, "minLength", path, &mn) || get_count(c, s, "maxLength", path, &mx))
			return KVT_EINVAL;
		if (pat) {
			if (!json_is_string(pat))
				return kvt_req_fail(c->e, c->param, NULL, "'pattern' at %s must be a string", path);
			if (json_object_get(s, "minLength") || json_object_get(s, "maxLength"))
				return kvt_req_fail(c->e, c->param, NULL, "'pattern' with 'minLength' / 'maxLength' at %s is not supported",
					     path);
			return gen_pattern(c, x, json_string_value(pat), json_string_length(pat), path);
		}
		if (mx >= 0 && mx < mn)
			return kvt_req_fail(c->e, c->param, NULL, "'maxLength' at %s is below 'minLength'", path);
		if (mx >= 0)
			kvt_sbuf_printf(x, "\"\\\"\" char{%lld,%lld} \"\\\"\"", mn, mx);
		else if (mn > 0)
			kvt_sbuf_printf(x, "\"\\\"\" char{%lld,} \"\\\"\"", mn);
		else
			kvt_sbuf_puts(x, "string");
		return KVT_OK;
	}
	if (!strcmp(type, "number") || !strcmp(type, "integer") || !strcmp(type, "boolean") || !strcmp(type, "null")) {
		kvt_sbuf_puts(x, type);
		return KVT_OK;
	}
	return kvt_req_fail(c->e, c->param, NULL, "'type' at %s: unknown type '%s'", path, type);
}

/* Resolve a $ref (a JSON pointer into the root: "#", "#/$defs/x", ...). */
static json_t *resolve(sctx *c, const char *ref)
{
	if (ref[0] != '#')
		return NULL;
	json_t *cur = c->root;
	const char *p = ref + 1;
	while (*p == '/') {
		p++;
		char seg[256];
		size_t n = 0;
		while (*p && *p != '/' && n + 1 < sizeof(seg)) {
			if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) {
				seg[n++] = p[1] == '0' ? '~' : '/';
				p += 2;
			} else {
				seg[n++] = *p++;
			}
		}
		seg[n] = 0;
		if (!json_is_object(cur) || !(cur = json_object_get(cur, seg)))
			return NULL;
	}
	return *p ? NULL : cur;
}

static int gen(sctx *c, json_t *s, const char *path, char name[24])
{
	if (json_is_true(s) || (json_is_object(s) && json_object_size(s) == 0)) {
		snprintf(name, 24, "value%d", c->level);
		return KVT_OK;
	}
	if (!json_is_object(s))
		return kvt_req_fail(c->e, c->param, NULL, "the schema at %s must be an object", path);
	if (++c->depth > 64) {
		c->depth--;
		return kvt_req_fail(c->e, c->param, NULL, "the schema at %s nests deeper than 64", path);
	}
	const char *k;
	size_t k_len;
	json_t *v;
	json_object_keylen_foreach(s, k, k_len, v)
	{
		bool known = false;
		for (size_t i = 0; i < sizeof(KNOWN_KEYS) / sizeof(KNOWN_KEYS[0]) && !known; i++)
			known = k_len == strlen(KNOWN_KEYS[i]) && !strcmp(k, KNOWN_KEYS[i]);
		if (!known) {
			c->depth--;
			return kvt_req_fail(c->e, c->param, NULL,
				     "schema keyword '%s%s' (at %s) is not supported; supported: type, properties, required, "
				     "additionalProperties, enum, const, anyOf, $defs, $ref, items, minItems, maxItems, "
				     "minLength, maxLength, pattern",
				     k, k_len != strlen(k) ? "\\u0000..." : "", path);
		}
	}
	kvt_sbuf x = { 0 };
	int rc = KVT_OK;
	json_t *ref = json_object_get(s, "$ref"), *cst = json_object_get(s, "const"), *en = json_object_get(s, "enum");
	json_t *any = json_object_get(s, "anyOf"), *type = json_object_get(s, "type");
	if (ref) {
		if (!json_is_string(ref)) {
			rc = kvt_req_fail(c->e, c->param, NULL, "'$ref' at %s must be a string", path);
			goto out;
		}
		const char *rs = json_string_value(ref);
		if (strlen(rs) != json_string_length(ref)) {
			rc = kvt_req_fail(c->e, c->param, NULL, "'$ref' at %s holds U+0000, which kvtier's pointers do not follow",
					  path);
			goto out;
		}
		/* one rule per ($ref, level): the indent bound differs by level (recursion stops at LEVEL_MAX) */
		for (uint32_t i = 0; i < c->n_refs; i++)
			if (c->refs[i].level == c->level && !strcmp(c->refs[i].ref, rs)) {
				snprintf(name, 24, "%s", c->refs[i].name);
				goto out;
			}
		json_t *target = resolve(c, rs);
		if (!target) {
			rc = kvt_req_fail(c->e, c->param, NULL, "'$ref' at %s: '%s' does not resolve (a '#/...' pointer into this schema)",
				   path, rs);
			goto out;
		}
		if (c->n_refs == c->cap_refs) {
			sref *nr = realloc(c->refs, (c->cap_refs * 2 + 4) * sizeof(sref));
			if (!nr) {
				rc = kvt_req_fail(c->e, c->param, NULL, "out of memory");
				goto out;
			}
			c->refs = nr;
			c->cap_refs = c->cap_refs * 2 + 4;
		}
		if (!(c->refs[c->n_refs].ref = strdup(rs))) {
			rc = kvt_req_fail(c->e, c->param, NULL, "out of memory");
			goto out;
		}
		sref *me = &c->refs[c->n_refs++];
		me->level = c->level;
		new_name(c, me->name);
		char tname[24], my[24];
		snprintf(my, sizeof(my), "%s", me->name);
		snprintf(name, 24, "%s", my);
		if ((rc = gen(c, target, rs, tname)))
			goto out;
		kvt_sbuf_printf(&c->out, "%s ::= %s\n", my, tname);
		goto out;
	}
	if (cst) {
		rc = gen_literal(c, &x, cst);
	} else if (en) {
		if (!json_is_array(en) || !json_array_size(en) || json_array_size(en) > 256) {
			rc = kvt_req_fail(c->e, c->param, NULL, "'enum' at %s must be an array of 1-256 values", path);
			goto out;
		}
		size_t i;
		json_t *ev;
		json_array_foreach(en, i, ev)
		{
			if (i)
				kvt_sbuf_puts(&x, " | ");
			if ((rc = gen_literal(c, &x, ev)))
				goto out;
		}
	} else if (any) {
		if (!json_is_array(any) || !json_array_size(any) || json_array_size(any) > 64) {
			rc = kvt_req_fail(c->e, c->param, NULL, "'anyOf' at %s must be an array of 1-64 schemas", path);
			goto out;
		}
		size_t i;
		json_t *av;
		json_array_foreach(any, i, av)
		{
			char sub[256], an[24];
			snprintf(sub, sizeof(sub), "%s/anyOf/%zu", path, i);
			if ((rc = gen(c, av, sub, an)))
				goto out;
			kvt_sbuf_printf(&x, "%s%s", i ? " | " : "", an);
		}
	} else if (json_is_string(type)) {
		rc = gen_type(c, s, json_string_value(type), &x, path);
	} else if (json_is_array(type) && json_array_size(type)) {
		size_t i;
		json_t *tv;
		json_array_foreach(type, i, tv)
		{
			if (!json_is_string(tv)) {
				rc = kvt_req_fail(c->e, c->param, NULL, "'type' at %s must be a string or an array of strings", path);
				goto out;
			}
			kvt_sbuf_puts(&x, i ? " | ( " : "( ");
			if ((rc = gen_type(c, s, json_string_value(tv), &x, path)))
				goto out;
			kvt_sbuf_puts(&x, " )");
		}
	} else if (type) {
		rc = kvt_req_fail(c->e, c->param, NULL, "'type' at %s must be a string or an array of strings", path);
	} else if (json_object_get(s, "properties")) {
		rc = gen_type(c, s, "object", &x, path);
	} else if (json_object_get(s, "items")) {
		rc = gen_type(c, s, "array", &x, path);
	} else {
		kvt_sbuf_printf(&x, "value%d", c->level);
	}
	if (!rc) {
		new_name(c, name);
		kvt_sbuf_printf(&c->out, "%s ::= %s\n", name, x.p ? x.p : "\"\"");
	}
out:
	if (!rc && x.failed)
		rc = kvt_req_fail(c->e, c->param, NULL, "out of memory");
	free(x.p);
	c->depth--;
	return rc;
}

/* Grammar text: root ::= <start>, the schema's rules, the common ones. */
static int schema_text(json_t *schema, const char *param, const char *prefix, char **text, kvt_req_err *e,
		       sctx *c)
{
	char top[24];
	c->root = schema;
	c->param = param;
	c->e = e;
	(void)prefix;
	if (gen(c, schema, "#", top))
		return KVT_EINVAL;
	kvt_sbuf_printf(&c->out, "root ::= %s\n", top);
	common_rules(&c->out);
	if (c->out.failed)
		return kvt_req_fail(e, param, NULL, "out of memory");
	*text = c->out.p;
	c->out.p = NULL;
	return KVT_OK;
}

static void sctx_free(sctx *c)
{
	for (uint32_t i = 0; i < c->n_refs; i++)
		free(c->refs[i].ref);
	free(c->refs);
	free(c->out.p);
}

int kvt_schema_grammar(json_t *schema, const char *param, char **text, kvt_req_err *e)
{
	sctx c = { 0 };
	int rc = schema_text(schema, param, "", text, e, &c);
	sctx_free(&c);
	return rc;
}

static int compile(const char *text, const char *param, kvt_grammar **g, kvt_req_err *e)
{
	char err[256];
	int rc = kvt_grammar_compile(text, strlen(text), "root", g, err, sizeof(err));
	if (rc == KVT_ENOMEM)
		return kvt_req_fail(e, param, NULL, "out of memory compiling the schema");
	if (rc) { /* a schema the subset allows but the grammar refuses (a $ref cycle with no progress) */
		KVT_LOGW("structured: schema grammar refused: %s", err);
		return kvt_req_fail(e, param, NULL, "the schema cannot be enforced: %s", err);
	}
	return KVT_OK;
}

int kvt_oai_response_format(json_t *rf, kvt_grammar **g, kvt_req_err *e)
{
	*g = NULL;
	if (!rf || json_is_null(rf))
		return KVT_OK;
	json_t *type = json_object_get(rf, "type");
	if (!json_is_object(rf) || !json_is_string(type))
		return kvt_req_fail(e, "response_format", NULL, "'response_format' must be an object with a 'type'");
	const char *t = json_string_value(type);
	if (!strcmp(t, "text"))
		return KVT_OK;
	if (!strcmp(t, "json_object")) {
		kvt_sbuf b = { 0 };
		kvt_sbuf_puts(&b, "root ::= object0\n");
		common_rules(&b);
		int rc = b.failed ? kvt_req_fail(e, "response_format", NULL, "out of memory") : compile(b.p, "response_format", g, e);
		free(b.p);
		return rc;
	}
	if (strcmp(t, "json_schema"))
		return kvt_req_fail(e, "response_format.type", NULL,
			     "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\" (got \"%s\")", t);
	json_t *js = json_object_get(rf, "json_schema");
	if (!json_is_object(js))
		return kvt_req_fail(e, "response_format.json_schema", NULL, "'response_format.json_schema' must be an object");
	json_t *name = json_object_get(js, "name"), *schema = json_object_get(js, "schema"),
	       *strict = json_object_get(js, "strict");
	if (!json_is_string(name) || !json_string_length(name) || json_string_length(name) > 64)
		return kvt_req_fail(e, "response_format.json_schema.name", NULL,
			     "'response_format.json_schema.name' must be a string of 1-64 characters");
	if (strict && !json_is_null(strict) && !json_is_boolean(strict))
		return kvt_req_fail(e, "response_format.json_schema.strict", NULL, "'response_format.json_schema.strict' must be a boolean");
	if (!schema || json_is_null(schema))
		schema = json_true(); /* OpenAI: no schema is any JSON */
	char *text = NULL;
	const char *param = "response_format.json_schema.schema";
	if (kvt_schema_grammar(schema, param, &text, e))
		return KVT_EINVAL;
	int rc = compile(text, param, g, e);
	free(text);
	return rc;
}

/* ---- tools ---- */

static bool valid_fn_name(const char *s, size_t n)
{
	if (!n || n > 64)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
			return false;
	}
	return true;
}

static const char *fn_name(json_t *tool)
{
	return json_string_value(json_object_get(json_object_get(tool, "function"), "name"));
}

static int tools_grammar(kvt_oai_tools *t, kvt_req_err *e)
{
	sctx c = { 0 };
	c.root = NULL;
	c.e = e;
	c.level = 1; /* the arguments are a member of the call's object */
	int rc = KVT_EINVAL;
	kvt_sbuf alts = { 0 };
	size_t i;
	json_t *tool;
	json_array_foreach(t->tools, i, tool)
	{
		const char *name = fn_name(tool);
		if (t->choice == KVT_TOOLS_NAMED && strcmp(name, t->named))
			continue;
		json_t *params = json_object_get(json_object_get(tool, "function"), "parameters");
		char param[64], pn[24] = "s-empty";
		snprintf(param, sizeof(param), "tools[%zu].function.parameters", i);
		c.param = param;
		c.root = params;
		if (params && !json_is_null(params)) {
			/* each function's $refs point into its own parameters */
			for (uint32_t k = 0; k < c.n_refs; k++)
				free(c.refs[k].ref);
			c.n_refs = 0;
			if (gen(&c, params, "#", pn))
				goto out;
		}
		char fr[24];
		new_name(&c, fr);
		kvt_sbuf_printf(&c.out, "%s ::= ", fr);
		char lit[160];
		snprintf(lit, sizeof(lit), "\"%s\", \"arguments\": ", name);
		sbuf_lit(&c.out, lit, strlen(lit));
		kvt_sbuf_printf(&c.out, " %s\n", pn);
		kvt_sbuf_printf(&alts, "%s%s", alts.n ? " | " : "", fr);
	}
	kvt_sbuf_puts(&c.out, "s-empty ::= \"{}\"\n");
	kvt_sbuf_printf(&c.out, "call ::= \"<tool_call>\\n{\\\"name\\\": \" ( %s ) \"}\\n</tool_call>\"\n", alts.p ? alts.p : "s-empty");
	/* a named function is one call (OpenAI: the model calls that function); required calls may repeat */
	kvt_sbuf_puts(&c.out, t->parallel && t->choice == KVT_TOOLS_REQUIRED ? "root ::= call ( \"\\n\" call )*\n" : "root ::= call\n");
	common_rules(&c.out);
	if (c.out.failed || alts.failed) {
		kvt_req_fail(e, "tools", NULL, "out of memory");
		goto out;
	}
	rc = compile(c.out.p, "tools", &t->g, e);
out:
	free(alts.p);
	sctx_free(&c);
	return rc;
}

int kvt_oai_tools_parse(json_t *body, kvt_oai_tools *t, kvt_req_err *e)
{
	memset(t, 0, sizeof(*t));
	t->parallel = true;
	json_t *tools = json_object_get(body, "tools"), *tc = json_object_get(body, "tool_choice"),
	       *ptc = json_object_get(body, "parallel_tool_calls");
	if (json_object_get(body, "functions") || json_object_get(body, "function_call"))
		return kvt_req_fail(e, json_object_get(body, "functions") ? "functions" : "function_call", NULL,
				    "'functions' and 'function_call' are the deprecated forms: send 'tools' and 'tool_choice'");
	if (ptc && !json_is_null(ptc)) {
		if (!json_is_boolean(ptc))
			return kvt_req_fail(e, "parallel_tool_calls", NULL, "'parallel_tool_calls' must be a boolean");
		t->parallel = json_is_true(ptc);
	}
	if (tools && !json_is_null(tools)) {
		if (!json_is_array(tools))
			return kvt_req_fail(e, "tools", NULL, "'tools' must be an array");
		size_t i;
		json_t *tool;
		json_array_foreach(tools, i, tool)
		{
			char param[64];
			snprintf(param, sizeof(param), "tools[%zu]", i);
			json_t *type = json_object_get(tool, "type"), *fn = json_object_get(tool, "function");
			if (!json_is_object(tool) || !json_is_string(type) || strcmp(json_string_value(type), "function"))
				return kvt_req_fail(e, param, NULL, "'%s' must be {\"type\": \"function\", \"function\": {...}}", param);
			json_t *name = json_object_get(fn, "name"), *params = json_object_get(fn, "parameters");
			if (!json_is_object(fn) || !json_is_string(name) ||
			    !valid_fn_name(json_string_value(name), json_string_length(name)))
				return kvt_req_fail(e, param, NULL, "'%s.function.name' must be 1-64 characters of [a-zA-Z0-9_-]", param);
			if (params && !json_is_null(params) && !json_is_object(params))
				return kvt_req_fail(e, param, NULL, "'%s.function.parameters' must be a JSON Schema object", param);
			for (size_t j = 0; j < i; j++)
				if (!strcmp(fn_name(json_array_get(tools, j)), json_string_value(name)))
					return kvt_req_fail(e, param, NULL, "'%s': function '%s' is defined twice", param,
						     json_string_value(name));
		}
		if (json_array_size(tools))
			t->tools = json_incref(tools);
	}
	t->choice = t->tools ? KVT_TOOLS_AUTO : KVT_TOOLS_NONE;
	if (tc && !json_is_null(tc)) {
		if (json_is_string(tc)) {
			const char *s = json_string_value(tc);
			if (!strcmp(s, "none"))
				t->choice = KVT_TOOLS_NONE;
			else if (!strcmp(s, "auto"))
				t->choice = t->tools ? KVT_TOOLS_AUTO : KVT_TOOLS_NONE;
			else if (!strcmp(s, "required"))
				t->choice = KVT_TOOLS_REQUIRED;
			else
				return kvt_req_fail(e, "tool_choice", NULL, "'tool_choice' must be \"none\", \"auto\", \"required\" or "
							       "{\"type\": \"function\", \"function\": {\"name\": ...}}");
		} else {
			json_t *name = json_object_get(json_object_get(tc, "function"), "name");
			if (!json_is_object(tc) || !json_is_string(name))
				return kvt_req_fail(e, "tool_choice", NULL, "'tool_choice' must be \"none\", \"auto\", \"required\" or "
							       "{\"type\": \"function\", \"function\": {\"name\": ...}}");
			t->choice = KVT_TOOLS_NAMED;
			snprintf(t->named, sizeof(t->named), "%s", json_string_value(name));
			bool found = false;
			for (size_t j = 0; t->tools && j < json_array_size(t->tools) && !found; j++)
				found = !strcmp(fn_name(json_array_get(t->tools, j)), t->named);
			if (!found)
				return kvt_req_fail(e, "tool_choice", NULL, "'tool_choice' names function '%s', which is not in 'tools'",
					     json_string_value(name));
		}
		if (t->choice == KVT_TOOLS_REQUIRED && !t->tools)
			return kvt_req_fail(e, "tool_choice", NULL, "'tool_choice' is \"required\" but there are no 'tools'");
	}
	if (t->choice == KVT_TOOLS_REQUIRED || t->choice == KVT_TOOLS_NAMED)
		return tools_grammar(t, e);
	return KVT_OK;
}

void kvt_oai_tools_deinit(kvt_oai_tools *t)
{
	json_decref(t->tools);
	kvt_grammar_unref(t->g);
	t->tools = NULL;
	t->g = NULL;
}

char *kvt_oai_tools_prompt(const kvt_oai_tools *t)
{
	if (!t->tools || t->choice == KVT_TOOLS_NONE)
		return NULL;
	kvt_sbuf b = { 0 };
	kvt_sbuf_puts(&b, "You can call functions. Their signatures (JSON Schema), one per line:\n<tools>\n");
	size_t i;
	json_t *tool;
	json_array_foreach(t->tools, i, tool)
	{
		char *d = json_dumps(tool, JSON_COMPACT);
		if (d)
			kvt_sbuf_puts(&b, d);
		else
			b.failed = true;
		free(d);
		kvt_sbuf_puts(&b, "\n");
	}
	/* NOTE: the same text whatever tool_choice says (the grammar enforces required and named), so
	 * the turns of a tool conversation share their prompt's prefix and its cached blocks */
	kvt_sbuf_puts(&b, "</tools>\nTo call a function, answer with this block, one per call:\n<tool_call>\n"
		    "{\"name\": \"FUNCTION\", \"arguments\": {ARGUMENTS AS JSON}}\n</tool_call>\n"
		    "When no function is needed, answer in plain text.");
	if (b.failed) {
		free(b.p);
		return NULL;
	}
	return b.p;
}

int kvt_oai_message(json_t *m, size_t idx, bool *special, const char **role, char **text, size_t *n_text,
		    kvt_req_err *e)
{
	*special = false;
	json_t *r = json_object_get(m, "role"), *calls = json_object_get(m, "tool_calls"),
	       *content = json_object_get(m, "content");
	const char *rs = json_string_value(r);
	char param[64];
	if (!rs)
		return KVT_OK;
	kvt_sbuf b = { 0 };
	if (!strcmp(rs, "tool")) {
		json_t *id = json_object_get(m, "tool_call_id");
		snprintf(param, sizeof(param), "messages[%zu].tool_call_id", idx);
		if (id && !json_is_null(id) && !json_is_string(id))
			return kvt_req_fail(e, param, NULL, "'%s' must be a string", param);
		snprintf(param, sizeof(param), "messages[%zu].content", idx);
		kvt_sbuf_puts(&b, "<tool_response>\n");
		if (kvt_req_content(&b, content, param, e)) {
			free(b.p);
			return KVT_EINVAL;
		}
		kvt_sbuf_puts(&b, "\n</tool_response>");
		*role = "user";
	} else if (!strcmp(rs, "assistant") && calls && !json_is_null(calls)) {
		snprintf(param, sizeof(param), "messages[%zu].tool_calls", idx);
		if (!json_is_array(calls))
			return kvt_req_fail(e, param, NULL, "'%s' must be an array", param);
		kvt_sbuf_add(&b, "", 0);
		char cparam[64];
		snprintf(cparam, sizeof(cparam), "messages[%zu].content", idx);
		if (content && !json_is_null(content) && kvt_req_content(&b, content, cparam, e)) {
			free(b.p);
			return KVT_EINVAL;
		}
		size_t k;
		json_t *call;
		json_array_foreach(calls, k, call)
		{
			json_t *fn = json_object_get(call, "function"), *name = json_object_get(fn, "name"),
			       *args = json_object_get(fn, "arguments");
			if (!json_is_object(call) || !json_is_string(name) || (args && !json_is_string(args) && !json_is_null(args))) {
				free(b.p);
				return kvt_req_fail(e, param, NULL, "'%s[%zu]' must be {\"id\", \"type\": \"function\", \"function\": "
						       "{\"name\": string, \"arguments\": string}}", param, k);
			}
			if (b.n)
				kvt_sbuf_puts(&b, "\n");
			kvt_sbuf_puts(&b, "<tool_call>\n{\"name\": \"");
			kvt_sbuf_add(&b, json_string_value(name), json_string_length(name));
			kvt_sbuf_puts(&b, "\", \"arguments\": ");
			if (json_is_string(args) && json_string_length(args))
				kvt_sbuf_add(&b, json_string_value(args), json_string_length(args));
			else
				kvt_sbuf_puts(&b, "{}");
			kvt_sbuf_puts(&b, "}\n</tool_call>");
		}
		*role = "assistant";
	} else {
		return KVT_OK;
	}
	if (b.failed) {
		free(b.p);
		return kvt_req_fail(e, "messages", NULL, "out of memory");
	}
	*text = b.p;
	*n_text = b.n;
	*special = true;
	return KVT_OK;
}

static const char CALL_OPEN[] = "<tool_call>", CALL_CLOSE[] = "</tool_call>";

size_t kvt_oai_content_ready(const char *text, size_t n)
{
	const char *p = text ? memmem(text, n, CALL_OPEN, sizeof(CALL_OPEN) - 1) : NULL;
	if (p)
		n = (size_t)(p - text);
	/* hold back what could be the start of a call */
	for (size_t k = sizeof(CALL_OPEN) - 2; k > 0; k--)
		if (n >= k && !memcmp(text + n - k, CALL_OPEN, k))
			return n - k;
	return n;
}

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

json_t *kvt_oai_tool_calls(const kvt_oai_tools *t, const char *text, size_t n, size_t *content_len)
{
	const char *p = text ? memmem(text, n, CALL_OPEN, sizeof(CALL_OPEN) - 1) : NULL;
	if (!p || !t->tools)
		return NULL;
	size_t cl = (size_t)(p - text);
	while (cl && is_ws(text[cl - 1]))
		cl--;
	json_t *calls = json_array();
	const char *end = text + n;
	while (p) {
		p += sizeof(CALL_OPEN) - 1;
		json_error_t err;
		json_t *obj = json_loadb(p, (size_t)(end - p), JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY, &err);
		const size_t obj_len = obj ? err.position : 0;
		json_t *name = json_object_get(obj, "name"), *args = json_object_get(obj, "arguments");
		bool known = false;
		for (size_t j = 0; json_is_string(name) && j < json_array_size(t->tools) && !known; j++)
			known = !strcmp(fn_name(json_array_get(t->tools, j)), json_string_value(name));
		if (!json_is_object(obj) || !known || (args && !json_is_object(args) && !json_is_string(args))) {
			json_decref(obj);
			if (json_array_size(calls)) /* calls, then one cut short (max_tokens): the calls */
				break;
			json_decref(calls);
			return NULL; /* not a call we can give: the whole text is content */
		}
		/* arguments as the model wrote them when the block has the form the grammar writes (so the
		 * conversation's next turn renders the same bytes and reuses the cached blocks), else re-encoded */
		char *a = NULL, pre[160];
		const char *q = p;
		while (q < end && is_ws(*q))
			q++;
		int n_pre = snprintf(pre, sizeof(pre), "{\"name\": \"%s\", \"arguments\": ", json_string_value(name));
		const char *obj_end = p + obj_len;
		if (json_is_object(args) && n_pre > 0 && (size_t)n_pre < sizeof(pre) && obj_end - q > n_pre &&
		    !memcmp(q, pre, (size_t)n_pre) && obj_end[-1] == '}') {
			json_t *chk = json_loadb(q + n_pre, (size_t)(obj_end - 1 - q - n_pre), JSON_DECODE_ANY, &err);
			if (json_is_object(chk) && (a = malloc((size_t)(obj_end - 1 - q - n_pre) + 1))) {
				memcpy(a, q + n_pre, (size_t)(obj_end - 1 - q - n_pre));
				a[obj_end - 1 - q - n_pre] = 0;
			}
			json_decref(chk);
		}
		if (!a)
			a = json_is_string(args) ? strdup(json_string_value(args)) :
						   json_dumps(args ? args : json_object(), JSON_COMPACT);
		uint8_t rnd[12];
		char id[32] = "call_";
		if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
			memset(rnd, 0x5a, sizeof(rnd));
		for (int k = 0; k < 12; k++)
			snprintf(id + 5 + 2 * k, 3, "%02x", rnd[k]);
		json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:O, s:s}}", "id", id, "type", "function", "function",
						       "name", name, "arguments", a ? a : "{}"));
		free(a);
		json_decref(obj);
		p += obj_len;
		while (p < end && is_ws(*p))
			p++;
		if ((size_t)(end - p) >= sizeof(CALL_CLOSE) - 1 && !memcmp(p, CALL_CLOSE, sizeof(CALL_CLOSE) - 1))
			p += sizeof(CALL_CLOSE) - 1;
		p = memmem(p, (size_t)(end - p), CALL_OPEN, sizeof(CALL_OPEN) - 1);
	}
	*content_len = cl;
	return calls;
}

/* ---- logprobs ---- */

/* A token's bytes as a JSON string: invalid UTF-8 (a piece of a character) as U+FFFD. */
static json_t *token_string(const char *b, size_t n)
{
	kvt_sbuf s = { 0 };
	kvt_sbuf_add(&s, "", 0);
	for (size_t i = 0; i < n;) {
		unsigned char c = (unsigned char)b[i];
		size_t len = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
		bool ok = len && i + len <= n && !(len == 2 && c < 0xc2);
		for (size_t k = 1; ok && k < len; k++)
			ok = ((unsigned char)b[i + k] & 0xc0) == 0x80;
		if (ok) {
			kvt_sbuf_add(&s, b + i, len);
			i += len;
		} else {
			kvt_sbuf_add(&s, "\xef\xbf\xbd", 3);
			i++;
		}
	}
	json_t *v = s.failed ? NULL : json_stringn(s.p, s.n);
	free(s.p);
	return v ? v : json_string("");
}

static json_t *token_entry(const kvt_tok *tok, int32_t id, float lp, bool with_bytes)
{
	const char *b = "";
	size_t n = 0;
	kvt_tok_token_bytes(tok, id, &b, &n);
	json_t *o = json_object();
	json_object_set_new(o, "token", token_string(b, n));
	json_object_set_new(o, "logprob", json_real(lp > -9999.0f ? lp : -9999.0));
	if (with_bytes) {
		json_t *arr = json_array();
		for (size_t i = 0; i < n; i++)
			json_array_append_new(arr, json_integer((unsigned char)b[i]));
		json_object_set_new(o, "bytes", arr);
	}
	return o;
}

json_t *kvt_oai_lp_chat(const kvt_tok *tok, const kvt_token_lp *lp)
{
	json_t *o = token_entry(tok, lp->id, lp->logprob, true), *top = json_array();
	for (uint32_t i = 0; i < lp->n_top; i++)
		json_array_append_new(top, token_entry(tok, lp->top_id[i], lp->top_lp[i], true));
	json_object_set_new(o, "top_logprobs", top);
	return o;
}

json_t *kvt_oai_lp_completion_new(void)
{
	return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

void kvt_oai_lp_completion_add(json_t *o, const kvt_tok *tok, const kvt_token_lp *lp, size_t text_offset)
{
	json_t *e = token_entry(tok, lp->id, lp->logprob, false);
	json_array_append(json_object_get(o, "tokens"), json_object_get(e, "token"));
	json_array_append(json_object_get(o, "token_logprobs"), json_object_get(e, "logprob"));
	json_decref(e);
	json_t *top = json_object();
	for (uint32_t i = 0; i < lp->n_top; i++) {
		json_t *t = token_entry(tok, lp->top_id[i], lp->top_lp[i], false);
		json_object_set(top, json_string_value(json_object_get(t, "token")), json_object_get(t, "logprob"));
		json_decref(t);
	}
	json_array_append_new(json_object_get(o, "top_logprobs"), top);
	json_array_append_new(json_object_get(o, "text_offset"), json_integer((json_int_t)text_offset));
}
