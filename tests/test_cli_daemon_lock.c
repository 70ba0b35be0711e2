/* ctest-labels: integration */
/*
 * tests/test_cli_daemon_lock.c — the offline tools beside a real, running
 * kvtierd (a synthetic model written here, CPU backend, loopback, a 64 MiB
 * NVMe tier in a temporary data directory, removed at the end):
 *
 *  - while the daemon runs, `kvtier rebuild-index`, `kvtier fsck` and
 *    `kvtier stats --offline` (by --data-dir and by -c FILE) exit 75
 *    (EX_TEMPFAIL) naming the daemon and its pid, and change nothing: the
 *    index is not moved aside; a second kvtierd on the same directory is
 *    refused the same way;
 *  - a turn acknowledged after those refusals is still there after a
 *    restart (before the lock, rebuild-index moved the live index aside and
 *    the restart lost every session);
 *  - after kill -9 the directory is free at once (the tools run, the daemon
 *    restarts: the lock does not outlive its holder);
 *  - with -c FILE the tools find a T2 file and an index at the paths the
 *    configuration sets (tier.nvme path, index.path), outside the data dir.
 */
#include "check.h"
#include "synth_model.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char dir[64], err_path[128];
static char out[1 << 16], err[1 << 16];

static int run(const char *args)
{
	char cmd[4096];
	snprintf(cmd, sizeof(cmd), "env -u KVTIER_CONFIG %s/kvtier %s", KVT_BINARY_DIR, args);
	return check_run_capture(cmd, err_path, out, sizeof(out), err, sizeof(err));
}

static void write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	if (f) {
		fputs(text, f);
		fclose(f);
	}
}

static size_t read_file(const char *path, char *buf, size_t cap)
{
	FILE *f = fopen(path, "r");
	size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
	buf[n] = '\0';
	if (f)
		fclose(f);
	return n;
}

typedef struct kvtierd {
	pid_t pid;     /* kvtierd */
	int port;      /* where it listens */
	char log[128]; /* its stdout + stderr */
} kvtierd;

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };
	nanosleep(&ts, NULL);
}

/* Start kvtierd -c conf; 0 once it logged "ready", else its exit status (it exited) or -1 (timeout). */
static int daemon_start(kvtierd *d, const char *conf, const char *log)
{
	static char text[1 << 16];
	snprintf(d->log, sizeof(d->log), "%s", log);
	unlink(log);
	d->pid = fork();
	if (d->pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		dup2(fd, 1);
		dup2(fd, 2);
		char bin[4096];
		snprintf(bin, sizeof(bin), "%s/kvtierd", KVT_BINARY_DIR);
		execl(bin, bin, "-c", conf, (char *)NULL);
		_exit(127);
	}
	for (int i = 0; i < 600; i++) {
		int st;
		if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
			d->pid = 0;
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
		}
		read_file(log, text, sizeof(text));
		const char *l = strstr(text, "listening on 127.0.0.1:");
		if (l && strstr(text, "kvtierd info: ready\n")) {
			d->port = atoi(l + strlen("listening on 127.0.0.1:"));
			return 0;
		}
		sleep_ms(100);
	}
	return -1;
}

