/*
 * engine/serve/kvtierd_main.c — kvtierd, the daemon: configuration, start-up in
 * the order that lets /health answer while the model loads, the signal
 * loop, and the graceful stop.
 *
 *   kvtierd [-c FILE] [--listen HOST:PORT] [--data-dir DIR] [--model PATH]
 *           [--device auto|cuda|cpu] [--check-config] [--print-config]
 *   kvtierd --version | --help
 *
 * The --help text, like the man page kvtierd(8), is generated from
 * docs/manual.toml (kvt_manual.h); --version from the build (kvt_version.h).
 *
 * Start-up: config -> log -> HTTP server (503 "loading") -> device, model,
 * tokenizer -> data dir: secret, index, NVMe store -> tiering manager,
 * recovery of the durable blocks -> scheduler -> ready (sd_notify READY=1).
 * SIGTERM/SIGINT: drain (bounded by server.drain_timeout), persist every
 * session's blocks to NVMe, commit the index, exit 0. SIGHUP: reopen the log
 * file and re-read the log level. Exit codes: sysexits.h.
 */
#include "config.h"
#include "fingerprint.h"
#include "gguf.h"
#include "index.h"
#include "kvt_manual.h"
#include "kvt_version.h"
#include "kvstore.h"
#include "model.h"
#include "sdnotify.h"
#include "stack.h"
#include "t2_store.h"
#include "resp.h"
#include "server.h"
#include "tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sysexits.h>
#include <time.h>
#include <unistd.h>

/* ---- log sink: a file (reopened on SIGHUP) or stderr ---- */

static FILE *log_fp;
static pthread_mutex_t log_fp_mu = PTHREAD_MUTEX_INITIALIZER;
static char first_error[512]; /* the first error line of the run (the cause; the refused start repeats it) */

static void log_sink(int level, const char *msg, void *user)
{
	static const char *names[] = { "error", "warn", "info", "debug" };
	(void)user;
	struct timespec ts;
	struct tm tm;
	char when[32];
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
	pthread_mutex_lock(&log_fp_mu);
	if (level == KVT_LOG_ERROR && !first_error[0])
		snprintf(first_error, sizeof(first_error), "%s", msg);
	FILE *f = log_fp ? log_fp : stderr;
	fprintf(f, "%s.%03ldZ kvtierd %s: %s\n", when, ts.tv_nsec / 1000000, names[level < 0 ? 0 : level > 3 ? 3 : level],
		msg);
	fflush(f);
	pthread_mutex_unlock(&log_fp_mu);
}

static int log_open(const char *path)
{
	if (!path[0])
		return KVT_OK;
	FILE *f = fopen(path, "a");
	if (!f) {
		fprintf(stderr, "kvtierd: cannot open the log file %s: %s\n", path, strerror(errno));
		return KVT_EIO;
	}
	pthread_mutex_lock(&log_fp_mu);
	FILE *old = log_fp;
	log_fp = f;
	pthread_mutex_unlock(&log_fp_mu);
	if (old)
		fclose(old);
	return KVT_OK;
}

/* ---- helpers ---- */

static void usage(FILE *f)
{
	fputs(KVT_HELP_KVTIERD, f);
}

static void version(void)
{
	printf("kvtierd %s\ncommit: %s\nbuild: %s (%s)\nbackends: %s\n", KVT_VERSION, KVT_GIT_COMMIT, KVT_BUILD_TYPE,
	       KVT_BUILD_OPTIONS, KVT_BACKENDS);
}

static int mkdir_p(const char *dir)
{
	char buf[KVT_CONFIG_PATH_MAX];
	snprintf(buf, sizeof(buf), "%s", dir);
	for (char *p = buf + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = 0;
		if (mkdir(buf, 0700) && errno != EEXIST)
			return -1;
		*p = '/';
	}
	if (mkdir(buf, 0700) && errno != EEXIST)
		return -1;
	return 0;
}

/*
 * Every conversation's token history lives in the data directory: whatever
 * kvtierd creates there is private to its user, whatever the umask it was
 * started with (a shell's 022 would leave the index and T2 file 0644).
 * Existing paths with group/other bits are named in a warning.
 */
static void warn_open_modes(const char *const *paths, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		struct stat sb;
		if (paths[i] && stat(paths[i], &sb) == 0 && (sb.st_mode & 077))
			KVT_LOGW("%s is mode %04o: other users can read conversation data; chmod %s it", paths[i],
				 (unsigned)(sb.st_mode & 07777), S_ISDIR(sb.st_mode) ? "700" : "600");
	}
}

/* The server secret: read it, or create 32 random bytes (0600) on first start. */
/*
 * Open a file the daemon reads whole at start (a secret, a key file): it must
 * be a regular file of at most max_bytes. A device (/dev/zero), a FIFO or a
 * directory is refused by name, never read (opened without blocking, so a
 * FIFO with no writer cannot hang the start). what names the config key for
 * the messages. The fd, or -1 (logged; errno kept for ENOENT).
 */
static int open_small_file(const char *path, const char *what, off_t max_bytes, struct stat *sb)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	if (fd < 0) {
		if (errno != ENOENT)
			KVT_LOGE("%s %s: %s", what, path, strerror(errno));
		return -1;
	}
	if (fstat(fd, sb) != 0) {
		KVT_LOGE("%s %s: %s", what, path, strerror(errno));
		close(fd);
		errno = EIO;
		return -1;
	}
	if (!S_ISREG(sb->st_mode) || sb->st_size > max_bytes) {
		if (!S_ISREG(sb->st_mode))
			KVT_LOGE("%s %s is not a regular file (%s): it must be a file of at most %lld bytes", what, path,
				 S_ISDIR(sb->st_mode) ? "a directory" : S_ISFIFO(sb->st_mode) ? "a FIFO" :
				 S_ISCHR(sb->st_mode) || S_ISBLK(sb->st_mode) ? "a device" : "not a file",
				 (long long)max_bytes);
		else
			KVT_LOGE("%s %s is %lld bytes: at most %lld are read", what, path, (long long)sb->st_size,
				 (long long)max_bytes);
		close(fd);
		errno = EINVAL;
		return -1;
	}
	int fl = fcntl(fd, F_GETFL);
	if (fl >= 0)
		(void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
	return fd;
}

/* The model's fingerprint, computed on a thread of its own while the model loads (fp_main, fp_wait). */
typedef struct fp_job {
	const char *path;  /* the GGUF */
	const char *cache; /* the data dir's fingerprint.cache */
	uint8_t stored[32]; /* the NVMe tier's superblock's, or zeros: the data dir stores none */
	int forced;        /* [model] fingerprint: 0 auto (the data dir's), else the version */
	uint8_t *fp;       /* out: 32 bytes */
	int version;       /* out: the fingerprint version the data dir uses */
	double seconds;    /* out: time taken */
	int rc;            /* kvt_model_fingerprint_for's */
	bool threaded;     /* thread runs it (else it ran inline) */
	pthread_t thread;
} fp_job;

