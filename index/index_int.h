/*
 * index/index_int.h — internals shared by the index module's files (not part
 * of the public API).
 */
#ifndef KVT_INDEX_INT_H
#define KVT_INDEX_INT_H

#include "index.h"

/*
 * Hash n_blocks full blocks of tokens under root, writing block i's hash to
 * out + i * stride_bytes (so it can fill the hash field of an array of
 * structs). Same results as kvt_hash_chain.
 */
int kvt_hash_chain_strided(const uint8_t root[KVT_HASH_BYTES], const int32_t *tokens, uint32_t n_blocks,
			   uint32_t block_tokens, uint8_t *out, size_t stride_bytes);

/* ---- the session journal (index/journal.c) ---- */

enum { KVT_SJ_PUT = 1, KVT_SJ_DEL = 2 };

/* One session write as the journal keeps it. */
typedef struct kvt_sj_rec {
	uint64_t seq;                      /* increasing over the journal's life */
	uint8_t kind;                      /* KVT_SJ_PUT, KVT_SJ_DEL */
	kvt_db_ns ns;                      /* the namespace of the session */
	char tenant[KVT_NAME_MAX + 1];     /* tenant name */
	char id[KVT_NAME_MAX + 1];         /* session id */
	const int32_t *tokens;             /* [n_tokens] history (put); borrowed */
	uint32_t n_tokens;                 /* 0 for a delete */
	uint8_t last_hash[KVT_HASH_BYTES]; /* put: hash of the last full block */
	int64_t updated;                   /* unix seconds of the write */
} kvt_sj_rec;

typedef struct kvt_sj_info {
	bool existed;        /* the file was there */
	uint64_t n_records;  /* whole, checked records */
	uint64_t last_seq;   /* highest seq among them (0: none) */
	uint64_t torn_bytes; /* bytes after the last whole record (cut off) */
} kvt_sj_info;

typedef struct kvt_sjournal kvt_sjournal;

/*
 * Open (create) the journal, calling fn (may be NULL) for each whole record in
 * file order (fn non-zero stops and is returned), and cut a torn tail. r and
 * r->tokens are valid during the call only. io (borrowed; NULL = syscalls)
 * carries every later write, sync, truncation and rename of the file.
 * KVT_EIO, KVT_ENOMEM.
 */
int kvt_sj_open(const char *path, const kvt_db_journal_io *io, int (*fn)(void *ctx, const kvt_sj_rec *r), void *ctx,
		kvt_sjournal **out, kvt_sj_info *info);
/* Buffer one record (written by the next kvt_sj_sync). KVT_ENOMEM. */
int kvt_sj_append(kvt_sjournal *j, const kvt_sj_rec *r);
/* Drop the buffered records. */
void kvt_sj_abort(kvt_sjournal *j);
/*
 * Write the buffered records and fdatasync. KVT_EFULL when the write found no
 * space (the file is cut back: retry later); KVT_EIO on any other failure,
 * a failed fdatasync included (logged).
 */
int kvt_sj_sync(kvt_sjournal *j);
/* Bytes of whole records in the file. */
uint64_t kvt_sj_bytes(const kvt_sjournal *j);
/* Bytes one record takes. */
size_t kvt_sj_record_bytes(const kvt_sj_rec *r);
/*
 * Replace the file by what each() appends to tmp (kvt_sj_append), durably:
 * tmp file, fdatasync, rename, fsync of the directory. The old file stays on
 * failure.
 */
int kvt_sj_rewrite(kvt_sjournal *j, int (*each)(void *ctx, kvt_sjournal *tmp), void *ctx);
void kvt_sj_close(kvt_sjournal *j); /* NULL is a no-op */

#endif
