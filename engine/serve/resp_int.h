/*
 * engine/serve/resp_int.h — the Redis-protocol listener's shared parts,
 * between its three files:
 *
 *   resp_parse.c  the incremental RESP2 request parser (pure: bytes in,
 *                 commands out; no sockets, no store);
 *   resp_cmd.c    the commands: each runs against the store and appends its
 *                 reply to the connection's output (INFO in resp_info.c);
 *   resp.c        the transport: accept thread, connection threads, the
 *                 read/parse/run/wait/flush loop, the counters.
 *
 * The parser's contract: kvt_resp_parse consumes bytes (it copies what it
 * keeps, so the caller's buffer is free again once it returns) until one
 * command is complete (1: argc/argv hold it until kvt_resp_parser_next), or
 * every byte is consumed (0), or the input is not RESP (< 0: err says why;
 * the connection must be closed). A multibulk SET's value (argument 2) goes
 * into a kvt_kvs_val grown as its bytes arrive, never to its declared length
 * at once; every other argument is at most KVT_KVS_KEY_MAX bytes, kept in the
 * parser's arena. Inline commands (a line not starting with '*') are split
 * at spaces and tabs (no quoting); a control byte in one, or a line over
 * KVT_RESP_INLINE_MAX, is a protocol error.
 */
#ifndef KVT_RESP_INT_H
#define KVT_RESP_INT_H

#include "resp.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVT_RESP_INLINE_MAX (64u << 10)   /* bytes of an inline command line */
#define KVT_RESP_ARGS_MAX (1u << 20)      /* arguments of one multibulk command */
#define KVT_RESP_ARENA_MAX (64u << 20)    /* bytes of one command's arguments (the value apart) */
#define KVT_RESP_VAL_STEP (64u << 10)     /* a value's first buffer, and the least it grows by */
#define KVT_RESP_DIRECT_MIN (64u << 10)   /* value bytes still due before reading into the value directly */
#define KVT_RESP_HDR_MAX 24u              /* bytes of a "*N\r\n" or "$N\r\n" line */

enum kvt_resp_state { RP_START, RP_COUNT, RP_BULKHDR, RP_BULK, RP_BULK_CRLF, RP_INLINE };

/* One argument of a complete command: len bytes at p (NUL after them, except a value's). */
typedef struct kvt_resp_arg {
	const uint8_t *p;
	size_t len;
} kvt_resp_arg;

typedef struct kvt_resp_parser {
	uint64_t max_value;        /* the largest SET value accepted */
	int state;                 /* enum kvt_resp_state */
	char line[KVT_RESP_HDR_MAX + 1]; /* a header line so far ("*3\r" ...) */
	size_t n_line;             /* bytes in line */
	int64_t n_args;            /* arguments declared by the multibulk count */
	size_t n_got;              /* arguments complete */
	uint64_t bulk_len;         /* the current bulk's declared length */
	uint64_t bulk_got;         /* of it, bytes read */
	int n_crlf;                /* bytes of the bulk's trailing CRLF read (0..1) */
	bool is_set;               /* argument 0 is SET (argument 2 goes into val) */
	bool in_val;               /* the current bulk goes into val */
	uint8_t *arena;            /* [arena_cap]: the arguments' bytes, each followed by a NUL */
	size_t arena_len, arena_cap;
	size_t *arg_off;           /* [arg_cap]: each argument's offset in arena ((size_t)-1: the value) */
	size_t *arg_len;           /* [arg_cap]: its length */
	size_t arg_cap;
	kvt_kvs_val *val;          /* SET's value, being read or complete; owned (NULL once taken) */
	/* a complete command (kvt_resp_parse returned 1) */
	kvt_resp_arg *argv;        /* [argc] */
	size_t argv_cap;
	size_t argc;
	const char *err;           /* why the input was refused (static text or err_buf) */
	char err_buf[48];          /* a refusal naming the byte found */
} kvt_resp_parser;

