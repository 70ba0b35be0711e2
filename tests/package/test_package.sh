#!/usr/bin/env bash
# tests/package/test_package.sh — the Debian package end to end, as an operator
# meets it, on this machine (root, Debian 12; scripts/test.sh runs it):
#
#  1. build it (scripts/build_deb.sh: CPU-only, portable, cpack -G DEB) and check
#     it with lintian: no error;
#  2. `apt-get install ./kvtier_*.deb`: the binaries and `man kvtierd` work, no
#     CUDA library is linked, the `kvtier` system user and /var/lib/kvtier (0700)
#     exist, the config is a conffile, the unit is enabled and not started;
#  3. the daemon as systemd would start it, without systemd: the installed unit's
#     ExecStart, in its WorkingDirectory, as its User (runuser), on the installed
#     config, whose relative model path finds the default model copied to
#     /var/lib/kvtier/models (small tier capacities set in the config, as an
#     operator would); /health, a chat request answered; SIGTERM: exit 0 after
#     persisting, the data written as the kvtier user;
#  4. a re-install keeps the changed conffile; `apt-get remove` keeps the data and
#     the user; `apt-get purge` leaves nothing: no files, no user, no group, no
#     unit enablement.
#
# Refuses to run (exit 77, skip) where it would clobber what it did not make: a
# `kvtier` user or /var/lib/kvtier that no kvtier package owns; also without
# root, dpkg or the model. KVT_TEST_STRICT=1 (scripts/test.sh) turns a skip into
# a failure. A kvtier package already installed (an interrupted run) is purged
# first. Exit 0 pass, 1 fail.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
MODEL=${KVTIER_MODEL:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}
T0=$(date +%s)
fails=0
say() { echo "package: $*"; }
skip() { # skip "why": exit 77, or fail under KVT_TEST_STRICT
	if [ "${KVT_TEST_STRICT:-}" = 1 ]; then echo "package: FAIL (strict): cannot run: $*"; exit 1; fi
	echo "package: skip: $*"
	exit 77
}
fail() { echo "package: FAIL: $*"; fails=$((fails + 1)); }
check() { # check "what" command...
	local what=$1
	shift
	if "$@"; then say "ok: $what"; else fail "$what"; fi
}

[ "$(id -u)" -eq 0 ] || skip "needs root (dpkg, apt-get, runuser)"
command -v apt-get >/dev/null && command -v dpkg >/dev/null || skip "not a Debian system"
[ -f "$MODEL" ] || skip "no model at $MODEL (scripts/fetch_model.sh)"
installed() { dpkg-query -W -f='${Status}' kvtier 2>/dev/null | grep -q "install ok installed"; }
if dpkg -s kvtier >/dev/null 2>&1; then
	say "a kvtier package is here (an earlier run?): purging it first"
	DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq kvtier >/dev/null
