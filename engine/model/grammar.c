/*
 * engine/model/grammar.c — the grammar compiler, the vocabulary trie and the
 * pushdown matcher (grammar.h).
 *
 * Grammar text (a subset of llama.cpp's GBNF):
 *
 *   name ::= alternative ( "|" alternative )*      # one rule; may span lines
 *   item:  "literal"  [byte class]  [^negated]  name  ( group )
 *   postfix on an item:  *  +  ?  {m}  {m,}  {m,n}
 *
 * Literals and classes are bytes: \" \\ \n \r \t \xHH escapes; a class holds
 * bytes and ranges (a-z, \x80-\xbf). A rule ends where the next "name ::="
 * begins. Groups and repetitions become synthetic rules (X* is S ::= X S |
 * empty, right-recursive, so matching it never deepens the stack).
 *
 * Compiled form: one flat array of elements; each alternative is a run of
 * CHARS (a 256-bit class) and REF (a rule) elements closed by END. A parse
 * stack is a linked list of nodes (element position, parent) in an arena;
 * a stack's top always sits on a CHARS element (REFs are expanded into one
 * stack per alternative as soon as they reach the top, ENDs popped), and the
 * empty stack (-1) means the grammar may end. Compilation refuses left
 * recursion (a rule reachable from its own start through nullable
 * elements), which is also what keeps that expansion finite.
 *
 * The matcher's state lives at the bottom of the arena; advancing for a mask
 * or a token check pushes scratch nodes above it and drops them after, and
 * accepting a token copies the new state's stacks to a fresh arena, so the
 * arena stays the size of the state.
 */
#include "grammar.h"

#include "tokenizer.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { GE_END = 0, GE_CHARS = 1, GE_REF = 2 };

typedef struct gelem {
	uint8_t type;   /* GE_* */
	int32_t arg;    /* CHARS: class index; REF: rule id */
} gelem;

typedef struct gcls {
	uint64_t w[4];  /* bit b: byte b is in the class */
} gcls;

struct kvt_grammar {
	atomic_int refs;
	gelem *el;           /* [n_el] every alternative, END-terminated */
	uint32_t n_el;
	gcls *cls;           /* [n_cls] byte classes (0..255: the single bytes) */
	uint32_t n_cls;
	uint32_t *alt;       /* [n_alt] start element of each alternative, by rule */
	uint32_t *rule_alt;  /* [n_rules + 1] rule r's alternatives are alt[rule_alt[r] .. rule_alt[r+1]) */
	uint32_t n_rules;
	uint32_t root;       /* start rule */
};

static bool cls_has(const gcls *c, unsigned b) { return c->w[b >> 6] >> (b & 63) & 1; }
static void cls_set(gcls *c, unsigned b) { c->w[b >> 6] |= 1ull << (b & 63); }

/* ------------------------------------------------------------------------ */
/* compiler                                                                   */

typedef struct galt {
	gelem *e;            /* elements (no END) */
	uint32_t n, cap;
} galt;

typedef struct grule {
	char *name;          /* NULL for synthetic rules */
	galt *a;             /* alternatives */
	uint32_t n, cap;
	bool defined;        /* has a "name ::=" (synthetic: always) */
	uint32_t line;       /* first reference or definition */
} grule;

typedef struct gparse {
	const char *s, *end;
	uint32_t line;
	grule *r;
	uint32_t n_r, cap_r;
	gcls *cls;
	uint32_t n_cls, cap_cls;
	char *err;
	size_t err_cap;
	bool failed, oom;
	int depth;           /* groups open */
} gparse;

#define GROUP_DEPTH_MAX 256 /* keeps the parser's (and the matcher's) recursion shallow */

