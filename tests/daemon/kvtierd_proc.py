"""tests/daemon/kvtierd_proc.py — one kvtierd process for the daemon tests and bench/bench_daemon.py.

Daemon(build, data_dir, conf) writes conf (the whole INI text; "@DATA@" stands for
data_dir) to DATA_DIR/kvtier.conf, starts BUILD/kvtierd on it, logging to
DATA_DIR/kvtierd.log, and waits for /health; the port is the one the log says it
listens on (listen = 127.0.0.1:0 picks an ephemeral one). http() is a JSON client
that returns (status, body) for errors too; check() records failed checks in FAILS.
run_cases() is the main() of a suite whose cases each get a fresh data dir;
proc_status() reads a process's memory figures.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request


FAILS = []
SKIPS = []  # cases that could not run here (a reason each)


def check(cond, what):
    """Record a failed check (FAILS) and say so; the caller decides the exit status."""
    if not cond:
        FAILS.append(what)
        print("FAIL:", what, flush=True)
    return cond


def http(method, url, body=None, headers=None, raw=None, timeout=900):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read()
            if r.headers.get_content_type() != "application/json":
                return r.status, text.decode()
            return r.status, json.loads(text or b"null")
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, text


def proc_status(pid):
    """A process's memory from /proc/PID/status, bytes: VmRSS, RssAnon, RssFile, VmLck."""
    out = {}
    for line in open("/proc/%d/status" % pid):
        k = line.split(":")[0]
        if k in ("VmRSS", "RssAnon", "RssFile", "VmLck"):
            out[k] = int(line.split()[1]) * 1024
    return out


class Daemon:
    def __init__(self, build, data_dir, conf):
        self.build, self.data_dir = build, data_dir
        os.makedirs(data_dir, exist_ok=True)
        self.conf = os.path.join(data_dir, "kvtier.conf")
        self.log = os.path.join(data_dir, "kvtierd.log")
        with open(self.conf, "w") as f:
            f.write(conf.replace("@DATA@", data_dir))
        self.proc, self.url = None, None

    def _log(self):
        return open(self.log).read() if os.path.exists(self.log) else ""

    def start(self, timeout=300):
        n_before = len(re.findall(r"listening on", self._log()))
        self.url = None
        self.proc = subprocess.Popen([os.path.join(self.build, "kvtierd"), "-c", self.conf],
                                     stdout=open(self.log, "a"), stderr=subprocess.STDOUT)
        deadline = time.time() + timeout
        while time.time() < deadline:
            ports = re.findall(r"listening on [0-9.]+:(\d+)", self._log())
            if len(ports) > n_before:
                self.url = "http://127.0.0.1:" + ports[-1]
                try:
                    if http("GET", self.url + "/health", timeout=5)[0] == 200:
                        return
                except OSError:
                    pass
            if self.proc.poll() is not None:
                raise RuntimeError("kvtierd exited with %d:\n%s" % (self.proc.returncode, self._log()[-3000:]))
            time.sleep(0.1)
        raise RuntimeError("kvtierd did not become healthy:\n" + self._log()[-3000:])

    restart = start

    def stop(self, sig=signal.SIGTERM, timeout=300):
        """Signal the daemon and wait; its exit status (after a kill if it hangs)."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        rc = self.proc.returncode if self.proc else 0
        self.proc = None
        return rc


def build_arg(doc, model):
    """The BUILD argument (argv[1]) as an absolute path; without one, prints doc and exits 2;
    without the model, says so and exits 77 (skip)."""
    if len(sys.argv) < 2:
        print(doc)
        sys.exit(2)
    if not os.path.exists(model):
        print("skip: no default model at", model)
        sys.exit(77)
    return os.path.abspath(sys.argv[1])


def run_cases(suite, doc, model, cases):
    """argv: BUILD [CASE ...]. Runs each case(build, tmp) in a fresh temporary dir (removed
    unless something failed); 77 (skip) without the model or when every case skipped."""
    build = build_arg(doc, model)
    names = sys.argv[2:] or list(cases)
    for name in names:
        tmp = tempfile.mkdtemp(prefix="kvt_%s_%s_" % (suite, name))
        t = time.time()
        try:
            cases[name](build, tmp)
        except Exception as e:  # a crash in a case is a failure of that case
            check(False, "%s: %s: %s" % (name, type(e).__name__, e))
        print("%s: %.1f s" % (name, time.time() - t), flush=True)
        if not FAILS:
            shutil.rmtree(tmp, ignore_errors=True)
    print("test_%s: %d failure(s)" % (suite, len(FAILS)))
    if not FAILS and SKIPS and len(SKIPS) == len(names):
        return 77
    return 1 if FAILS else 0