fi
if getent passwd kvtier >/dev/null || [ -e /var/lib/kvtier ]; then
	skip "a kvtier user or /var/lib/kvtier exists that no kvtier package made; not touching it"
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvt-package.XXXXXX")
pid=
cleanup() {
	[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null || true
	if dpkg -s kvtier >/dev/null 2>&1; then
		DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq kvtier >/dev/null 2>&1 || true
	fi
	rm -rf "$TMP"
}
trap cleanup EXIT

# ---- 1. build and lint ----
say "building the package (scripts/build_deb.sh)"
deb=$(scripts/build_deb.sh 2>&1 | tee "$TMP/build.log" | tail -n 1)
[ -f "$deb" ] || { tail -n 30 "$TMP/build.log"; fail "no package built"; exit 1; }
deb=$(realpath "$deb")
say "built $deb ($(du -k "$deb" | cut -f1) KiB)"
dpkg-deb -f "$deb" Depends | sed 's/^/package: Depends: /'
if command -v lintian >/dev/null; then
	# --fail-on error: warnings and infos are printed, only errors fail
	check "lintian: no errors" lintian --fail-on error --display-info "$deb"
else
	fail "lintian is not installed (scripts/install_deps.sh installs it)"
fi
check "the package's control lists the config as a conffile" \
	sh -c "dpkg-deb --ctrl-tarfile '$deb' | tar -xO ./conffiles | grep -qx /etc/kvtier/kvtier.conf"

# ---- 2. install ----
say "apt-get install $deb"
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$deb" >"$TMP/apt.log" 2>&1 || { cat "$TMP/apt.log"; fail "apt-get install"; exit 1; }
check "installed" installed
check "kvtierd --version names the CPU backend only" sh -c "/usr/bin/kvtierd --version | grep -qx 'backends: cpu'"
check "kvtier --version" sh -c "/usr/bin/kvtier --version | grep -q '^kvtier [0-9]'"
check "no CUDA library linked (runs without the CUDA runtime)" sh -c "! ldd /usr/bin/kvtierd | grep -qi cuda"
check "man kvtierd" sh -c "MANPAGER=cat MANWIDTH=80 man kvtierd 2>/dev/null | grep -q 'kvtierd - the kvtier KV-cache store'"
check "man kvtier.conf" sh -c "MANPAGER=cat MANWIDTH=80 man 5 kvtier.conf 2>/dev/null | grep -q 'drain_timeout'"
check "man kvtier" sh -c "MANPAGER=cat MANWIDTH=80 man 1 kvtier 2>/dev/null | grep -q 'rebuild-index'"
check "the kvtier system user" sh -c "getent passwd kvtier | awk -F: '\$3 < 1000 && \$6 == \"/var/lib/kvtier\" && \$7 ~ /nologin/' | grep -q ."
check "the kvtier group" sh -c "getent group kvtier >/dev/null"
check "/var/lib/kvtier is 0700 kvtier:kvtier" sh -c "[ \"\$(stat -c '%a %U %G' /var/lib/kvtier)\" = '700 kvtier kvtier' ]"
check "dpkg knows /etc/kvtier/kvtier.conf as a conffile" \
	sh -c "dpkg-query -W -f='\${Conffiles}' kvtier | grep -q '/etc/kvtier/kvtier.conf'"
check "the installed config is the shipped one" cmp -s /etc/kvtier/kvtier.conf configs/kvtier.conf
UNIT=/lib/systemd/system/kvtier.service
check "the unit is installed" test -f "$UNIT"
check "the unit is enabled" test -L /etc/systemd/system/multi-user.target.wants/kvtier.service
if [ -d /run/systemd/system ]; then
	check "the unit is not started" sh -c "! systemctl is-active --quiet kvtier"
else
	say "no systemd running here: the unit's ExecStart is run by hand below"
fi

# ---- 3. the daemon, as the unit starts it ----
exec_start=$(sed -n 's/^ExecStart=//p' "$UNIT")
work_dir=$(sed -n 's/^WorkingDirectory=//p' "$UNIT")
run_user=$(sed -n 's/^User=//p' "$UNIT")
check "the unit runs /usr/bin/kvtierd on /etc/kvtier/kvtier.conf" \
	test "$exec_start" = "/usr/bin/kvtierd -c /etc/kvtier/kvtier.conf"
check "the unit runs as kvtier in /var/lib/kvtier" test "$run_user:$work_dir" = "kvtier:/var/lib/kvtier"
# the operator's part: the model where the config's relative path finds it, and small tiers
install -D -o kvtier -g kvtier -m 0640 "$MODEL" "$work_dir/models/$(basename "$MODEL")"
python3 - /etc/kvtier/kvtier.conf <<'PY'
import re, sys
path = sys.argv[1]
want = {("server", "listen"): "127.0.0.1:0", ("tier.hbm", "capacity"): "256M",
        ("tier.host", "capacity"): "64M", ("tier.nvme", "capacity"): "64M"}
out, sec, done = [], None, set()
for line in open(path):
    m = re.match(r"\[(.*)\]", line)
    if m:
        sec = m.group(1)
    k = re.match(r"(\w+) = ", line)
    if k and (sec, k.group(1)) in want:
        line = "%s = %s\n" % (k.group(1), want[(sec, k.group(1))])
        done.add((sec, k.group(1)))
    out.append(line)
assert done == set(want), "keys not found: %s" % (set(want) - done)
open(path, "w").write("".join(out))
PY
say "starting: cd $work_dir && runuser -u $run_user -- $exec_start"
LOG=$TMP/kvtierd.log
# shellcheck disable=SC2086 # ExecStart is a command line
(cd "$work_dir" && exec runuser -u "$run_user" -- $exec_start) >"$LOG" 2>&1 &
runuser_pid=$!
url=
for _ in $(seq 1 600); do
	port=$(sed -n 's/.*listening on 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$LOG" | tail -n 1)
	if [ -n "$port" ] && grep -q " ready$" "$LOG"; then
		url=http://127.0.0.1:$port
		break
	fi
	kill -0 "$runuser_pid" 2>/dev/null || break
	sleep 0.2
done
pid=$(pgrep -P "$runuser_pid" -x kvtierd || true)
if [ -z "$url" ] || [ -z "$pid" ]; then
	tail -n 30 "$LOG"
	fail "kvtierd did not become ready"
	exit 1
fi
say "kvtierd (pid $pid, user $(ps -o user= -p "$pid")) ready on $url after $(($(date +%s) - T0)) s"
check "kvtierd runs as kvtier" test "$(ps -o user= -p "$pid" | tr -d ' ')" = kvtier
check "one log line says the CPU backend is used" grep -q "this build has no CUDA backend, using the CPU backend" "$LOG"
python3 - "$url" <<'PY' || fails=$((fails + 1))
import json, sys, urllib.request
url = sys.argv[1]
def call(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return r.status, json.loads(r.read())
st, h = call("GET", "/health")
assert st == 200, ("health", st, h)
st, r = call("POST", "/v1/chat/completions", {
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "session_id": "package-test", "temperature": 0, "max_tokens": 16})
text = r["choices"][0]["message"]["content"]
assert st == 200 and text.strip() and r["usage"]["completion_tokens"] > 0, r
print("package: ok: chat answered: %r (%d prompt + %d completion tokens)"
      % (text, r["usage"]["prompt_tokens"], r["usage"]["completion_tokens"]))
PY
kill -TERM "$pid"
rc=0
wait "$runuser_pid" || rc=$?
pid=
check "SIGTERM: kvtierd exits 0" test "$rc" -eq 0
check "SIGTERM: drained and persisted" grep -q "stopped (" "$LOG"
data=$work_dir/kvtier-data
check "the data (index, secret, NVMe file) written by kvtier" \
	sh -c "[ \"\$(stat -c %U '$data/index.sqlite' '$data/secret' '$data/kvtier.t2' | sort -u)\" = kvtier ]"
check "the secret is 0600" test "$(stat -c %a "$data/secret")" = 600
[ "$fails" -eq 0 ] || tail -n 20 "$LOG"

# ---- 4. re-install, remove, purge ----
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --reinstall "$deb" >"$TMP/apt.log" 2>&1 || { cat "$TMP/apt.log"; fail "re-install"; }
check "a re-install keeps the changed conffile" grep -qx "capacity = 64M" /etc/kvtier/kvtier.conf
DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq kvtier >"$TMP/apt.log" 2>&1 || { cat "$TMP/apt.log"; fail "apt-get remove"; }
check "remove: the binaries are gone" test ! -e /usr/bin/kvtierd
check "remove: the data stays" test -f "$data/index.sqlite"
check "remove: the user stays" sh -c "getent passwd kvtier >/dev/null"
DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq kvtier >"$TMP/apt.log" 2>&1 || { cat "$TMP/apt.log"; fail "apt-get purge"; }
check "purge: dpkg forgot the package" sh -c "! dpkg -s kvtier >/dev/null 2>&1"
check "purge: no kvtier user" sh -c "! getent passwd kvtier"
check "purge: no kvtier group" sh -c "! getent group kvtier"
left=
for p in /var/lib/kvtier /var/log/kvtier /etc/kvtier /usr/bin/kvtierd /usr/bin/kvtier "$UNIT" \
	/usr/share/man/man8/kvtierd.8.gz /usr/share/man/man1/kvtier.1.gz /usr/share/man/man5/kvtier.conf.5.gz \
	/usr/share/doc/kvtier /etc/systemd/system/multi-user.target.wants/kvtier.service \
	/var/lib/systemd/deb-systemd-helper-enabled/kvtier.service.dsh-also \
	/var/lib/systemd/deb-systemd-helper-enabled/multi-user.target.wants/kvtier.service \
	/var/lib/systemd/deb-systemd-helper-masked/kvtier.service /etc/systemd/system/kvtier.service; do
	if [ -e "$p" ] || [ -L "$p" ]; then left="$left $p"; fi
done
check "purge: nothing left${left:+ (left:$left)}" test -z "$left"

say "$fails failure(s), $(($(date +%s) - T0)) s"
[ "$fails" -eq 0 ]