static int perr(gparse *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int perr(gparse *p, const char *fmt, ...)
{
	if (!p->failed && p->err && p->err_cap) {
		char msg[256];
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(msg, sizeof(msg), fmt, ap);
		va_end(ap);
		snprintf(p->err, p->err_cap, "grammar line %u: %s", p->line, msg);
	}
	p->failed = true;
	return -1;
}

static bool grow(void **v, uint32_t *cap, uint32_t need, size_t elem)
{
	if (need <= *cap)
		return true;
	uint32_t nc = *cap ? *cap * 2 : 8;
	while (nc < need)
		nc *= 2;
	void *q = realloc(*v, (size_t)nc * elem);
	if (!q)
		return false;
	*v = q;
	*cap = nc;
	return true;
}

static int new_rule(gparse *p, const char *name, size_t n)
{
	if (!grow((void **)&p->r, &p->cap_r, p->n_r + 1, sizeof(grule))) {
		p->oom = true;
		return perr(p, "out of memory");
	}
	grule *r = &p->r[p->n_r];
	memset(r, 0, sizeof(*r));
	r->line = p->line;
	if (name) {
		if (!(r->name = malloc(n + 1))) {
			p->oom = true;
			return perr(p, "out of memory");
		}
		memcpy(r->name, name, n);
		r->name[n] = 0;
	} else {
		r->defined = true;
	}
	return (int)p->n_r++;
}

static int find_rule(gparse *p, const char *name, size_t n)
{
	for (uint32_t i = 0; i < p->n_r; i++)
		if (p->r[i].name && strlen(p->r[i].name) == n && !memcmp(p->r[i].name, name, n))
			return (int)i;
	return new_rule(p, name, n);
}

static galt *new_alt(gparse *p, int rule)
{
	grule *r = &p->r[rule];
	if (!grow((void **)&r->a, &r->cap, r->n + 1, sizeof(galt))) {
		p->oom = true;
		perr(p, "out of memory");
		return NULL;
	}
	memset(&r->a[r->n], 0, sizeof(galt));
	return &r->a[r->n++];
}

static int add_el(gparse *p, galt *a, uint8_t type, int32_t arg)
{
	if (!grow((void **)&a->e, &a->cap, a->n + 1, sizeof(gelem))) {
		p->oom = true;
		return perr(p, "out of memory");
	}
	a->e[a->n++] = (gelem){ .type = type, .arg = arg };
	return 0;
}

static int add_cls(gparse *p, const gcls *c)
{
	int single = -1, n_set = 0;
	for (unsigned b = 0; b < 256; b++)
		if (cls_has(c, b)) {
			single = (int)b;
			n_set++;
		}
	if (n_set == 1)
		return single;
	for (uint32_t i = 256; i < p->n_cls; i++)
		if (!memcmp(&p->cls[i], c, sizeof(*c)))
			return (int)i;
	if (!grow((void **)&p->cls, &p->cap_cls, p->n_cls + 1, sizeof(gcls))) {
		p->oom = true;
		return perr(p, "out of memory");
	}
	p->cls[p->n_cls] = *c;
	return (int)p->n_cls++;
}

static void skip_ws(gparse *p)
{
	while (p->s < p->end) {
		char c = *p->s;
		if (c == '\n') {
			p->line++;
			p->s++;
		} else if (c == ' ' || c == '\t' || c == '\r') {
			p->s++;
		} else if (c == '#') {
			while (p->s < p->end && *p->s != '\n')
				p->s++;
		} else {
			break;
		}
	}
}

static bool is_name_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

static size_t name_len(const char *s, const char *end)
{
	size_t n = 0;
	while (s + n < end && is_name_char(s[n]))
		n++;
	return n;
}

/* At "name ::=" (the start of the next rule)? */
static bool at_rule_start(const gparse *p)
{
	size_t n = name_len(p->s, p->end);
	if (!n)
		return false;
	const char *q = p->s + n;
	while (q < p->end && (*q == ' ' || *q == '\t'))
		q++;
	return p->end - q >= 3 && !memcmp(q, "::=", 3);
}

/* One (possibly escaped) byte of a literal or class. */
static int parse_byte(gparse *p)
{
	if (p->s >= p->end)
		return perr(p, "unexpected end of the grammar");
	unsigned char c = (unsigned char)*p->s++;
	if (c == '\n')
		return perr(p, "a newline inside a literal or class (write \\n)");
	if (c != '\\')
		return c;
	if (p->s >= p->end)
		return perr(p, "unexpected end after '\\'");
	c = (unsigned char)*p->s++;
	switch (c) {
	case 'n': return '\n';
	case 'r': return '\r';
	case 't': return '\t';
	case '\\': case '"': case ']': case '[': case '-': case '^': return c;
	case 'x': {
		int h = p->end - p->s >= 2 ? kvt_hexval(p->s[0]) : -1, l = h >= 0 ? kvt_hexval(p->s[1]) : -1;
		if (h < 0 || l < 0)
			return perr(p, "\\x needs two hex digits");
		p->s += 2;
		return h * 16 + l;
	}
	default: return perr(p, "unknown escape \\%c", c);
	}
}

static int parse_alts(gparse *p, int rule, bool group);

/* Wrap elements [from, a->n) of a into a new synthetic rule; returns its id. */
static int wrap(gparse *p, int rule, uint32_t alt_i, uint32_t from)
{
	int nr = new_rule(p, NULL, 0);
	if (nr < 0)
		return -1;
	galt *a = &p->r[rule].a[alt_i], *b = new_alt(p, nr);
	if (!b)
		return -1;
	a = &p->r[rule].a[alt_i]; /* new_rule may have moved p->r */
	for (uint32_t i = from; i < a->n; i++)
		if (add_el(p, b, a->e[i].type, a->e[i].arg))
			return -1;
	a->n = from;
	return nr;
}

/* X repeated min..max times (max < 0: unbounded), X = the elements [from, end) of alternative alt_i. */
static int repeat(gparse *p, int rule, uint32_t alt_i, uint32_t from, long min, long max)
{
	galt *a = &p->r[rule].a[alt_i];
	gelem x;
	if (a->n - from == 1) {
		x = a->e[from];
		a->n = from;
	} else {
		int w = wrap(p, rule, alt_i, from);
		if (w < 0)
			return -1;
		x = (gelem){ GE_REF, w };
	}
	for (long i = 0; i < min; i++)
		if (add_el(p, &p->r[rule].a[alt_i], x.type, x.arg))
			return -1;
	if (max >= 0 && max == min)
		return 0;
	/* the optional tail: S ::= X S | empty (unbounded) or nested optionals O_k ::= X O_{k-1} | empty */
	int tail = -1;
	long k = max < 0 ? 1 : max - min;
	for (long i = 0; i < k; i++) {
		int s = new_rule(p, NULL, 0);
		if (s < 0)
			return -1;
		galt *b = new_alt(p, s);
		if (!b || add_el(p, b, x.type, x.arg))
			return -1;
		int next = max < 0 ? s : tail;
		if (next >= 0 && add_el(p, &p->r[s].a[p->r[s].n - 1], GE_REF, next))
			return -1;
		if (!new_alt(p, s))
			return -1;
		tail = s;
	}
	return add_el(p, &p->r[rule].a[alt_i], GE_REF, tail);
}

static long parse_count(gparse *p)
{
	long v = 0;
	if (p->s >= p->end || *p->s < '0' || *p->s > '9')
		return -1;
	while (p->s < p->end && *p->s >= '0' && *p->s <= '9') {
		v = v * 10 + (*p->s++ - '0');
		if (v > 10000)
			return perr(p, "a repetition count over 10000");
	}
	return v;
}

static int parse_seq(gparse *p, int rule, bool group)
{
	galt *a = new_alt(p, rule);
	if (!a)
		return -1;
	uint32_t alt_i = p->r[rule].n - 1;
	for (;;) {
		skip_ws(p);
		if (p->s >= p->end || *p->s == '|' || *p->s == ')' || (!group && at_rule_start(p)))
			return 0;
		uint32_t from = p->r[rule].a[alt_i].n;
		char c = *p->s;
		if (c == '"') {
			p->s++;
			while (p->s < p->end && *p->s != '"') {
				int b = parse_byte(p);
				if (b < 0 || add_el(p, &p->r[rule].a[alt_i], GE_CHARS, b))
					return -1;
			}
			if (p->s >= p->end)
				return perr(p, "unterminated literal");
			p->s++;
		} else if (c == '[') {
			p->s++;
			bool neg = p->s < p->end && *p->s == '^';
			if (neg)
				p->s++;
			gcls cl = { { 0 } };
			while (p->s < p->end && *p->s != ']') {
				int lo = parse_byte(p), hi = lo;
				if (lo < 0)
					return -1;
				if (p->end - p->s >= 2 && p->s[0] == '-' && p->s[1] != ']') {
					p->s++;
					if ((hi = parse_byte(p)) < 0)
						return -1;
					if (hi < lo)
						return perr(p, "a class range %#x-%#x runs backwards", lo, hi);
				}
				for (int b = lo; b <= hi; b++)
					cls_set(&cl, (unsigned)b);
			}
			if (p->s >= p->end)
				return perr(p, "unterminated class");
			p->s++;
			if (neg)
				for (int i = 0; i < 4; i++)
					cl.w[i] = ~cl.w[i];
			int ci = add_cls(p, &cl);
			if (ci < 0)
				return -1;
			bool empty = true;
			for (int i = 0; i < 4; i++)
				empty = empty && !cl.w[i];
			if (empty)
				return perr(p, "an empty byte class");
			if (add_el(p, &p->r[rule].a[alt_i], GE_CHARS, ci))
				return -1;
		} else if (c == '(') {
			p->s++;
			if (++p->depth > GROUP_DEPTH_MAX)
				return perr(p, "groups nest deeper than %d", GROUP_DEPTH_MAX);
			int g = new_rule(p, NULL, 0);
			if (g < 0 || parse_alts(p, g, true))
				return -1;
			p->depth--;
			if (p->s >= p->end || *p->s != ')')
				return perr(p, "'(' without ')'");
			p->s++;
			if (add_el(p, &p->r[rule].a[alt_i], GE_REF, g))
				return -1;
		} else if (is_name_char(c)) {
			size_t n = name_len(p->s, p->end);
			int r = find_rule(p, p->s, n);
			if (r < 0)
				return -1;
			p->s += n;
			if (add_el(p, &p->r[rule].a[alt_i], GE_REF, r))
				return -1;
		} else {
			return perr(p, "unexpected '%c'", c);
		}
		/* postfix */
		if (p->s < p->end && (*p->s == '*' || *p->s == '+' || *p->s == '?' || *p->s == '{')) {
			long min = 0, max = -1;
			char op = *p->s++;
			if (op == '+')
				min = 1;
			else if (op == '?')
				max = 1;
			else if (op == '{') {
				if ((min = parse_count(p)) < 0)
					return p->failed ? -1 : perr(p, "'{' needs a count");
				max = min;
				if (p->s < p->end && *p->s == ',') {
					p->s++;
					max = p->s < p->end && *p->s == '}' ? -1 : parse_count(p);
					if (p->failed)
						return -1;
					if (max >= 0 && max < min)
						return perr(p, "a repetition {%ld,%ld} runs backwards", min, max);
				}
				if (p->s >= p->end || *p->s != '}')
					return perr(p, "'{' without '}'");
				p->s++;
			}
			if (p->r[rule].a[alt_i].n == from)
				return perr(p, "'%c' after nothing", op);
			if (repeat(p, rule, alt_i, from, min, max))
				return -1;
		}
	}
}

static int parse_alts(gparse *p, int rule, bool group)
{
	for (;;) {
		if (parse_seq(p, rule, group))
			return -1;
		skip_ws(p);
		if (p->s < p->end && *p->s == '|') {
			p->s++;
			continue;
		}
		return 0;
	}
}

/* Nullable rules (fixpoint), then left recursion: a rule reachable from its own start through nullable elements. */
static int check_rules(gparse *p)
{
	uint32_t n = p->n_r;
	bool *nullable = calloc(n, 1);
	uint8_t *mark = calloc(n, 1);
	uint32_t *stack = calloc((size_t)n * 2 + 1, sizeof(uint32_t));
	if (!nullable || !mark || !stack) {
		free(nullable);
		free(mark);
		free(stack);
		p->oom = true;
		return perr(p, "out of memory");
	}
	for (bool changed = true; changed;) {
		changed = false;
		for (uint32_t r = 0; r < n; r++) {
			if (nullable[r])
				continue;
			for (uint32_t a = 0; a < p->r[r].n && !nullable[r]; a++) {
				bool all = true;
				for (uint32_t i = 0; i < p->r[r].a[a].n && all; i++) {
					gelem e = p->r[r].a[a].e[i];
					all = e.type == GE_REF && nullable[e.arg];
				}
				if (all)
					nullable[r] = changed = true;
			}
		}
	}
	int ret = 0;
	/* for each rule, DFS over "starts with" edges looking for a path back to it */
	for (uint32_t r0 = 0; r0 < n && !ret; r0++) {
		memset(mark, 0, n);
		uint32_t sp = 0;
		stack[sp++] = r0;
		while (sp && !ret) {
			uint32_t r = stack[--sp];
			for (uint32_t a = 0; a < p->r[r].n && !ret; a++)
				for (uint32_t i = 0; i < p->r[r].a[a].n; i++) {
					gelem e = p->r[r].a[a].e[i];
					if (e.type != GE_REF)
						break;
					if ((uint32_t)e.arg == r0) {
						p->line = p->r[r0].line;
						ret = perr(p, "rule %s can start with itself (left recursion, or a repetition of something that may match nothing)",
							   p->r[r0].name ? p->r[r0].name : "(a group)");
						break;
					}
					if (!mark[e.arg] && sp < 2 * n) {
						mark[e.arg] = 1;
						stack[sp++] = (uint32_t)e.arg;
					}
					if (!nullable[e.arg])
						break;
				}
		}
	}
	free(nullable);
	free(mark);
	free(stack);
	return ret;
}

static void parse_free(gparse *p)
{
	for (uint32_t i = 0; i < p->n_r; i++) {
		for (uint32_t a = 0; a < p->r[i].n; a++)
			free(p->r[i].a[a].e);
		free(p->r[i].a);
		free(p->r[i].name);
	}
	free(p->r);
	free(p->cls);
}

int kvt_grammar_compile(const char *text, size_t len, const char *root, kvt_grammar **out, char *err, size_t err_cap)
{
	gparse p = { .s = text, .end = text + len, .line = 1, .err = err, .err_cap = err_cap };
	kvt_grammar *g = NULL;
	*out = NULL;
	if (err && err_cap)
		err[0] = 0;
	if (!grow((void **)&p.cls, &p.cap_cls, 256, sizeof(gcls))) {
		p.oom = true;
		goto fail;
	}
	p.n_cls = 256;
	memset(p.cls, 0, 256 * sizeof(gcls));
	for (unsigned b = 0; b < 256; b++)
		cls_set(&p.cls[b], b);
	for (;;) {
		skip_ws(&p);
		if (p.s >= p.end)
			break;
		size_t n = name_len(p.s, p.end);
		if (!n || !at_rule_start(&p)) {
			perr(&p, "expected 'name ::='");
			goto fail;
		}
		int r = find_rule(&p, p.s, n);
		if (r < 0)
			goto fail;
		if (p.r[r].defined) {
			perr(&p, "rule %s is defined twice", p.r[r].name);
			goto fail;
		}
		p.r[r].defined = true;
		p.r[r].line = p.line;
		p.s += n;
		skip_ws(&p);
		p.s += 3; /* ::= */
		if (parse_alts(&p, r, false))
			goto fail;
		if (p.s < p.end && *p.s == ')') {
			perr(&p, "')' without '('");
			goto fail;
		}
	}
	int root_id = -1;
	for (uint32_t i = 0; i < p.n_r; i++) {
		if (!p.r[i].defined) {
			p.line = p.r[i].line;
			perr(&p, "rule %s is used but not defined", p.r[i].name);
			goto fail;
		}
		if (p.r[i].name && root && !strcmp(p.r[i].name, root))
			root_id = (int)i;
	}
	if (root_id < 0) {
		perr(&p, "no rule named %s", root ? root : "(null)");
		goto fail;
	}
	if (check_rules(&p))
		goto fail;

	g = calloc(1, sizeof(*g));
	uint32_t n_el = 0, n_alt = 0;
	for (uint32_t i = 0; i < p.n_r; i++)
		for (uint32_t a = 0; a < p.r[i].n; a++, n_alt++)
			n_el += p.r[i].a[a].n + 1;
	if (!g || !(g->el = malloc((size_t)n_el * sizeof(gelem))) || !(g->alt = malloc((size_t)n_alt * sizeof(uint32_t) + 1)) ||
	    !(g->rule_alt = malloc((size_t)(p.n_r + 1) * sizeof(uint32_t)))) {
		p.oom = true;
		goto fail;
	}
	uint32_t ei = 0, ai = 0;
	for (uint32_t i = 0; i < p.n_r; i++) {
		g->rule_alt[i] = ai;
		for (uint32_t a = 0; a < p.r[i].n; a++) {
			g->alt[ai++] = ei;
			if (p.r[i].a[a].n) /* an empty alternative has no element array */
				memcpy(g->el + ei, p.r[i].a[a].e, (size_t)p.r[i].a[a].n * sizeof(gelem));
			ei += p.r[i].a[a].n;
			g->el[ei++] = (gelem){ GE_END, 0 };
		}
	}
	g->rule_alt[p.n_r] = ai;
	g->n_el = n_el;
	g->n_rules = p.n_r;
	g->root = (uint32_t)root_id;
	g->cls = p.cls;
	g->n_cls = p.n_cls;
	p.cls = NULL;
	atomic_init(&g->refs, 1);
	parse_free(&p);
	*out = g;
	return KVT_OK;
fail:
	if (p.oom && err && err_cap)
		snprintf(err, err_cap, "out of memory compiling a grammar");
	if (g) {
		free(g->el);
		free(g->alt);
		free(g->rule_alt);
		free(g);
	}
	parse_free(&p);
	return p.oom ? KVT_ENOMEM : KVT_EINVAL;
}

kvt_grammar *kvt_grammar_ref(kvt_grammar *g)
{
	atomic_fetch_add(&g->refs, 1);
	return g;
}

void kvt_grammar_unref(kvt_grammar *g)
{
	if (!g || atomic_fetch_sub(&g->refs, 1) != 1)
		return;
	free(g->el);
	free(g->cls);
	free(g->alt);
	free(g->rule_alt);
	free(g);
}

/* ------------------------------------------------------------------------ */
/* the vocabulary trie                                                        */

typedef struct tnode {
	uint32_t child;      /* first child (0: none; node 0 is the root) */
	uint32_t sib;        /* next sibling (0: none) */
	int32_t tok;         /* first token ending here (-1: none), more through tok_next */
	uint8_t byte;        /* the edge into this node */
} tnode;

struct kvt_vocab_trie {
	uint32_t n_vocab;    /* token ids the trie covers: 0..n_vocab-1 */
	tnode *nd;           /* [n_nd], nd[0] the root */
	uint32_t n_nd, cap_nd;
	int32_t *tok_next;   /* [n_vocab] next token at the same node, -1 */
	const uint8_t **bytes; /* [n_vocab] token bytes (borrowed from the tokenizer), NULL: not in the trie */
	uint32_t *n_bytes;   /* [n_vocab] */
	uint8_t *eog;        /* [n_vocab] end-of-generation tokens */
	uint32_t max_depth;  /* longest token in the trie */
};

/*
 * Renumber the nodes in depth-first preorder, so a mask's walk (which is
 * depth first) reads the node array front to back instead of jumping
 * through it in insertion order. KVT_ENOMEM.
 */
static int trie_preorder(kvt_vocab_trie *t)
{
	uint32_t *order = malloc((size_t)t->n_nd * sizeof(uint32_t)), *stack = malloc((size_t)t->n_nd * sizeof(uint32_t));
	uint32_t *newid = malloc((size_t)t->n_nd * sizeof(uint32_t));
	tnode *nd = malloc((size_t)t->n_nd * sizeof(tnode));
	if (!order || !stack || !newid || !nd) {
		free(order);
		free(stack);
		free(newid);
		free(nd);
		return KVT_ENOMEM;
	}
	uint32_t n = 0, sp = 0;
	stack[sp++] = 0;
	while (sp) {
		uint32_t x = stack[--sp];
		order[n] = x;
		newid[x] = n++;
		/* push the children last-first so the first child comes out next */
		uint32_t k = sp;
		for (uint32_t c = t->nd[x].child; c; c = t->nd[c].sib)
			stack[sp++] = c;
		for (uint32_t i = k, j = sp; sp > k && i < --j; i++) {
			uint32_t tmp = stack[i];
			stack[i] = stack[j];
			stack[j] = tmp;
		}
	}
	for (uint32_t i = 0; i < n; i++) {
		tnode o = t->nd[order[i]];
		nd[i] = (tnode){ o.child ? newid[o.child] : 0, o.sib ? newid[o.sib] : 0, o.tok, o.byte };
	}
	free(t->nd);
	t->nd = nd;
	t->cap_nd = n;
	free(order);
	free(stack);
	free(newid);
	return KVT_OK;
}

int kvt_vocab_trie_create(const kvt_tok *tok, uint32_t n_vocab, kvt_vocab_trie **out)
{
	kvt_vocab_trie *t = calloc(1, sizeof(*t));
	*out = NULL;
	if (!t)
		return KVT_ENOMEM;
	t->n_vocab = n_vocab;
	t->tok_next = malloc((size_t)n_vocab * sizeof(int32_t));
	t->bytes = calloc(n_vocab, sizeof(*t->bytes));
	t->n_bytes = calloc(n_vocab, sizeof(uint32_t));
	t->eog = calloc(n_vocab, 1);
	if (!t->tok_next || !t->bytes || !t->n_bytes || !t->eog || !grow((void **)&t->nd, &t->cap_nd, 1 << 16, sizeof(tnode)))
		goto oom;
	t->nd[0] = (tnode){ 0, 0, -1, 0 };
	t->n_nd = 1;
	uint32_t n_tok = tok ? kvt_tok_n_vocab(tok) : 0;
	for (uint32_t id = 0; id < n_vocab; id++) {
		t->tok_next[id] = -1;
		if (id >= n_tok)
			continue;
		if (kvt_tok_is_eog(tok, (int32_t)id)) {
			t->eog[id] = 1;
			continue;
		}
		int ty = kvt_tok_token_type(tok, (int32_t)id);
		const char *b;
		size_t n;
		if (ty == KVT_TOK_CONTROL || ty == KVT_TOK_UNKNOWN || ty == KVT_TOK_UNUSED ||
		    kvt_tok_token_bytes(tok, (int32_t)id, &b, &n) != KVT_OK || n == 0 || n > 1024)
			continue;
		t->bytes[id] = (const uint8_t *)b;
		t->n_bytes[id] = (uint32_t)n;
		if (n > t->max_depth)
			t->max_depth = (uint32_t)n;
		uint32_t cur = 0;
		for (size_t i = 0; i < n; i++) {
			uint8_t c = (uint8_t)b[i];
			uint32_t ch = t->nd[cur].child, prev = 0;
			while (ch && t->nd[ch].byte != c) {
				prev = ch;
				ch = t->nd[ch].sib;
			}
			if (!ch) {
				if (!grow((void **)&t->nd, &t->cap_nd, t->n_nd + 1, sizeof(tnode)))
					goto oom;
				ch = t->n_nd++;
				t->nd[ch] = (tnode){ 0, 0, -1, c };
				if (prev)
					t->nd[prev].sib = ch;
				else
					t->nd[cur].child = ch;
			}
			cur = ch;
		}
		t->tok_next[id] = t->nd[cur].tok;
		t->nd[cur].tok = (int32_t)id;
	}
	if (trie_preorder(t))
		goto oom;
	*out = t;
	return KVT_OK;
oom:
	KVT_LOGE("grammar: out of memory building the token trie (%u tokens)", n_vocab);
	kvt_vocab_trie_destroy(t);
	return KVT_ENOMEM;
}

void kvt_vocab_trie_destroy(kvt_vocab_trie *t)
{
	if (!t)
		return;
	free(t->nd);
	free(t->tok_next);
	free(t->bytes);
	free(t->n_bytes);
	free(t->eog);
	free(t);
}

/* ------------------------------------------------------------------------ */
/* the matcher                                                                */

#define EXPAND_DEPTH_MAX 100000u /* expansions within one advance; only a pathological grammar gets near */

typedef struct gnode {
	uint32_t pos;        /* element position (a CHARS or REF element) */
	int32_t parent;      /* node below, -1: bottom */
} gnode;

typedef struct gset {
	int32_t *s;          /* stacks (top node; -1 = the empty stack) */
	uint32_t n, cap;
} gset;

#define MASK_CACHE 8          /* masks remembered per matcher, by state */
#define MASK_KEY_MAX 4096u    /* longest state (positions) that is cached */

typedef struct mask_entry {
	uint64_t hash;       /* of key */
	uint32_t *key;       /* [n_key] the state: each stack's positions top to bottom, then UINT32_MAX */
	uint32_t n_key;      /* 0: empty slot */
	uint64_t *bits;      /* [(n_vocab + 63) / 64] the mask */
	uint32_t n_allowed;
	uint64_t used;       /* last use (LRU) */
} mask_entry;

struct kvt_gmatch {
	const kvt_grammar *g;
	const kvt_vocab_trie *t;
	gnode *nd;           /* arena: [0, n_base) the state's nodes, scratch above */
	uint32_t n_nd, cap_nd, n_base;
	gnode *nd2;          /* the other arena, for compaction */
	uint32_t cap_nd2;
	gset cur;            /* the state */
	gset *lv;            /* [max_depth + 2] scratch sets, one per trie depth */
	uint32_t n_lv;
	bool ended;          /* an end-of-generation token was taken */
	bool oom;            /* an allocation failed: everything is refused from here */
	uint32_t work;       /* expansions in the current advance */
	mask_entry cache[MASK_CACHE]; /* masks of recent states: a state recurs often (inside a string, every byte) */
	uint32_t *key;       /* [cap_key] the current state's key, scratch */
	uint32_t cap_key;
	uint64_t clock;      /* cache uses */
	gcls u0;             /* the bytes the mask's start state allows */
	kvt_gmatch_stats st;
};

static int32_t node_new(kvt_gmatch *m, uint32_t pos, int32_t parent)
{
	if (!grow((void **)&m->nd, &m->cap_nd, m->n_nd + 1, sizeof(gnode))) {
		m->oom = true;
		return -2;
	}
	m->nd[m->n_nd] = (gnode){ pos, parent };
	return (int32_t)m->n_nd++;
}

static bool stack_eq(const kvt_gmatch *m, int32_t a, int32_t b)
{
	while (a >= 0 && b >= 0) {
		if (a == b)
			return true;
		if (m->nd[a].pos != m->nd[b].pos)
			return false;
		a = m->nd[a].parent;
		b = m->nd[b].parent;
	}
	return a == b;
}

#define SET_MAX 2048u /* stacks in one state: beyond, the grammar is too ambiguous to follow (refused) */

static void emit(kvt_gmatch *m, gset *out, int32_t st)
{
	for (uint32_t i = 0; i < out->n; i++)
		if (stack_eq(m, out->s[i], st))
			return;
	if (out->n >= SET_MAX) {
		if (!m->oom)
			KVT_LOGE("grammar: a state of more than %u parse stacks (a grammar too ambiguous to follow)", SET_MAX);
		m->oom = true;
		return;
	}
	if (!grow((void **)&out->s, &out->cap, out->n + 1, sizeof(int32_t))) {
		m->oom = true;
		return;
	}
	out->s[out->n++] = st;
}

static void expand(kvt_gmatch *m, int32_t st, gset *out);

/* The stack parent with the sequence at pos pushed on it (pos at END: parent itself), expanded into out. */
static void push_seq(kvt_gmatch *m, int32_t parent, uint32_t pos, gset *out)
{
	if (m->g->el[pos].type == GE_END) {
		expand(m, parent, out);
		return;
	}
	int32_t n = node_new(m, pos, parent);
	if (n >= 0)
		expand(m, n, out);
}

static void expand(kvt_gmatch *m, int32_t st, gset *out)
{
	if (m->oom || ++m->work > EXPAND_DEPTH_MAX) {
		m->oom = true;
		return;
	}
	if (st < 0) {
		emit(m, out, -1);
		return;
	}
	const kvt_grammar *g = m->g;
	uint32_t pos = m->nd[st].pos;
	int32_t parent = m->nd[st].parent;
	gelem e = g->el[pos];
	if (e.type == GE_CHARS) {
		emit(m, out, st);
		return;
	}
	/* REF: the continuation after it, then each alternative of the rule on top */
	int32_t cont = parent;
	if (g->el[pos + 1].type != GE_END && (cont = node_new(m, pos + 1, parent)) < -1)
		return;
	for (uint32_t a = g->rule_alt[e.arg]; a < g->rule_alt[e.arg + 1]; a++)
		push_seq(m, cont, g->alt[a], out);
}

/* out = in advanced over byte c (out emptied first). */
static void advance(kvt_gmatch *m, const gset *in, uint8_t c, gset *out)
{
	out->n = 0;
	m->work = 0;
	for (uint32_t i = 0; i < in->n; i++) {
		int32_t st = in->s[i];
		if (st < 0)
			continue;
		uint32_t pos = m->nd[st].pos;
		if (cls_has(&m->g->cls[m->g->el[pos].arg], c))
			push_seq(m, m->nd[st].parent, pos + 1, out);
	}
}

static void set_union(const kvt_gmatch *m, const gset *s, gcls *u)
{
	memset(u, 0, sizeof(*u));
	for (uint32_t i = 0; i < s->n; i++)
		if (s->s[i] >= 0) {
			const gcls *c = &m->g->cls[m->g->el[m->nd[s->s[i]].pos].arg];
			for (int w = 0; w < 4; w++)
				u->w[w] |= c->w[w];
		}
}

static bool set_can_end(const gset *s)
{
	for (uint32_t i = 0; i < s->n; i++)
		if (s->s[i] < 0)
			return true;
	return false;
}

/* Copy stack st from m->nd into the compact arena nd2 (n2 nodes so far). */
static int32_t copy_stack(kvt_gmatch *m, int32_t st, uint32_t *n2)
{
	if (st < 0)
		return -1;
	int32_t parent = copy_stack(m, m->nd[st].parent, n2);
	if (parent < -1)
		return -2;
	if (!grow((void **)&m->nd2, &m->cap_nd2, *n2 + 1, sizeof(gnode))) {
		m->oom = true;
		return -2;
	}
	m->nd2[*n2] = (gnode){ m->nd[st].pos, parent };
	return (int32_t)(*n2)++;
}

/* Make set s (in the scratch arena) the state, compacted. */
static void set_state(kvt_gmatch *m, const gset *s)
{
	uint32_t n2 = 0;
	if (!grow((void **)&m->cur.s, &m->cur.cap, s->n ? s->n : 1, sizeof(int32_t))) {
		m->oom = true;
		return;
	}
	for (uint32_t i = 0; i < s->n; i++)
		m->cur.s[i] = copy_stack(m, s->s[i], &n2);
	m->cur.n = s->n;
	gnode *t = m->nd;
	uint32_t tc = m->cap_nd;
	m->nd = m->nd2;
	m->cap_nd = m->cap_nd2;
	m->nd2 = t;
	m->cap_nd2 = tc;
	m->n_nd = m->n_base = n2;
}

int kvt_gmatch_create(const kvt_grammar *g, const kvt_vocab_trie *t, kvt_gmatch **out)
{
	kvt_gmatch *m = calloc(1, sizeof(*m));
	*out = NULL;
	if (!m)
		return KVT_ENOMEM;
	m->g = g;
	m->t = t;
	m->n_lv = (t && t->max_depth > 1 ? t->max_depth : 1) + 2; /* walk needs lv[1] and lv[2] */
	m->lv = calloc(m->n_lv, sizeof(gset));
	if (!m->lv || !grow((void **)&m->nd, &m->cap_nd, 256, sizeof(gnode)) ||
	    !grow((void **)&m->nd2, &m->cap_nd2, 256, sizeof(gnode))) {
		kvt_gmatch_destroy(m);
		return KVT_ENOMEM;
	}
	/* the start: the root rule's alternatives on the empty stack */
	gset *s0 = &m->lv[0];
	s0->n = 0;
	m->work = 0;
	for (uint32_t a = g->rule_alt[g->root]; a < g->rule_alt[g->root + 1]; a++)
		push_seq(m, -1, g->alt[a], s0);
	set_state(m, s0);
	if (m->oom) {
		KVT_LOGE("grammar: out of memory starting a matcher");
		kvt_gmatch_destroy(m);
		return KVT_ENOMEM;
	}
	*out = m;
	return KVT_OK;
}

void kvt_gmatch_destroy(kvt_gmatch *m)
{
	if (!m)
		return;
	for (uint32_t i = 0; m->lv && i < m->n_lv; i++)
		free(m->lv[i].s);
	free(m->lv);
	for (int i = 0; i < MASK_CACHE; i++) {
		free(m->cache[i].key);
		free(m->cache[i].bits);
	}
	free(m->key);
	free(m->cur.s);
	free(m->nd);
	free(m->nd2);
	free(m);
}

bool kvt_gmatch_can_end(const kvt_gmatch *m)
{
	return m->ended || set_can_end(&m->cur);
}

bool kvt_gmatch_must_end(const kvt_gmatch *m)
{
	for (uint32_t i = 0; i < m->cur.n; i++)
		if (m->cur.s[i] >= 0)
			return m->ended;
	return true;
}

/* Advance the state over n bytes into scratch; the resulting set (NULL if the bytes leave the grammar). */
static gset *walk(kvt_gmatch *m, const uint8_t *b, size_t n)
{
	const gset *in = &m->cur;
	gset *res = NULL;
	/* lv[1] and lv[2] alternate as the scratch sets */
	for (size_t i = 0; i < n; i++) {
		gset *o = &m->lv[1 + (i & 1)];
		advance(m, in, b[i], o);
		if (m->oom || !o->n)
			return NULL;
		in = o;
		res = o;
	}
	return res;
}

bool kvt_gmatch_feed(kvt_gmatch *m, const char *bytes, size_t n)
{
	if (m->ended || m->oom)
		return false;
	if (!n)
		return true;
	gset *r = walk(m, (const uint8_t *)bytes, n);
	if (!r) {
		m->n_nd = m->n_base;
		return false;
	}
	set_state(m, r);
	return !m->oom;
}

bool kvt_gmatch_allows(kvt_gmatch *m, int32_t id)
{
	const kvt_vocab_trie *t = m->t;
	if (!t || id < 0 || (uint32_t)id >= t->n_vocab || m->oom)
		return false;
	if (t->eog[id])
		return kvt_gmatch_can_end(m);
	if (m->ended || !t->bytes[id])
		return false;
	bool ok = walk(m, t->bytes[id], t->n_bytes[id]) != NULL;
	m->n_nd = m->n_base;
	return ok;
}

int kvt_gmatch_accept(kvt_gmatch *m, int32_t id)
{
	const kvt_vocab_trie *t = m->t;
	if (!t || id < 0 || (uint32_t)id >= t->n_vocab || m->oom)
		return KVT_EINVAL;
	m->st.n_tokens++;
	if (t->eog[id]) {
		if (!kvt_gmatch_can_end(m))
			return KVT_EINVAL;
		m->ended = true;
		return KVT_OK;
	}
	if (m->ended || !t->bytes[id])
		return KVT_EINVAL;
	gset *r = walk(m, t->bytes[id], t->n_bytes[id]);
	if (!r) {
		m->n_nd = m->n_base;
		return KVT_EINVAL;
	}
	set_state(m, r);
	return m->oom ? KVT_ENOMEM : KVT_OK;
}

/* Two sets with the same stacks (structurally), in any order: the same state. */
static bool set_equal(const kvt_gmatch *m, const gset *a, const gset *b)
{
	if (a->n != b->n)
		return false;
	for (uint32_t i = 0; i < a->n; i++) {
		bool found = false;
		for (uint32_t j = 0; j < b->n && !found; j++)
			found = stack_eq(m, a->s[i], b->s[j]);
		if (!found)
			return false;
	}
	return true;
}

/*
 * The subtree under trie node `node`, reached with state set s (scratch for
 * the children at lv[d + 1]). root: s is the mask's starting state, and
 * loop[b] says byte b leads from it back to itself (inside a string, every
 * ordinary character does): such an edge costs no advance, so a token made
 * of such bytes is checked in O(its length). A set that comes back to s0
 * (a multi-byte character or an escape completed) is s0 again.
 */
static uint32_t mask_dfs(kvt_gmatch *m, uint32_t node, const gset *s, bool root, const gset *s0, const bool *loop,
			 uint32_t d, uint64_t *allow)
{
	const kvt_vocab_trie *t = m->t;
	uint32_t n_allowed = 0;
	gcls u;
	if (root)
		u = m->u0;
	else
		set_union(m, s, &u);
	for (uint32_t c = t->nd[node].child; c; c = t->nd[c].sib) {
		uint8_t b = t->nd[c].byte;
		if (!cls_has(&u, b))
			continue;
		uint32_t mark = m->n_nd;
		const gset *next = s;
		bool next_root = root && loop[b];
		if (!next_root) {
			advance(m, s, b, &m->lv[d + 1]);
			next = &m->lv[d + 1];
			/* back at the start state (a multi-byte character or an escape completed): its loops apply again */
			if (next->n == s0->n && set_equal(m, next, s0)) {
				next = s0;
				next_root = true;
			}
		}
		if (next->n && !m->oom) {
			for (int32_t id = t->nd[c].tok; id >= 0; id = t->tok_next[id]) {
				allow[id >> 6] |= 1ull << (id & 63);
				n_allowed++;
			}
			if (t->nd[c].child && d + 2 < m->n_lv)
				n_allowed += mask_dfs(m, c, next, next_root, s0, loop, d + 1, allow);
		}
		m->n_nd = mark;
	}
	return n_allowed;
}

/* The state as a key (m->key); its length, 0 if too long to cache. */
static uint32_t state_key(kvt_gmatch *m, uint64_t *hash)
{
	uint32_t n = 0;
	uint64_t h = 1469598103934665603ull;
	for (uint32_t i = 0; i < m->cur.n; i++) {
		for (int32_t st = m->cur.s[i];; st = m->nd[st].parent) {
			if (n >= MASK_KEY_MAX || !grow((void **)&m->key, &m->cap_key, n + 1, sizeof(uint32_t)))
				return 0;
			uint32_t v = st < 0 ? UINT32_MAX : m->nd[st].pos;
			m->key[n++] = v;
			h = (h ^ v) * 1099511628211ull;
			if (st < 0)
				break;
		}
	}
	*hash = h;
	return n;
}

uint32_t kvt_gmatch_mask(kvt_gmatch *m, uint64_t *allow)
{
	const kvt_vocab_trie *t = m->t;
	const size_t n_words = (size_t)(t->n_vocab + 63) / 64;
	double t0 = kvt_now_s();
	uint32_t n_allowed = 0;
	uint64_t hash = 0;
	uint32_t n_key = m->ended || m->oom ? 0 : state_key(m, &hash);
	m->clock++;
	for (int i = 0; n_key && i < MASK_CACHE; i++) {
		mask_entry *e = &m->cache[i];
		if (e->n_key == n_key && e->hash == hash && !memcmp(e->key, m->key, n_key * sizeof(uint32_t))) {
			memcpy(allow, e->bits, n_words * sizeof(uint64_t));
			e->used = m->clock;
			m->st.n_masks++;
			m->st.n_cached++;
			m->st.mask_s += kvt_now_s() - t0;
			return e->n_allowed;
		}
	}
	memset(allow, 0, n_words * sizeof(uint64_t));
	if (!m->ended && !m->oom) {
		gset *l0 = &m->lv[0];
		if (!grow((void **)&l0->s, &l0->cap, m->cur.n ? m->cur.n : 1, sizeof(int32_t))) {
			m->oom = true;
		} else {
			memcpy(l0->s, m->cur.s, (size_t)m->cur.n * sizeof(int32_t));
			l0->n = m->cur.n;
			/* the bytes that lead from the state back to itself */
			bool loop[256] = { false };
			set_union(m, l0, &m->u0);
			for (unsigned b = 0; b < 256 && !m->oom; b++) {
				if (!cls_has(&m->u0, b))
					continue;
				advance(m, l0, (uint8_t)b, &m->lv[1]);
				loop[b] = set_equal(m, &m->lv[1], l0);
				m->n_nd = m->n_base;
			}
			n_allowed = mask_dfs(m, 0, l0, true, l0, loop, 0, allow);
		}
		m->n_nd = m->n_base;
	}
	if (kvt_gmatch_can_end(m))
		for (uint32_t id = 0; id < t->n_vocab; id++)
			if (t->eog[id]) {
				allow[id >> 6] |= 1ull << (id & 63);
				n_allowed++;
			}
	if (n_key && !m->oom) { /* remember it in the least recently used slot */
		mask_entry *e = &m->cache[0];
		for (int i = 1; i < MASK_CACHE; i++)
			if (m->cache[i].used < e->used)
				e = &m->cache[i];
		uint32_t *k = realloc(e->key, n_key * sizeof(uint32_t));
		if (k)
			e->key = k;
		if (k && (e->bits || (e->bits = malloc(n_words * sizeof(uint64_t))))) {
			memcpy(e->key, m->key, n_key * sizeof(uint32_t));
			memcpy(e->bits, allow, n_words * sizeof(uint64_t));
			e->n_key = n_key;
			e->hash = hash;
			e->n_allowed = n_allowed;
			e->used = m->clock;
		} else {
			e->n_key = 0;
		}
	}
	m->st.n_masks++;
	m->st.mask_s += kvt_now_s() - t0;
	return n_allowed;
}

void kvt_gmatch_get_stats(const kvt_gmatch *m, kvt_gmatch_stats *st)
{
	*st = m->st;
}

void kvt_gmatch_count_fast(kvt_gmatch *m)
{
	m->st.n_fast++;
}