static void *fp_main(void *arg)
{
	fp_job *j = arg;
	double t0 = kvt_now_s();
	if (j->forced) {
		j->version = j->forced;
		j->rc = kvt_model_fingerprint(j->path, j->cache, j->forced, j->fp, NULL);
	} else {
		j->rc = kvt_model_fingerprint_for(j->path, j->cache, j->stored, j->fp, &j->version);
	}
	j->seconds = kvt_now_s() - t0;
	return NULL;
}

/* Wait for the fingerprint (once, on every path out of the load); its result code. */
static int fp_wait(fp_job *j)
{
	if (j->threaded)
		pthread_join(j->thread, NULL);
	return j->rc;
}

static int load_secret(const char *path, uint8_t *out, size_t *n)
{
	struct stat sb;
	int fd = open_small_file(path, "secret file", 64, &sb);
	if (fd < 0 && errno != ENOENT)
		return errno == EINVAL ? KVT_EINVAL : KVT_EIO;
	if (fd >= 0) {
		if (sb.st_mode & 077) { /* as ssh refuses a private key others can read */
			KVT_LOGE("secret file %s is readable by group or others (mode %04o): whoever reads it can aim at "
				 "any tenant's cache; chmod 600 %s",
				 path, (unsigned)(sb.st_mode & 07777), path);
			close(fd);
			return KVT_EINVAL;
		}
		ssize_t r = read(fd, out, 64);
		close(fd);
		if (r < 16) {
			KVT_LOGE("secret file %s: %zd bytes, needs 16 to 64", path, r);
			return KVT_EINVAL;
		}
		*n = (size_t)r;
		return KVT_OK;
	}
	if (getrandom(out, 32, 0) != 32) {
		KVT_LOGE("getrandom: %s", strerror(errno));
		return KVT_EIO;
	}
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0 || write(fd, out, 32) != 32 || fsync(fd)) {
		KVT_LOGE("cannot create the secret file %s: %s", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return KVT_EIO;
	}
	close(fd);
	*n = 32;
	KVT_LOGI("created a new server secret in %s", path);
	return KVT_OK;
}

/* The T3 AUTH password: the first line of path, which only its owner may read. Never logged. */
static int load_remote_password(const char *path, char *out, size_t cap)
{
	struct stat sb;
	int fd = open_small_file(path, "[tier.remote] password_file", (off_t)cap - 1, &sb);
	if (fd < 0) {
		if (errno == ENOENT)
			KVT_LOGE("[tier.remote] password_file %s: %s", path, strerror(ENOENT));
		return errno == EINVAL ? KVT_EINVAL : KVT_EIO;
	}
	if (sb.st_mode & 077) {
		KVT_LOGE("[tier.remote] password_file %s is readable by group or others (mode %04o); chmod 600 %s", path,
			 (unsigned)(sb.st_mode & 07777), path);
		close(fd);
		return KVT_EINVAL;
	}
	ssize_t r = read(fd, out, cap - 1);
	close(fd);
	if (r < 0) {
		KVT_LOGE("[tier.remote] password_file %s: %s", path, strerror(errno));
		return KVT_EIO;
	}
	out[r] = 0;
	out[strcspn(out, "\r\n")] = 0;
	if (!out[0]) {
		KVT_LOGE("[tier.remote] password_file %s is empty", path);
		return KVT_EINVAL;
	}
	return KVT_OK;
}

static void data_path(char *out, size_t cap, const char *dir, const char *set, const char *name)
{
	if (set && set[0])
		snprintf(out, cap, "%s", set);
	else
		snprintf(out, cap, "%s/%s", dir, name);
}

static const char *basename_of(const char *p)
{
	const char *s = strrchr(p, '/');
	return s ? s + 1 : p;
}

/*
 * Every connection is a file descriptor: raise the soft RLIMIT_NOFILE to the
 * hard limit, and warn when max_connections plus room for the data files
 * still does not fit (connections past the limit would fail to be accepted).
 */
static void raise_fd_limit(uint32_t max_connections)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return;
	if (rl.rlim_cur < rl.rlim_max) {
		rlim_t was = rl.rlim_cur;
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
			rl.rlim_cur = was;
	}
	if (rl.rlim_cur != RLIM_INFINITY && (uint64_t)max_connections + 256 > (uint64_t)rl.rlim_cur)
		KVT_LOGW("server.max_connections %u needs about %u file descriptors; RLIMIT_NOFILE is %llu "
			 "(raise it, e.g. LimitNOFILE= in the unit, or lower max_connections)",
			 max_connections, max_connections + 256, (unsigned long long)rl.rlim_cur);
}

/*
 * A non-loopback listen address with no API key serves every conversation to
 * the network: refused (EX_CONFIG, one message naming the ways out) unless
 * server.allow_unauthenticated says so. n_keys counts the keys that will be
 * in force.
 */
static int exposure_check(const kvt_config *c, size_t n_keys, const char *path)
{
	if (!n_keys && !c->allow_unauthenticated && kvt_config_store_enabled(c) &&
	    !kvt_config_host_loopback(c->store_listen_host)) {
		const char *v6 = strchr(c->store_listen_host, ':') ? "[" : "";
		fprintf(stderr,
			"kvtierd: %s: store.listen = %s%s%s:%u serves the key-value store to the network with no API key. "
			"Set server.api_keys (or api_key_file, admin_keys: clients AUTH with one), listen on a loopback "
			"address, or set server.allow_unauthenticated = true\n",
			path ? path : "built-in defaults", v6, c->store_listen_host, *v6 ? "]" : "", c->store_listen_port);
		return -1;
	}
	if (n_keys || c->allow_unauthenticated || kvt_config_listen_loopback(c))
		return 0;
	const char *v6 = strchr(c->listen_host, ':') ? "[" : "";
	fprintf(stderr,
		"kvtierd: %s: server.listen = %s%s%s:%u serves the network with no API key. Set server.api_keys (or "
		"api_key_file, admin_keys), listen on a loopback address (127.0.0.1), or, to serve it unauthenticated "
		"anyway, set server.allow_unauthenticated = true\n",
		path ? path : "built-in defaults", v6, c->listen_host, *v6 ? "]" : "", c->listen_port);
	return -1;
}

/* ---- the daemon ---- */

typedef struct daemon {
	kvt_config cfg;
	kvt_server *srv;
	kvt_gguf *g;          /* the model file, mapped: open while the model lives (its weights point into it) */
	kvt_tok *tok;
	kvt_dev *dev;
	kvt_model *model;
	kvt_stack st;      /* index, tiers, scheduler */
	kvt_datadir_lock *lock; /* index.data_dir's lock, held from before the stack opens until after it closes */
	kvt_api_key *keys; /* config keys plus api_key_file */
	size_t n_keys;
	uint64_t host_bytes;   /* [tier.host] capacity as resolved (auto: 2 GiB) */
	uint64_t nvme_bytes;   /* [tier.nvme] capacity as resolved (0: no NVMe tier) */
	kvt_kvs *kvs;          /* the key-value store ([store] listen set), NULL otherwise */
	kvt_resp *resp;        /* its Redis-protocol listener */
} daemon_t;