/* Signal the daemon and reap it; its exit status (128 + signal when killed). */
static int daemon_stop(kvtierd *d, int sig)
{
	int st = 0;
	if (d->pid <= 0)
		return -1;
	kill(d->pid, sig);
	waitpid(d->pid, &st, 0);
	d->pid = 0;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* One HTTP/1.1 request on loopback (Connection: close); the status, the body in body. */
static int http(int port, const char *method, const char *path, const char *json, char *body, size_t cap)
{
	char req[8192];
	struct sockaddr_in sa;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_port = htons((uint16_t)port);
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	int n = snprintf(req, sizeof(req),
			 "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n"
			 "Content-Length: %zu\r\n\r\n%s",
			 method, path, json ? strlen(json) : 0, json ? json : "");
	if (write(fd, req, (size_t)n) != n) {
		close(fd);
		return -1;
	}
	size_t got = 0;
	ssize_t r;
	while (got + 1 < cap && (r = read(fd, body + got, cap - 1 - got)) > 0)
		got += (size_t)r;
	body[got] = '\0';
	close(fd);
	int status = -1;
	if (sscanf(body, "HTTP/1.%*d %d", &status) != 1)
		return -1;
	char *b = strstr(body, "\r\n\r\n");
	if (b)
		memmove(body, b + 4, strlen(b + 4) + 1);
	return status;
}

/* A completion turn of session id; 200 on success. */
static int turn(const kvtierd *d, const char *id, const char *prompt)
{
	char json[1024], resp[1 << 15];
	snprintf(json, sizeof(json),
		 "{\"prompt\": \"%s\", \"max_tokens\": 8, \"temperature\": 0, \"ignore_eos\": true, \"session_id\": \"%s\"}",
		 prompt, id);
	int st = http(d->port, "POST", "/v1/completions", json, resp, sizeof(resp));
	CHECKF(st == 200, "turn of %s: %d %s", id, st, resp);
	return st;
}

/* The n_tokens the daemon lists for session id, or -1. */
static long session_tokens(const kvtierd *d, const char *id)
{
	static char resp[1 << 16];
	char key[256];
	if (http(d->port, "GET", "/v1/sessions", NULL, resp, sizeof(resp)) != 200)
		return -1;
	snprintf(key, sizeof(key), "\"id\": \"%s\"", id);
	char *p = strstr(resp, key);
	if (!p) {
		snprintf(key, sizeof(key), "\"id\":\"%s\"", id);
		p = strstr(resp, key);
	}
	if (!p)
		return -1;
	char *t = strstr(p, "\"tokens\"");
	if (!t)
		return -1;
	t = strchr(t, ':');
	return t ? strtol(t + 1, NULL, 10) : -1;
}

/* Whether dir holds a file whose name starts with prefix. */
static bool has_entry(const char *d, const char *prefix)
{
	DIR *dd = opendir(d);
	struct dirent *e;
	bool found = false;
	while (dd && (e = readdir(dd)))
		found |= strncmp(e->d_name, prefix, strlen(prefix)) == 0;
	if (dd)
		closedir(dd);
	return found;
}

static void write_conf(const char *path, const char *model, const char *data, const char *nvme_path,
		       const char *index_path)
{
	char text[4096];
	snprintf(text, sizeof(text),
		 "[server]\nlisten = 127.0.0.1:0\n[model]\npath = %s\ndevice = cpu\ncontext = 512\n"
		 "[tier.hbm]\ncapacity = 8M\n[tier.host]\ncapacity = 8M\n[tier.nvme]\ncapacity = 64M\n%s%s\n"
		 "[index]\ndata_dir = %s\n%s%s\n",
		 model, nvme_path ? "path = " : "", nvme_path ? nvme_path : "", data, index_path ? "path = " : "",
		 index_path ? index_path : "");
	write_file(path, text);
}

int main(void)
{
	char model[128], data[128], conf[128], log[128], log2[128], args[1024], pidtext[64], idx[160];
	kvtierd d = { 0 }, d2 = { 0 };

	snprintf(dir, sizeof(dir), "/tmp/kvt_lock_XXXXXX");
	if (!mkdtemp(dir))
		return 1;
	snprintf(err_path, sizeof(err_path), "%s/stderr", dir);
	snprintf(model, sizeof(model), "%s/synth.gguf", dir);
	snprintf(data, sizeof(data), "%s/data", dir);
	snprintf(conf, sizeof(conf), "%s/kvtier.conf", dir);
	snprintf(log, sizeof(log), "%s/kvtierd.log", dir);
	snprintf(idx, sizeof(idx), "%s/index.sqlite", data);
	kvt_synth_llama sc;
	kvt_synth_llama_default(&sc);
	if (kvt_synth_llama_write(&sc, model))
		return 1;
	write_conf(conf, model, data, NULL, NULL);

	int rc = daemon_start(&d, conf, log);
	CHECKF(rc == 0, "kvtierd did not start (%d)", rc);
	if (rc != 0)
		goto done;
	snprintf(pidtext, sizeof(pidtext), "kvtierd pid %d", (int)d.pid);
	CHECK_EQ_INT(turn(&d, "conv", "the quick brown fox jumps over the lazy dog and runs far away into the woods"), 200);
	sleep_ms(1500); /* past the end-of-turn deadline: the turn is durable */

	/* every offline tool refuses the live directory, by --data-dir and by -c FILE, and changes nothing */
	static const char *const tools[] = { "rebuild-index", "fsck", "stats --offline" };
	for (int i = 0; i < 3; i++) {
		for (int by_conf = 0; by_conf < 2; by_conf++) {
			if (by_conf && i == 2)
				continue; /* stats --offline takes --data-dir only */
			if (by_conf)
				snprintf(args, sizeof(args), "%s -c %s", tools[i], conf);
			else
				snprintf(args, sizeof(args), "%s --data-dir %s", tools[i], data);
			int st = run(args);
			CHECKF(st == 75, "kvtier %s beside a running daemon: exit %d, stderr: %s", args, st, err);
			CHECKF(strstr(err, pidtext) != NULL, "kvtier %s: the refusal does not name %s: %s", args, pidtext,
			       err);
		}
	}
	struct stat sb;
	CHECKF(stat(idx, &sb) == 0, "the live index %s is gone", idx);
	CHECKF(!has_entry(data, "index.sqlite.broken"), "the live index was moved aside");

	/* a second daemon on the same directory is refused */
	snprintf(log2, sizeof(log2), "%s/kvtierd2.log", dir);
	rc = daemon_start(&d2, conf, log2);
	CHECKF(rc == 75, "a second kvtierd on the held directory: %d (want exit 75)", rc);
	if (rc == 0)
		daemon_stop(&d2, SIGTERM);

	/* a turn acknowledged after the refusals survives a restart */
	CHECK_EQ_INT(turn(&d, "conv", "the quick brown fox jumps over the lazy dog and runs far away into the woods "
				      "then it comes back home to sleep"),
		     200);
	long n_before = session_tokens(&d, "conv");
	CHECKF(n_before > 16, "session tokens before the restart: %ld", n_before);
	CHECK_EQ_INT(daemon_stop(&d, SIGTERM), 0);
	rc = daemon_start(&d, conf, log);
	CHECKF(rc == 0, "kvtierd did not restart (%d)", rc);
	if (rc != 0)
		goto done;
	long n_after = session_tokens(&d, "conv");
	CHECKF(n_after == n_before, "after the restart the session has %ld tokens, before %ld", n_after, n_before);

	/* kill -9: the directory is free at once, for the tools and for a restart */
	CHECK_EQ_INT(daemon_stop(&d, SIGKILL), 128 + SIGKILL);
	snprintf(args, sizeof(args), "fsck -c %s --dry-run", conf);
	CHECKF(run(args) == 0, "fsck right after kill -9: stdout %s stderr %s", out, err);
	snprintf(args, sizeof(args), "stats --offline --data-dir %s --json", data);
	CHECKF(run(args) == 0, "stats --offline right after kill -9: %s", err);
	rc = daemon_start(&d, conf, log);
	CHECKF(rc == 0, "kvtierd did not restart after kill -9 (%d)", rc);
	if (rc == 0) {
		CHECK_EQ_INT(session_tokens(&d, "conv"), n_before);
		CHECK_EQ_INT(daemon_stop(&d, SIGTERM), 0);
	}

	/* -c FILE: the T2 file and the index where the configuration puts them, outside the data directory */
	{
		char data2[128], t2b[160], idxb[160], conf2[160];
		snprintf(data2, sizeof(data2), "%s/data2", dir);
		snprintf(t2b, sizeof(t2b), "%s/elsewhere.t2", dir);
		snprintf(idxb, sizeof(idxb), "%s/elsewhere.sqlite", dir);
		snprintf(conf2, sizeof(conf2), "%s/kvtier2.conf", dir);
		write_conf(conf2, model, data2, t2b, idxb);
		rc = daemon_start(&d, conf2, log);
		CHECKF(rc == 0, "kvtierd on configured paths did not start (%d)", rc);
		if (rc != 0)
			goto done;
		CHECK_EQ_INT(turn(&d, "conv2", "one two three four five six seven eight nine ten eleven twelve thirteen"), 200);
		snprintf(args, sizeof(args), "fsck -c %s", conf2);
		CHECKF(run(args) == 75, "fsck -c beside the daemon on configured paths: %s", err);
		CHECK_EQ_INT(daemon_stop(&d, SIGTERM), 0);
		CHECKF(run(args) == 0, "fsck -c %s: stdout %s stderr %s", conf2, out, err);
		unsigned long long rows = 0, ok = 0;
		CHECKF(sscanf(out, "fsck %*s %llu rows, %llu ok", &rows, &ok) == 2 && rows > 0 && rows == ok,
		       "fsck -c found no rows at the configured index: %s", out);
		snprintf(args, sizeof(args), "rebuild-index -c %s", conf2);
		CHECKF(run(args) == 0, "rebuild-index -c %s: %s", conf2, err);
		unsigned long long recs = 0;
		CHECKF(sscanf(out, "rebuild-index %*s %llu records", &recs) == 1 && recs == rows,
		       "rebuild-index -c: %s (fsck saw %llu rows)", out, rows);
		CHECKF(stat(idxb, &sb) == 0, "no rebuilt index at %s", idxb);
		snprintf(args, sizeof(args), "fsck --data-dir %s", data2);
		CHECKF(run(args) == 1, "fsck of data2 without -c should find no index there: %s", out);
	}

done:
	if (d.pid > 0)
		daemon_stop(&d, SIGKILL);
	if (d2.pid > 0)
		daemon_stop(&d2, SIGKILL);
	snprintf(args, sizeof(args), "rm -rf %s", dir);
	if (system(args) != 0)
		return 1;
	return check_done("test_cli_daemon_lock");
}
