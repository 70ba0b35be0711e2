/*
 * engine/cli/cli_index.h — index maintenance over a data directory: `kvtier
 * fsck` and `kvtier rebuild-index`. (The start-up recovery, T2 free map and
 * block table from the index rows, is the daemon's: kvt_tm_recover, tiers/manager.h.)
 *
 * A data directory holds KVT_DATA_T2_FILE (the T2 store) and
 * KVT_DATA_INDEX_FILE (the SQLite index); see index/index.h.
 */
#ifndef KVT_CLI_INDEX_H
#define KVT_CLI_INDEX_H

#include "config.h"
#include "index.h"
#include "t2_store.h"

/* The model fingerprint recorded in a T2 file's superblock (magic checked). */
int kvt_t2_file_model_fp(const char *t2_path, uint8_t out[32]);

/*
 * Where an offline tool finds a daemon's state: the data directory (its lock,
 * index/datadir.c), the T2 file or device and the SQLite index. From a
 * directory alone both files are inside it (kvt_index_paths); from kvtierd's
 * configuration, tier.nvme path and index.path override (as the daemon reads them).
 */
typedef struct kvt_data_paths {
	char dir[4096];   /* index.data_dir: holds the lock */
	char t2[4096];    /* tier.nvme path, or DIR/KVT_DATA_T2_FILE */
	char index[4096]; /* index.path, or DIR/KVT_DATA_INDEX_FILE */
} kvt_data_paths;

/* Paths of a plain data directory. KVT_EINVAL (logged) for an empty or too long path. */
int kvt_data_paths_dir(const char *dir, kvt_data_paths *p);
/* Paths as kvtierd with configuration c uses them. KVT_EINVAL (logged) as above. */
int kvt_data_paths_config(const kvt_config *c, kvt_data_paths *p);

typedef struct kvt_rebuild_stats {
	uint64_t n_records;    /* valid records found by the scan */
	uint64_t n_bad;        /* corrupt or torn records the scan skipped */
	uint64_t n_duplicates; /* older copies of a hash (lower generation) dropped */
	uint64_t n_rows;       /* rows written */
	uint32_t n_namespaces; /* namespaces (block sizes) written */
	uint64_t n_sessions;   /* session writes replayed from the session journal (every namespace) */
} kvt_rebuild_stats;

/*
 * Reconstruct DIR's index from the T2 record headers alone. model_fp: NULL
 * takes the T2 superblock's, else it must match it. The old index (and its
 * WAL) is renamed to "<index>.broken-<unix time>" (never deleted); the new one
 * is built under a temporary name and renamed into place. The sessions come
 * back from the session journal (DIR/KVT_DATA_SESSIONS_FILE), replayed into
 * the new file as it is created. KVT_ENOTFOUND (no T2 file), KVT_EINVAL (another
 * model), KVT_EBUSY (a daemon holds the directory: nothing touched),
 * T2/SQLite errors otherwise (logged). _at takes the paths.
 */
int kvt_index_rebuild(const char *data_dir, const uint8_t *model_fp, kvt_rebuild_stats *st);
int kvt_index_rebuild_at(const kvt_data_paths *dp, const uint8_t *model_fp, kvt_rebuild_stats *st);

typedef struct kvt_fsck_stats {
	uint64_t n_rows;    /* rows checked (every namespace) */
	uint64_t n_ok;      /* rows whose record verified and matches the row */
	uint64_t n_bad;     /* rows pointing at bytes that fail verification or do not match */
	uint64_t n_deleted; /* bad rows deleted (repair) */
	uint64_t n_io;      /* rows not checked because the read failed with an I/O error */
} kvt_fsck_stats;

/*
 * Verify every row of DIR's index by reading its record through kvt_t2_read
 * (checksum, offset, generation, model, hash) and comparing the record's
 * tokens and parent with the row's; overlapping extents count as bad too.
 * With repair, bad rows are deleted (a row whose read hit an I/O error is
 * kept). KVT_OK when the walk completed (look at st), KVT_EBUSY when a
 * daemon holds the directory (nothing touched), else an error. _at takes the paths.
 */
int kvt_index_fsck(const char *data_dir, bool repair, kvt_fsck_stats *st);
int kvt_index_fsck_at(const kvt_data_paths *dp, bool repair, kvt_fsck_stats *st);

/*
 * The subcommands, argv[0] being the subcommand name:
 *   kvtier fsck (--data-dir DIR | -c FILE) [--dry-run]
 *   kvtier rebuild-index (--data-dir DIR | -c FILE) [--model MODEL.gguf]
 * Exit status: 0 success (fsck: every row verified), 1 runtime failure,
 * 2 bad usage, 3 (fsck) bad rows found (deleted unless --dry-run),
 * 75 (EX_TEMPFAIL) a running daemon holds the directory (nothing touched).
 */
int kvt_cli_fsck(int argc, char **argv);
int kvt_cli_rebuild_index(int argc, char **argv);

#endif