#define KVT_KEY_FILE_MAX (1 << 20) /* server.api_key_file: at most this many bytes (some 10,000 keys) */

static int read_key_file(daemon_t *d)
{
	const kvt_config *c = &d->cfg;
	size_t cap = c->n_api_keys + 16;
	d->keys = calloc(cap, sizeof(*d->keys));
	if (!d->keys)
		return KVT_ENOMEM;
	memcpy(d->keys, c->api_keys, c->n_api_keys * sizeof(*d->keys));
	d->n_keys = c->n_api_keys;
	if (!c->api_key_file[0])
		return KVT_OK;
	struct stat sb;
	int fd = open_small_file(c->api_key_file, "server.api_key_file", KVT_KEY_FILE_MAX, &sb);
	if (fd < 0) {
		if (errno == ENOENT)
			KVT_LOGE("server.api_key_file %s: %s", c->api_key_file, strerror(ENOENT));
		return errno == EINVAL ? KVT_EINVAL : KVT_EIO;
	}
	FILE *f = fdopen(fd, "r");
	if (!f) {
		close(fd);
		return KVT_ENOMEM;
	}
	char line[512];
	unsigned ln = 0;
	int rc = KVT_OK;
	while (fgets(line, sizeof(line), f)) {
		ln++;
		if (!strchr(line, '\n') && !feof(f)) {
			KVT_LOGE("%s:%u: line longer than %zu bytes", c->api_key_file, ln, sizeof(line) - 2);
			rc = KVT_EINVAL;
			break;
		}
		line[strcspn(line, "\r\n")] = 0;
		if (!line[0] || line[0] == '#')
			continue;
		char *colon = strchr(line, ':');
		if (!colon || colon == line || !colon[1]) {
			KVT_LOGE("%s:%u: expected \"tenant:key\"", c->api_key_file, ln);
			rc = KVT_EINVAL;
			break;
		}
		*colon = 0;
		if (kvt_name_check("tenant", line) || strlen(colon + 1) >= sizeof(d->keys->key)) {
			KVT_LOGE("%s:%u: bad tenant name or key too long", c->api_key_file, ln);
			rc = KVT_EINVAL;
			break;
		}
		if (d->n_keys == cap) {
			kvt_api_key *k = realloc(d->keys, 2 * cap * sizeof(*k));
			if (!k) {
				rc = KVT_ENOMEM;
				break;
			}
			d->keys = k;
			cap *= 2;
		}
		memcpy(d->keys[d->n_keys].tenant, line, strlen(line) + 1); /* checked: <= KVT_NAME_MAX */
		memcpy(d->keys[d->n_keys].key, colon + 1, strlen(colon + 1) + 1);
		d->n_keys++;
	}
	fclose(f);
	return rc;
}

/*
 * The NVMe tier's size (tier.nvme capacity, "auto" by default) against the
 * free space of the file system that holds (or will hold) the T2 file, so a
 * default never preallocates more than the disk has. Logs the choice.
 */
static int nvme_capacity(const kvt_config *c, const char *t2_path, uint64_t *out)
{
	char dir[KVT_CONFIG_PATH_MAX + 32], err[1024];
	struct stat sb;
	struct statvfs vs;
	uint64_t existing = 0;
	if (!c->nvme.capacity_auto && !c->nvme.capacity_bytes) {
		*out = 0;
		return KVT_OK;
	}
	if (stat(t2_path, &sb) == 0 && S_ISREG(sb.st_mode))
		existing = (uint64_t)sb.st_size;
	snprintf(dir, sizeof(dir), "%s", t2_path);
	char *slash = strrchr(dir, '/');
	if (slash)
		*(slash == dir ? slash + 1 : slash) = '\0';
	else
		snprintf(dir, sizeof(dir), ".");
	if (statvfs(dir, &vs) != 0) {
		KVT_LOGE("tier.nvme %s: cannot measure the free space of %s: %s", t2_path, dir, strerror(errno));
		return KVT_EIO;
	}
	uint64_t free_bytes = (uint64_t)vs.f_bavail * (uint64_t)vs.f_frsize;
	int rc = kvt_config_nvme_capacity(&c->nvme, free_bytes, existing, out, err, sizeof(err));
	if (rc) {
		KVT_LOGE("%s (T2 file %s)", err, t2_path);
		return rc;
	}
	if (existing)
		KVT_LOGI("tier.nvme: %s exists: it keeps its %llu bytes", t2_path, (unsigned long long)existing);
	else if (c->nvme.capacity_auto)
		KVT_LOGI("tier.nvme capacity auto: %llu MiB (half of the %llu MiB free on %s, at most %llu MiB, at least "
			 "%llu MiB)",
			 (unsigned long long)(*out >> 20), (unsigned long long)(free_bytes >> 20), dir,
			 (unsigned long long)(KVT_NVME_AUTO_MAX >> 20), (unsigned long long)(KVT_NVME_AUTO_MIN >> 20));
	return KVT_OK;
}

/* Everything after the server is up: model, tiers, index, scheduler. */

/*
 * The [tenants] quota lists, one entry per tenant named in any of them ("*"
 * included). A field a named tenant does not set is the "*" entry's.
 */
static size_t merge_quotas(const kvt_config *c, kvt_stack_quota *out)
{
	size_t n = 0;
	bool given[4 * KVT_CONFIG_MAX_QUOTAS][4] = { { false } };
	const kvt_quota_list *lists[4] = { &c->retain_quota, &c->retain_quota_tier[0], &c->retain_quota_tier[1],
					   &c->retain_quota_tier[2] };
	for (int l = 0; l < 4; l++)
		for (size_t i = 0; i < lists[l]->n; i++) {
			const kvt_quota_entry *q = &lists[l]->e[i];
			size_t k = 0;
			while (k < n && strcmp(out[k].tenant, q->tenant))
				k++;
			if (k == n) {
				memset(&out[n], 0, sizeof(out[n]));
				memcpy(out[n].tenant, q->tenant, sizeof(out[n].tenant));
				n++;
			}
			given[k][l] = true;
			if (l == 0)
				out[k].quota.bytes = q->bytes;
			else
				out[k].quota.tier_bytes[l - 1] = q->bytes;
		}
	for (size_t d = 0; d < n; d++) {
		if (strcmp(out[d].tenant, "*"))
			continue;
		for (size_t k = 0; k < n; k++) {
			if (!given[k][0])
				out[k].quota.bytes = out[d].quota.bytes;
			for (int t = 0; t < 3; t++)
				if (!given[k][t + 1])
					out[k].quota.tier_bytes[t] = out[d].quota.tier_bytes[t];
		}
	}
	return n;
}

