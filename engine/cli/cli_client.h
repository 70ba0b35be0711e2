/*
 * engine/cli/ — the `kvtier` command line: the commands that talk to a
 * running kvtierd (this header), the offline index tools fsck and
 * rebuild-index (cli_index.h), and kvtier's main (generate, size). It sits on
 * top: it may use engine/serve/ (the configuration file), engine/model/ and
 * everything below; nothing includes its headers but its own files and tests.
 *
 * engine/cli/cli_client.h — the `kvtier` commands that talk to a running kvtierd
 * over its HTTP API (docs/http-api.md), through libcurl:
 *
 *   kvtier resume SESSION [--json]                   POST /v1/sessions/SESSION/resume
 *   kvtier stats [--json] [--watch [SECONDS]]        GET /v1/stats
 *   kvtier stats --offline --data-dir DIR [--json]   the index alone, no daemon
 *   kvtier sessions [--json]                         GET /v1/sessions
 *
 * Common options: --url URL (default http://LISTEN from the configuration
 * found by kvt_config_find(-c FILE); a wildcard listen address is reached
 * through loopback), --api-key KEY (default $KVTIER_API_KEY), -c FILE.
 *
 * Output: data on stdout (a table, or with --json the daemon's JSON exactly
 * as received), diagnostics on stderr, each naming what failed.
 *
 * Exit status (<sysexits.h>): 0 ok; EX_USAGE bad arguments; EX_CONFIG a bad
 * configuration file; EX_UNAVAILABLE the daemon is unreachable, answered 503
 * (loading, draining, overloaded) or is not a kvtierd (404 on its own routes);
 * EX_NOINPUT unknown session (404 from resume) or no index in --data-dir;
 * EX_NOPERM 401; EX_SOFTWARE any other error status (5xx, an unexpected 4xx);
 * EX_DATAERR a malformed response or a corrupt index; EX_IOERR the index
 * could not be read (e.g. locked by a running daemon).
 */
#ifndef KVT_CLI_CLIENT_H
#define KVT_CLI_CLIENT_H

/* argv[0] is the command name ("resume", "stats", "sessions"). Return the exit status. */
int kvt_cli_resume(int argc, char **argv);
int kvt_cli_stats(int argc, char **argv);
int kvt_cli_sessions(int argc, char **argv);

#endif
