/*
 * engine/serve/prefill_rate.c — the prefill rate kept between runs
 * (scheduler.h, kvt_prefill_rate_*).
 *
 * A resume reports the prefill time it avoided from the daemon's prefill
 * rate. Measuring that rate at every start cost a forward pass over 128
 * tokens before /health (1.1 s on the default model on two cores, more on a
 * bigger one), so the scheduler measures it from the first real prefills
 * instead and keeps it here for the next start. The rate belongs to one
 * model on one machine: the file names the model fingerprint, the CPU's
 * model string and the device's description (the backend, its thread
 * count), and a file written for another of any of them is not used.
 *
 * The file is five text lines (written to a temporary name, then renamed
 * over the old one, so a reader sees one whole file or the old one):
 *
 *   kvtier prefill rate 1
 *   model <64 hex digits>
 *   cpu <the model name /proc/cpuinfo gives>
 *   device <kvt_dev_name()>
 *   rate <tokens per second>
 *
 * It is a cache: a missing, damaged or foreign file is logged and ignored,
 * never a reason to refuse a start.
 */
#include "scheduler.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RATE_HEADER "kvtier prefill rate 1"
#define RATE_FILE_MAX 2048 /* bytes read: a longer file is not one of ours */

/* The model name of the first CPU /proc/cpuinfo lists ("?" where it names none), spaces as they are. */
static void cpu_model(char *out, size_t cap)
{
	snprintf(out, cap, "?");
	FILE *f = fopen("/proc/cpuinfo", "r");
	if (!f)
		return;
	char line[512];
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "model name", 10) != 0)
			continue;
		const char *v = strchr(line, ':');
		if (!v)
			break;
		v++;
		while (*v == ' ' || *v == '\t')
			v++;
		size_t n = strcspn(v, "\n");
		snprintf(out, cap, "%.*s", (int)n, v);
		break;
	}
	fclose(f);
}

void kvt_prefill_rate_key_init(kvt_prefill_rate_key *k, const kvt_dev *d, const uint8_t model_fp[KVT_HASH_BYTES])
{
	for (int i = 0; i < KVT_HASH_BYTES; i++)
		snprintf(k->model + 2 * i, 3, "%02x", model_fp[i]);
	cpu_model(k->cpu, sizeof(k->cpu));
	snprintf(k->device, sizeof(k->device), "%s", kvt_dev_name(d));
}

/* The value of line "<name> <value>" at *p (advanced past it) into out; false if the line is another. */
static bool take_line(const char **p, const char *name, char *out, size_t cap)
{
	size_t n = strlen(name), len = strcspn(*p, "\n");
	if (strncmp(*p, name, n) != 0 || (*p)[n] != ' ' || (*p)[len] != '\n' || len - n - 1 >= cap)
		return false;
	memcpy(out, *p + n + 1, len - n - 1);
	out[len - n - 1] = '\0';
	*p += len + 1;
	return true;
}

int kvt_prefill_rate_load(const char *path, const kvt_prefill_rate_key *k, double *rate_out)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		if (errno != ENOENT)
			KVT_LOGW("prefill rate %s: cannot open (%s): measuring it from the first prefills", path,
				 strerror(errno));
		return KVT_ENOTFOUND;
	}
	char buf[RATE_FILE_MAX + 1];
	size_t n = fread(buf, 1, RATE_FILE_MAX + 1, f);
	fclose(f);
	buf[n <= RATE_FILE_MAX ? n : RATE_FILE_MAX] = '\0';
	kvt_prefill_rate_key got;
	char num[64], *end;
	const char *p = buf;
	const bool whole = n <= RATE_FILE_MAX && strlen(buf) == n && strncmp(p, RATE_HEADER "\n", sizeof(RATE_HEADER)) == 0;
	if (whole)
		p += sizeof(RATE_HEADER);
	if (!whole || !take_line(&p, "model", got.model, sizeof(got.model)) ||
	    !take_line(&p, "cpu", got.cpu, sizeof(got.cpu)) || !take_line(&p, "device", got.device, sizeof(got.device)) ||
	    !take_line(&p, "rate", num, sizeof(num)) || *p) {
		KVT_LOGW("prefill rate %s: not a prefill rate file this kvtier writes (damaged?): ignored, measuring "
			 "the rate from the first prefills", path);
		return KVT_ECORRUPT;
	}
	errno = 0;
	double rate = strtod(num, &end);
	if (errno || end == num || *end || !isfinite(rate) || !(rate > 0)) {
		KVT_LOGW("prefill rate %s: rate '%s' is not a positive number: ignored, measuring the rate from the "
			 "first prefills", path, num);
		return KVT_ECORRUPT;
	}
	const char *other = strcmp(got.model, k->model) ? "model" : strcmp(got.cpu, k->cpu) ? "CPU"
			  : strcmp(got.device, k->device) ? "device" : NULL;
	if (other) {
		KVT_LOGI("prefill rate %s: measured for another %s: measuring the rate from the first prefills", path,
			 other);
		return KVT_ENOTFOUND;
	}
	*rate_out = rate;
	return KVT_OK;
}

int kvt_prefill_rate_save(const char *path, const kvt_prefill_rate_key *k, double rate)
{
	char tmp[4096 + 8];
	if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp)) {
		KVT_LOGW("prefill rate %s: path too long", path);
		return KVT_EINVAL;
	}
	FILE *f = fopen(tmp, "w");
	if (!f) {
		KVT_LOGW("prefill rate %s: cannot write (%s): the next start measures it again", tmp, strerror(errno));
		return KVT_EIO;
	}
	int w = fprintf(f, RATE_HEADER "\nmodel %s\ncpu %s\ndevice %s\nrate %.3f\n", k->model, k->cpu, k->device,
			rate);
	int c = fclose(f);
	if (w < 0 || c != 0 || rename(tmp, path) != 0) {
		KVT_LOGW("prefill rate %s: cannot write (%s): the next start measures it again", path, strerror(errno));
		if (unlink(tmp) != 0 && errno != ENOENT)
			KVT_LOGW("prefill rate %s: cannot remove (%s)", tmp, strerror(errno));
		return KVT_EIO;
	}
	return KVT_OK;
}