static int bring_up(daemon_t *d, int *exit_code)
{
	const kvt_config *c = &d->cfg;
	char t2_path[KVT_CONFIG_PATH_MAX + 32], db_path[KVT_CONFIG_PATH_MAX + 32], fp_cache[KVT_CONFIG_PATH_MAX + 32],
		secret_path[KVT_CONFIG_PATH_MAX + 32], sj_path[KVT_CONFIG_PATH_MAX + 32],
		reserve_path[KVT_CONFIG_PATH_MAX + 32], rate_path[KVT_CONFIG_PATH_MAX + 32];
	uint8_t fp[32], secret[64];
	size_t secret_n = 0;
	int rc;

	*exit_code = EX_SOFTWARE;
	if (mkdir_p(c->data_dir)) {
		KVT_LOGE("index.data_dir %s: cannot create: %s", c->data_dir, strerror(errno));
		*exit_code = EX_CANTCREAT;
		return KVT_EIO;
	}
	/* Before anything in the directory is read: no second daemon and no offline tool beside this one. */
	if ((rc = kvt_datadir_lock_take(c->data_dir, "kvtierd", &d->lock))) {
		*exit_code = rc == KVT_EBUSY ? EX_TEMPFAIL : EX_CANTCREAT;
		return rc;
	}
	data_path(t2_path, sizeof(t2_path), c->data_dir, c->nvme_path, "kvtier.t2");
	data_path(db_path, sizeof(db_path), c->data_dir, c->index_path, "index.sqlite");
	data_path(secret_path, sizeof(secret_path), c->data_dir, c->secret_file, "secret");
	snprintf(fp_cache, sizeof(fp_cache), "%s/fingerprint.cache", c->data_dir);
	snprintf(rate_path, sizeof(rate_path), "%s/prefill.rate", c->data_dir);
	data_path(sj_path, sizeof(sj_path), c->data_dir, "", KVT_DATA_SESSIONS_FILE);
	data_path(reserve_path, sizeof(reserve_path), c->data_dir, "", KVT_DATA_RESERVE_FILE);
	const char *mine[] = { c->data_dir, db_path, t2_path, sj_path };
	warn_open_modes(mine, sizeof(mine) / sizeof(mine[0]));
	struct stat sb_db, sb_t2;
	if (stat(db_path, &sb_db) != 0 && errno == ENOENT && stat(t2_path, &sb_t2) == 0 && S_ISREG(sb_t2.st_mode) &&
	    sb_t2.st_size > 0) {
		/* Starting on an empty index would hand the T2 file's extents out again and overwrite them. */
		int lfd = open(t2_path, O_RDONLY | O_CLOEXEC);
		bool locked = lfd >= 0 && flock(lfd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
		if (lfd >= 0)
			close(lfd); /* drops the probe's lock if it got one */
		if (locked) { /* the T2 store's own open would say the same, after this check */
			KVT_LOGE("t2 %s: locked by another process: another daemon (or an offline kvtier command) uses "
				 "this [tier.nvme] path; give each daemon its own",
				 t2_path);
			*exit_code = EX_TEMPFAIL;
			return KVT_EBUSY;
		}
		KVT_LOGE("index %s is missing but the NVMe tier's file %s holds data: run `kvtier rebuild-index "
			 "--data-dir %s` (the blocks come back from the T2 records, the sessions from %s), or move %s "
			 "away to start empty; if another data directory's daemon uses this file, give this one its own "
			 "[tier.nvme] path",
			 db_path, t2_path, c->data_dir, sj_path, t2_path);
		*exit_code = EX_DATAERR;
		return KVT_ECORRUPT;
	}
	uint64_t nvme_bytes = 0;
	if ((rc = nvme_capacity(c, t2_path, &nvme_bytes))) {
		*exit_code = rc == KVT_EFULL ? EX_CONFIG : EX_IOERR;
		return rc;
	}
	if ((rc = load_secret(secret_path, secret, &secret_n))) {
		*exit_code = EX_CONFIG;
		return rc;
	}

	/*
	 * model: its fingerprint (hashed on a first start, on every CPU, then kept
	 * in the data dir by stat; in the version the NVMe tier's KV was stored
	 * under) on threads of its own while it loads; the index needs it only
	 * after
	 */
	kvt_sd_notify("STATUS=loading the model");
	KVT_LOGI("loading %s", c->model_path);
	fp_job fj = { .path = c->model_path, .cache = fp_cache, .forced = c->fp_version, .fp = fp };
	kvt_t2_info t2i;
	if (nvme_bytes && stat(t2_path, &sb_t2) == 0 && sb_t2.st_size > 0 && kvt_t2_probe(t2_path, &t2i) == KVT_OK)
		memcpy(fj.stored, t2i.model_fp, 32); /* the version its KV was stored under is kept */
	fj.threaded = pthread_create(&fj.thread, NULL, fp_main, &fj) == 0;
	if (!fj.threaded)
		fp_main(&fj);
	if ((rc = kvt_gguf_open(c->model_path, &d->g)) || (rc = kvt_tok_create_from_gguf(d->g, &d->tok)) ||
	    (rc = kvt_tok_set_chat(d->tok, c->chat_template))) {
		fp_wait(&fj);
		KVT_LOGE("model.path %s: cannot load: %s", c->model_path, kvt_strerror(rc));
		*exit_code = EX_DATAERR;
		return rc;
	}
	if (kvt_tok_chat_kind(d->tok) == KVT_TOK_CHAT_AUTO)
		KVT_LOGW("model.path %s: no known chat template (set [model] chat_template): "
			 "/v1/chat/completions will be refused, /v1/completions works", c->model_path);
	int kind = c->device == KVT_DEVICE_CUDA ? KVT_DEV_CUDA : c->device == KVT_DEVICE_CPU ? KVT_DEV_CPU : KVT_DEV_AUTO;
	kvt_dev_config dc = { .kind = kind, .n_threads = (int)c->model_threads, .act_int8 = c->act_int8 != 0 };
	if ((rc = kvt_dev_create(&dc, &d->dev))) {
		fp_wait(&fj);
		*exit_code = EX_UNAVAILABLE;
		return rc;
	}
	kvt_model_config mc;
	kvt_model_config_default(&mc);
	mc.max_ctx = c->max_ctx;
	mc.max_batch = c->max_batch;
	mc.map_weights = true; /* d->g stays open until tear_down, after the model */
	double tl = kvt_now_s();
	if ((rc = kvt_model_load(d->dev, d->g, &mc, &d->model))) {
		fp_wait(&fj);
		*exit_code = EX_DATAERR;
		return rc;
	}
	KVT_LOGI("model loaded on %s in %.2f s (%.0f MiB of weights, %.0f MiB of them mapped from the file, context %u)",
		 kvt_dev_name(d->dev), kvt_now_s() - tl, kvt_model_weight_bytes(d->model) / 1048576.0,
		 kvt_model_mapped_bytes(d->model) / 1048576.0, kvt_model_max_ctx(d->model));
	if ((rc = fp_wait(&fj))) {
		KVT_LOGE("model.path %s: cannot fingerprint: %s", c->model_path, kvt_strerror(rc));
		*exit_code = EX_DATAERR;
		return rc;
	}
	{
		char hex[65];
		kvt_hash_hex(fp, hex);
		KVT_LOGI("model fingerprint v%d %.16s... in %.2f s", fj.version, hex, fj.seconds);
		static const uint8_t none[32];
		if (fj.forced && memcmp(fj.stored, none, 32) != 0 && memcmp(fj.stored, fp, 32) != 0) {
			char had[65];
			kvt_hash_hex(fj.stored, had);
			KVT_LOGE("model.fingerprint v%d: this model's is %.16s..., but the NVMe tier %s holds KV stored "
				 "under %.16s...: the data directory uses the other fingerprint version (set fingerprint "
				 "= auto to keep it) or holds another model's KV",
				 fj.forced, hex, t2_path, had);
			*exit_code = EX_CONFIG;
			return KVT_EINVAL;
		}
	}

	/* T0 */
	const uint32_t bt = c->block_tokens, max_ctx = kvt_model_max_ctx(d->model);
	kvt_kv_layout shape;
	kvt_model_kv_shape(d->model, bt, &shape);
	const size_t block_bytes = kvt_kv_block_bytes(&shape);
	uint64_t hbm = c->hbm.capacity_bytes;
	const uint64_t min_t0 = (max_ctx + bt - 1) / bt + 2;
	if ((c->hbm.capacity_auto || !hbm) && kvt_dev_kind(d->dev) == KVT_DEV_CUDA) {
		hbm = 4ull << 30;
	} else if (c->hbm.capacity_auto || !hbm) {
		/* T0 and T1 are both host RAM here: T0 holds what the running batch needs (one full
		 * context, and a prefill chunk for each running request); older KV waits in T1 */
		const uint64_t n_run = c->max_running < kvt_model_max_batch(d->model) ? c->max_running
										 : kvt_model_max_batch(d->model);
		hbm = (min_t0 + (n_run * c->prefill_chunk + bt - 1) / bt) * block_bytes;
		KVT_LOGI("tier.hbm capacity auto on %s: %.0f MiB, the KV of one %u-token context and a %u-token prefill "
			 "chunk for each of %llu running requests",
			 kvt_dev_name(d->dev), hbm / 1048576.0, max_ctx, c->prefill_chunk, (unsigned long long)n_run);
	}
	uint64_t n_t0 = hbm / block_bytes;
	if (n_t0 < min_t0) {
		KVT_LOGE("tier.hbm capacity %llu bytes holds %llu blocks of %zu bytes; one full-context sequence needs "
			 "%llu: raise tier.hbm capacity to at least %llu or lower model.context",
			 (unsigned long long)hbm, (unsigned long long)n_t0, block_bytes, (unsigned long long)min_t0,
			 (unsigned long long)(min_t0 * block_bytes));
		*exit_code = EX_CONFIG;
		return KVT_EINVAL;
	}
	if (n_t0 > INT32_MAX)
		n_t0 = INT32_MAX;

	/* the stack: index, NVMe store, tiering manager (recovered), scheduler */
	const size_t packed = kvt_kv_packed_bytes(&shape, c->host_dtype);
	uint64_t host = c->host.capacity_bytes;
	if (c->host.capacity_auto || !host)
		host = 2ull << 30;
	d->host_bytes = host;
	d->nvme_bytes = nvme_bytes;
	uint64_t n_t1 = host / packed;
	if (n_t1 < 1) {
		KVT_LOGE("tier.host capacity %llu bytes holds no block of %zu bytes", (unsigned long long)host, packed);
		*exit_code = EX_CONFIG;
		return KVT_EINVAL;
	}
	kvt_stack_config sc;
	kvt_stack_config_default(&sc);
	sc.dev = d->dev;
	sc.model = d->model;
	sc.tok = d->tok;
	memcpy(sc.model_fp, fp, 32);
	sc.block_tokens = bt;
	sc.t0_slots = (uint32_t)n_t0;
	sc.db_path = db_path;
	sc.journal_path = sj_path;
	sc.reserve_path = reserve_path;
	sc.reserve_bytes = c->index_reserve_bytes;
	sc.t2_path = nvme_bytes ? t2_path : NULL;
	sc.t2.capacity_bytes = nvme_bytes;
	sc.t2.queue_depth = c->nvme_queue_depth;
	sc.t2.io_mode = c->nvme_io;
	sc.t2.compress = c->nvme_compression;
	sc.t2.buffered_ok = true;
	sc.tm.t1_slots = n_t1 > INT32_MAX ? INT32_MAX : (uint32_t)n_t1;
	sc.tm.t1_codec = c->host_dtype;
	sc.tm.t2_f16 = c->nvme_f16 == 1 && c->host_dtype != KVT_KV_CODEC_F16;
	sc.tm.persist = c->persist;
	sc.tm.end_turn_s = c->end_turn_s;
	sc.tm.n_io_threads = c->io_threads;
	const kvt_tier_config *tiers[KVT_TIER_COUNT] = { &c->hbm, &c->host, &c->nvme };
	for (int t = 0; t < KVT_TIER_COUNT; t++) {
		sc.tm.high[t] = tiers[t]->high;
		sc.tm.low[t] = tiers[t]->low;
	}
	sc.sched.secret = secret;
	sc.sched.secret_bytes = secret_n;
	sc.sched.max_running = c->max_running;
	sc.sched.max_queue = c->max_queue;
	sc.sched.prefill_chunk = c->prefill_chunk;
	sc.sched.cache = c->cache_enabled;
	sc.sched.policy = c->sched_policy;
	sc.sched.aging_steps = c->aging_steps;
	sc.sched.head_share = c->head_share;
	sc.sched.priority_aging_s = c->priority_aging_s;
	sc.sched.admit_longest = c->admit_longest;
	/* auto: swap only where T1 gives the blocks back bit for bit (greedy output unchanged) */
	sc.sched.preempt = c->preempt != KVT_CONFIG_PREEMPT_AUTO ? c->preempt
			   : c->host_dtype == KVT_KV_CODEC_F16 ? KVT_PREEMPT_SWAP : KVT_PREEMPT_RECOMPUTE;
	{
		char why[256];
		if ((rc = kvt_sched_parse_priorities(c->priorities, &sc.sched, why, sizeof(why)))) {
			KVT_LOGE("[scheduler] priorities: %s", why); /* validated at load: not reached */
			*exit_code = EX_CONFIG;
			return rc;
		}
	}
	KVT_LOGI("scheduler: policy %s, preempt %s, admission by %s, %u tenant priorities (default %d)",
		 c->sched_policy == KVT_SCHED_FIFO ? "fifo" : "fair",
		 sc.sched.preempt == KVT_PREEMPT_SWAP ? "swap" : "recompute", c->admit_longest ? "longest" : "prompt",
		 sc.sched.n_tenant_priority, sc.sched.default_priority);
	sc.sched.retain_tier = c->retain_tier;
	sc.sched.chunk_recompute = c->chunk_recompute;
	sc.sched.chunk_share = c->chunk_share;
	sc.sched.device_decode = c->device_decode;
	sc.sched.rate_path = rate_path; /* the scheduler copies it */
	/* auto: layered where the copy runs beside the compute (a GPU); the CPU backend has nothing to overlap */
	const bool layered = c->host_promotion == KVT_CONFIG_PROMOTION_LAYERED ||
			     (c->host_promotion == KVT_CONFIG_PROMOTION_AUTO && kvt_dev_kind(d->dev) == KVT_DEV_CUDA);
	sc.sched.layer_groups = layered ? c->promotion_groups : 0;
	KVT_LOGI("tier.host promotion: %s", layered ? "layered" : "sequential");
	kvt_stack_quota quotas[4 * KVT_CONFIG_MAX_QUOTAS];
	sc.quotas = quotas;
	sc.n_quotas = merge_quotas(c, quotas);
	char remote_pw[512] = "";
	if (c->remote_enabled) {
		if (c->remote_password_file[0] &&
		    (rc = load_remote_password(c->remote_password_file, remote_pw, sizeof(remote_pw)))) {
			*exit_code = EX_CONFIG;
			return rc;
		}
		sc.remote = true;
		sc.t3.rc.seeds = c->remote_seeds;
		sc.t3.rc.cluster = c->remote_mode == 1;
		sc.t3.rc.user = c->remote_user[0] ? c->remote_user : NULL;
		sc.t3.rc.password = remote_pw[0] ? remote_pw : NULL;
		sc.t3.rc.connect_timeout_ms = (uint32_t)(c->remote_connect_timeout_s * 1e3 + 0.5);
		sc.t3.rc.command_timeout_ms = (uint32_t)(c->remote_command_timeout_s * 1e3 + 0.5);
		if (!sc.t3.rc.connect_timeout_ms)
			sc.t3.rc.connect_timeout_ms = 1;
		if (!sc.t3.rc.command_timeout_ms)
			sc.t3.rc.command_timeout_ms = 1;
		sc.t3.rc.pipeline_depth = c->remote_pipeline;
		sc.t3.prefix = c->remote_prefix;
		sc.t3.ttl_s = (uint32_t)c->remote_ttl_s;
		sc.t3.write_policy = c->remote_write;
	}
	double tr = kvt_now_s();
	rc = kvt_stack_open(&sc, &d->st);
	memset(remote_pw, 0, sizeof(remote_pw)); /* the clients keep their own copies */
	if (rc) {
		*exit_code = rc == KVT_ECORRUPT ? EX_DATAERR : rc == KVT_EIO ? EX_IOERR : EX_SOFTWARE;
		return rc;
	}
	kvt_tm_stats ts = { 0 };
	if (d->st.tm)
		kvt_tm_get_stats(d->st.tm, &ts);
	/* what each pool reserves; on the CPU backend its pages are taken as its slots are first written */
	KVT_LOGI("tiers: hbm %llu blocks (f16, %.0f MiB), host %u blocks (%s, %.0f MiB), nvme %s, remote %s; %llu durable "
		 "blocks recovered, %llu lost, %llu bad rows skipped; ready in %.3f s",
		 (unsigned long long)n_t0, n_t0 * (double)block_bytes / 1048576.0, sc.tm.t1_slots,
		 kvt_kv_codec_name(c->host_dtype), sc.tm.t1_slots * (double)packed / 1048576.0, sc.t2_path ? t2_path : "off",
		 d->st.t3 ? c->remote_seeds : "off",
		 (unsigned long long)d->st.n_recovered, (unsigned long long)ts.n_lost,
		 (unsigned long long)ts.n_skipped, kvt_now_s() - tr);
	memset(secret, 0, sizeof(secret));
	*exit_code = 0;
	return KVT_OK;
}

/*
 * [store]: the key-value store in DATA_DIR (store.t2, store.sqlite; the data
 * dir's lock is held) sized as share of the tiers' capacities, and its
 * Redis-protocol listener with the HTTP API's keys.
 */
static int store_up(daemon_t *d, int *exit_code)
{
	const kvt_config *c = &d->cfg;
	if (!kvt_config_store_enabled(c))
		return KVT_OK;
	kvt_kvs_config kc;
	kvt_kvs_config_default(&kc);
	kc.dir = c->data_dir;
	kc.ram_bytes = (uint64_t)((double)d->host_bytes * c->store_share);
	if (kc.ram_bytes < (1u << 20))
		kc.ram_bytes = 1u << 20;
	kc.nvme_bytes = (uint64_t)((double)d->nvme_bytes * c->store_share) & ~((1ull << 20) - 1);
	kc.max_value_bytes = c->store_max_value;
	kc.durable = c->store_durable;
	kc.exists_lease_s = c->store_exists_lease_s;
	kc.io_mode = c->nvme_io;
	int rc = kvt_kvs_open(&kc, &d->kvs);
	if (rc) {
		*exit_code = rc == KVT_ECORRUPT ? EX_DATAERR : rc == KVT_EBUSY ? EX_TEMPFAIL : EX_IOERR;
		return rc;
	}
	kvt_resp_config rcfg;
	kvt_resp_config_default(&rcfg);
	rcfg.host = c->store_listen_host;
	rcfg.port = c->store_listen_port;
	rcfg.kvs = d->kvs;
	rcfg.keys = d->keys;
	rcfg.n_keys = d->n_keys;
	rcfg.admin_keys = c->admin_keys;
	rcfg.n_admin_keys = c->n_admin_keys;
	rcfg.max_connections = c->store_max_connections;
	rcfg.max_value_bytes = c->store_max_value;
	rcfg.version = KVT_VERSION;
	if ((rc = kvt_resp_start(&rcfg, &d->resp))) {
		*exit_code = EX_UNAVAILABLE;
		return rc;
	}
	kvt_server_set_store(d->srv, d->kvs, d->resp);
	KVT_LOGI("store: Redis protocol on %s%s%s:%u (ram %llu MiB, nvme %llu MiB, max value %llu MiB, %s, "
		 "%s)",
		 strchr(c->store_listen_host, ':') ? "[" : "", c->store_listen_host,
		 strchr(c->store_listen_host, ':') ? "]" : "", kvt_resp_port(d->resp),
		 (unsigned long long)(kc.ram_bytes >> 20), (unsigned long long)(kc.nvme_bytes >> 20),
		 (unsigned long long)(kc.max_value_bytes >> 20), kc.durable ? "durable" : "written behind",
		 d->n_keys + c->n_admin_keys ? "AUTH required" : "no AUTH");
	return KVT_OK;
}

/* The store's listener first (its connections closed), then the store (everything acknowledged is on NVMe). */
static void store_down(daemon_t *d)
{
	kvt_resp_stop(d->resp);
	d->resp = NULL;
}

static void tear_down(daemon_t *d)
{
	store_down(d);
	kvt_server_stop(d->srv);
	d->srv = NULL;
	kvt_kvs_close(d->kvs); /* after the HTTP server, which reads its figures */
	d->kvs = NULL;
	kvt_stack_close(&d->st); /* flushes the cache to NVMe and commits the index */
	kvt_datadir_lock_release(d->lock); /* only once the index and T2 file are closed */
	d->lock = NULL;
	kvt_model_destroy(d->model);
	kvt_dev_destroy(d->dev);
	kvt_tok_destroy(d->tok);
	kvt_gguf_close(d->g);
	free(d->keys);
}

/*
 * The flags that set a config key, kvtier's own and llama-server's common
 * ones (a script that starts llama-server starts kvtierd with the same
 * flags). --host and --port (no section) are merged into server.listen.
 */
typedef struct flag_def {
	const char *names[2];          /* the flag's spellings (NULL: none more) */
	const char *section, *key;     /* the config key it sets; section NULL: --host / --port */
} flag_def;

static const flag_def flag_defs[] = {
	{ { "--listen", NULL }, "server", "listen" },
	{ { "--data-dir", NULL }, "index", "data_dir" },
	{ { "-m", "--model" }, "model", "path" },
	{ { "--device", NULL }, "model", "device" },
	{ { "--chat-template", NULL }, "model", "chat_template" },
	{ { "--ctx-size", NULL }, "model", "context" }, /* and -c N (digits): see flag_index */
	{ { "-t", "--threads" }, "model", "threads" },
	{ { "-np", "--parallel" }, "server", "parallel" },
	{ { "--api-key", NULL }, "server", "api_keys" },
	{ { "--slot-save-path", NULL }, "server", "slot_save_path" },
	{ { "--host", NULL }, NULL, "host" },
	{ { "--port", NULL }, NULL, "port" },
};
#define N_FLAGS (sizeof(flag_defs) / sizeof(flag_defs[0]))

/*
 * Which flag a is (N_FLAGS: none). NOTE: -c is kvtier's --config and
 * llama-server's --ctx-size; a value of digits only is a context size (no
 * one names a config file "2048"), anything else a config file.
 */
static size_t flag_index(const char *a, const char *val)
{
	if (!strcmp(a, "-c"))
		return val[0] && strspn(val, "0123456789") == strlen(val) ? 5 : N_FLAGS;
	for (size_t k = 0; k < N_FLAGS; k++)
		for (size_t j = 0; j < 2; j++)
			if (flag_defs[k].names[j] && !strcmp(a, flag_defs[k].names[j]))
				return k;
	return N_FLAGS;
}

/* A flag's value as its key takes it: llama-server's -1 threads is kvtier's 0 (auto); --api-key K1,K2 are the default tenant's keys. */
static void flag_value(size_t k, const char *v, char *out, size_t cap)
{
	if (!strcmp(flag_defs[k].key, "threads") && !strcmp(v, "-1")) {
		snprintf(out, cap, "0");
	} else if (!strcmp(flag_defs[k].key, "api_keys")) {
		size_t n = 0;
		out[0] = 0;
		for (const char *p = v; *p && n + 1 < cap;) {
			size_t len = strcspn(p, ",");
			if (len)
				n += (size_t)snprintf(out + n, cap - n, "%sdefault:%.*s", n ? ", " : "", (int)len, p);
			p += len + (p[len] == ',');
		}
	} else {
		snprintf(out, cap, "%s", v);
	}
}

/* Apply the flags' values over the loaded configuration; --host / --port replace their half of server.listen. */
static int flags_apply(kvt_config *c, const char *const *vals, char *err, size_t cap)
{
	char v[2048];
	for (size_t k = 0; k < N_FLAGS; k++) {
		if (!vals[k] || !flag_defs[k].section)
			continue;
		flag_value(k, vals[k], v, sizeof(v));
		if (kvt_config_set(c, flag_defs[k].section, flag_defs[k].key, v, err, cap)) {
			fprintf(stderr, "kvtierd: %s: %s\n", flag_defs[k].names[flag_defs[k].names[1] ? 1 : 0], err);
			return -1;
		}
	}
	const char *host = vals[N_FLAGS - 2], *port = vals[N_FLAGS - 1];
	if (!host && !port)
		return 0;
	char h[300], p[16];
	snprintf(h, sizeof(h), "%s", host ? host : c->listen_host);
	snprintf(p, sizeof(p), "%s", port ? port : "");
	if (!port)
		snprintf(p, sizeof(p), "%u", c->listen_port);
	snprintf(v, sizeof(v), strchr(h, ':') && h[0] != '[' ? "[%s]:%s" : "%s:%s", h, p);
	if (kvt_config_set(c, "server", "listen", v, err, cap)) {
		fprintf(stderr, "kvtierd: --host/--port: %s\n", err);
		return -1;
	}
	return 0;
}

int main(int argc, char **argv)
{
	umask(077);
	static daemon_t d;
	const char *cfg_path = NULL;
	const char *flag_vals[N_FLAGS] = { 0 };
	bool check = false, print = false;
	char err[1024];

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			usage(stdout);
			return 0;
		}
		if (!strcmp(a, "--version")) {
			version();
			return 0;
		}
		if (!strcmp(a, "--check-config")) {
			check = true;
			continue;
		}
		if (!strcmp(a, "--print-config")) {
			print = true;
			continue;
		}
		if (i + 1 >= argc) {
			fprintf(stderr, "kvtierd: %s: unknown option, or it needs a value\n", a);
			usage(stderr);
			return EX_USAGE;
		}
		size_t k = flag_index(a, argv[i + 1]);
		if (k == N_FLAGS && (!strcmp(a, "-c") || !strcmp(a, "--config"))) {
			cfg_path = argv[++i];
			continue;
		}
		if (k == N_FLAGS) {
			fprintf(stderr, "kvtierd: unknown option %s\n", a);
			usage(stderr);
			return EX_USAGE;
		}
		flag_vals[k] = argv[++i];
	}

	kvt_config_default(&d.cfg);
	const char *path = kvt_config_find(cfg_path);
	if (path && kvt_config_load(&d.cfg, path, err, sizeof(err))) {
		fprintf(stderr, "kvtierd: %s\n", err);
		return EX_CONFIG;
	}
	if (flags_apply(&d.cfg, flag_vals, err, sizeof(err)))
		return EX_USAGE;
	if (kvt_config_validate(&d.cfg, err, sizeof(err))) {
		fprintf(stderr, "kvtierd: %s: %s\n", path ? path : "built-in defaults", err);
		return EX_CONFIG;
	}
	if (exposure_check(&d.cfg, d.cfg.n_api_keys + d.cfg.n_admin_keys + (d.cfg.api_key_file[0] ? 1 : 0), path))
		return EX_CONFIG;
	if (print)
		kvt_config_write(&d.cfg, stdout);
	if (check) {
		fprintf(stderr, "kvtierd: %s: configuration OK\n", path ? path : "built-in defaults");
		return 0;
	}
	if (print)
		return 0;

	/* signals go to the main thread alone */
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);

	if (log_open(d.cfg.log_file))
		return EX_CANTCREAT;
	kvt_log_set_sink(log_sink, NULL);
	kvt_log_set_level(d.cfg.log_level);
	KVT_LOGI("starting (config: %s)", path ? path : "built-in defaults");

	int code = EX_SOFTWARE;
	if (read_key_file(&d)) {
		code = EX_CONFIG;
		goto out;
	}
	if (exposure_check(&d.cfg, d.n_keys + d.cfg.n_admin_keys, path)) { /* the key file may hold none */
		KVT_LOGE("server.api_key_file %s holds no key, and server.listen %s is not loopback", d.cfg.api_key_file,
			 d.cfg.listen_host);
		code = EX_CONFIG;
		goto out;
	}
	if (!kvt_config_listen_loopback(&d.cfg) && d.n_keys + d.cfg.n_admin_keys == 0)
		KVT_LOGW("server.listen %s:%u: serving the network with NO authentication (server.allow_unauthenticated = "
			 "true): anyone who can reach this port reads every conversation's cache and sessions",
			 d.cfg.listen_host, d.cfg.listen_port);
	raise_fd_limit(d.cfg.max_connections + (kvt_config_store_enabled(&d.cfg) ? d.cfg.store_max_connections : 0));
	kvt_server_config scfg;
	kvt_server_config_default(&scfg);
	scfg.host = d.cfg.listen_host;
	scfg.port = d.cfg.listen_port;
	scfg.keys = d.keys;
	scfg.n_keys = d.n_keys;
	scfg.admin_keys = d.cfg.admin_keys;
	scfg.n_admin_keys = d.cfg.n_admin_keys;
	scfg.metrics_admin = d.cfg.metrics_admin != 0;
	scfg.threads = d.cfg.server_threads;
	scfg.max_connections = d.cfg.max_connections;
	scfg.max_connections_per_ip = d.cfg.max_connections_per_ip;
	scfg.header_timeout_s = d.cfg.header_timeout_s;
	scfg.cors_origins = d.cfg.cors_origins;
	scfg.max_concurrent = d.cfg.max_concurrent;
	scfg.max_header_bytes = d.cfg.max_header_bytes;
	scfg.max_body_bytes = d.cfg.max_body_bytes;
	scfg.max_tokens_limit = d.cfg.max_tokens_limit;
	scfg.max_n = d.cfg.max_n;
	scfg.default_max_tokens = d.cfg.default_max_tokens;
	scfg.chunk_reuse = d.cfg.chunk_reuse;
	scfg.chunk_min_tokens = d.cfg.chunk_min_tokens;
	scfg.request_timeout_s = d.cfg.request_timeout_s;
	scfg.model_id = basename_of(d.cfg.model_path);
	scfg.model_path = d.cfg.model_path;
	scfg.build_info = "kvtier " KVT_VERSION " (" KVT_GIT_COMMIT ")";
	scfg.n_slots = d.cfg.n_slots;
	scfg.slot_save_path = d.cfg.slot_save_path;
	if (d.cfg.slot_save_path[0] && mkdir_p(d.cfg.slot_save_path)) {
		KVT_LOGE("server.slot_save_path %s: cannot create the directory: %s", d.cfg.slot_save_path,
			 strerror(errno));
		code = EX_CANTCREAT;
		goto out;
	}
	scfg.kv_dtype = kvt_kv_codec_name(d.cfg.host_dtype);
	if (kvt_server_start(&scfg, &d.srv)) {
		KVT_LOGE("server.listen %s:%u: cannot listen", d.cfg.listen_host, d.cfg.listen_port);
		code = EX_UNAVAILABLE;
		goto out;
	}
	KVT_LOGI("listening on %s:%u", d.cfg.listen_host, kvt_server_port(d.srv));
	if (bring_up(&d, &code) || store_up(&d, &code))
		goto out;
	kvt_server_set_engine(d.srv, d.st.sched, d.tok);
	KVT_LOGI("ready");
	kvt_sd_notify("READY=1\nSTATUS=serving");

	uint64_t wd_usec = 0;
	bool wd = kvt_sd_watchdog_usec(&wd_usec);
	double tick = wd ? (double)wd_usec / 2e6 : 5.0;
	if (tick > 5.0)
		tick = 5.0;
	for (;;) {
		struct timespec ts = { (time_t)tick, (long)((tick - (double)(time_t)tick) * 1e9) };
		int sig = sigtimedwait(&sigs, NULL, &ts);
		if (sig < 0) {
			if (wd)
				kvt_sd_notify("WATCHDOG=1");
			continue;
		}
		if (sig == SIGHUP) {
			kvt_config fresh;
			kvt_config_default(&fresh);
			if (path && kvt_config_load(&fresh, path, err, sizeof(err)) == KVT_OK) {
				d.cfg.log_level = fresh.log_level;
				kvt_log_set_level(fresh.log_level);
			} else if (path) {
				KVT_LOGE("SIGHUP: %s (keeping the running settings)", err);
			}
			log_open(d.cfg.log_file);
			KVT_LOGI("SIGHUP: log reopened, level %d", d.cfg.log_level);
			continue;
		}
		KVT_LOGI("%s: draining (up to %.0f s), then persisting", sig == SIGTERM ? "SIGTERM" : "SIGINT",
			 d.cfg.drain_timeout_s);
		kvt_sd_notify("STOPPING=1\nSTATUS=draining");
		break;
	}
	store_down(&d);
	kvt_server_drain(d.srv);
	uint32_t cancelled = kvt_sched_drain(d.st.sched, d.cfg.drain_timeout_s);
	double tf = kvt_now_s();
	kvt_sd_notify("STATUS=persisting sessions to NVMe");
	tear_down(&d);
	KVT_LOGI("stopped (%u request(s) cancelled at the drain deadline; persisted in %.2f s)", cancelled,
		 kvt_now_s() - tf);
	return 0;
out:
	pthread_mutex_lock(&log_fp_mu);
	char cause[sizeof(first_error)];
	snprintf(cause, sizeof(cause), "%s", first_error[0] ? first_error : "see the lines above");
	pthread_mutex_unlock(&log_fp_mu);
	KVT_LOGE("start-up failed: %s", cause);
	tear_down(&d);
	return code;
}