void kvt_resp_parser_init(kvt_resp_parser *p, uint64_t max_value);
void kvt_resp_parser_deinit(kvt_resp_parser *p);
/* Parse from buf[0..n): 1 a command is complete, 0 all consumed, KVT_EINVAL (err set) or KVT_ENOMEM. *used: bytes consumed. */
int kvt_resp_parse(kvt_resp_parser *p, const uint8_t *buf, size_t n, size_t *used);
/* Done with the complete command: its arguments and value (unless taken) are released. */
void kvt_resp_parser_next(kvt_resp_parser *p);
/*
 * Where the next value bytes may be read to directly (a large value in the
 * middle): *room bytes at the returned pointer, or NULL (read into a buffer
 * and call kvt_resp_parse). After reading n bytes there, kvt_resp_direct_done.
 */
uint8_t *kvt_resp_direct(kvt_resp_parser *p, size_t *room);
void kvt_resp_direct_done(kvt_resp_parser *p, size_t n);

/* ---- the connection's output ---- */

/* A piece of output: bytes of the output buffer, or of a value (a reference held). */
typedef struct kvt_resp_piece {
	kvt_kvs_val *v;            /* NULL: out bytes [off, off + len) */
	size_t off, len;
} kvt_resp_piece;

typedef struct kvt_resp_out {
	char *buf;                 /* [cap]: reply bytes */
	size_t len, cap;
	size_t cut;                /* buf bytes before this are in pieces already */
	kvt_resp_piece *pieces;    /* [n_pieces] */
	size_t n_pieces, cap_pieces;
	bool oom;                  /* an append failed: the connection is closed */
} kvt_resp_out;

void kvt_resp_out_bytes(kvt_resp_out *o, const void *p, size_t n);
void kvt_resp_out_str(kvt_resp_out *o, const char *s);
void kvt_resp_out_fmt(kvt_resp_out *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A bulk string: "$len\r\n" bytes "\r\n". */
void kvt_resp_out_bulk(kvt_resp_out *o, const void *p, size_t n);
/* A value as a bulk string, sent from its own buffer when large (a reference is taken). */
void kvt_resp_out_val(kvt_resp_out *o, kvt_kvs_val *v);

/* ---- the listener and a connection ---- */

struct kvt_resp {
	kvt_resp_config cfg;       /* copy; keys point to keys below */
	kvt_api_key *keys;         /* [n_keys + n_admin_keys] copies */
	size_t n_keys;             /* all of them */
	char version[32];          /* cfg.version copy */
	int lfd;                   /* the listening socket */
	int wake_fd;               /* eventfd: stop wakes the accept thread */
	uint16_t port;
	pthread_t acceptor;
	bool acceptor_started;
	atomic_bool stopping;
	pthread_mutex_t mu;        /* conns, n_conns */
	pthread_cond_t cv;         /* signalled when a connection thread ends */
	struct kvt_resp_conn *conns; /* open connections (a list) */
	uint32_t n_conns;          /* their number (threads not yet ended) */
	atomic_uint_fast64_t next_id;
	double t_start;            /* monotonic, for INFO's uptime */
	/* counters (kvt_resp_stats) */
	atomic_uint_fast64_t conns_total, conns_refused, commands, protocol_errors, auth_failures, bytes_in, bytes_out;
};

typedef struct kvt_resp_conn {
	kvt_resp *r;               /* the listener */
	struct kvt_resp_conn *next, *prev; /* in r->conns */
	int fd;
	uint64_t id;               /* CLIENT ID */
	char ns[KVT_KVS_NS_MAX + 1]; /* the namespace: the AUTH key's tenant ("default" without keys) */
	bool authed;               /* AUTH succeeded (or no keys configured) */
	bool quit;                 /* QUIT: flush, then close */
	char name[64];             /* CLIENT SETNAME */
	kvt_resp_parser p;
	kvt_resp_out out;
	kvt_kvs_ticket ticket;     /* the highest write ticket since the last flush (0: none); waiting on it
				      covers every earlier one (kvstore.h: tickets are acknowledged in order) */
	uint8_t *rbuf;             /* [KVT_RESP_RBUF] read buffer */
} kvt_resp_conn;

/* Run the complete command in c->p (argc >= 1), appending its reply to c->out. */
void kvt_resp_cmd_run(kvt_resp_conn *c);
/* INFO [section ...] (resp_info.c). */
void kvt_resp_info(kvt_resp_conn *c, const kvt_resp_arg *a, size_t n);
/* The connection's namespace's row of the store's figures (zeros when it has none yet). */
void kvt_resp_ns_row(const kvt_resp_conn *c, const kvt_kvs_stats *st, kvt_kvs_tenant_stats *row);

#endif
