#!/usr/bin/env python3
"""tests/remote/redis_cluster.py — real Redis servers on loopback for the T3 tests.

RedisCluster starts N masters with cluster mode on (redis-server --cluster-enabled
yes, each in a temp dir of its own, no persistence), joins them with
`redis-cli --cluster create`, and waits for cluster_state:ok on every node.
RedisSingle starts one plain server. Both kill every process they started in
stop() (SIGKILL, then wait), and stop() runs at exit and on SIGTERM/SIGINT, so
a failing test leaves no redis-server behind; each server also gets
PR_SET_PDEATHSIG, so it dies with the process that started it even when that one
is killed outright (a ctest timeout).

As a command:
    redis_cluster.py [--masters N] [--single] [--failover] [--password-file F] -- CMD ARGS...
runs CMD with KVT_TEST_REDIS_CLUSTER="host:port,..." (and KVT_TEST_REDIS_SINGLE
="host:port" and KVT_TEST_REDIS_SINGLE_PASSWORD, a server that requires that
password, with --single; KVT_TEST_REDIS_FAILOVER="host:port,..." of a second
cluster of 3 masters with one replica each, with --failover; KVT_TEST_REDIS_PORTS
the first cluster's master ports in order) and
exits with its status, stopping the servers whatever happens. Exit 77 (skip)
when redis-server or redis-cli is not installed.
"""
import atexit
import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HOST = "127.0.0.1"
_live = []


def _die_with_parent():
    """In the child: SIGKILL when the process that started it dies (even by SIGKILL: a ctest timeout)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def have_redis():
    return bool(shutil.which("redis-server") and shutil.which("redis-cli"))


def _port_free(p):
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, p))
            return True
        except OSError:
            return False


def free_ports(n):
    """n ports p with p and p + 10000 (the cluster bus) free."""
    for _ in range(200):
        base = random.randrange(20000, 30000)
        ps = [base + 3 * i for i in range(n)]
        if all(_port_free(p) and _port_free(p + 10000) for p in ps):
            return ps
    raise RuntimeError("no free ports for redis")


def cli(port, *args, password=None, timeout=10):
    cmd = ["redis-cli", "-h", HOST, "-p", str(port)]
    env = dict(os.environ)
    if password:
        env["REDISCLI_AUTH"] = password
    r = subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=timeout, env=env)
    return r.stdout.strip()


class _Servers:
    def __init__(self, n, cluster, password=None):
        self.dir = tempfile.mkdtemp(prefix="kvt-redis-")
        self.ports = free_ports(n)
        self.cluster = cluster
        self.password = password
        self.procs = {}
        _live.append(self)

    def _start(self, port):
        d = os.path.join(self.dir, str(port))
        os.makedirs(d, exist_ok=True)
        args = ["redis-server", "--port", str(port), "--bind", HOST, "--dir", d, "--save", "",
                "--appendonly", "no", "--daemonize", "no", "--logfile", os.path.join(d, "log"),
                "--protected-mode", "no"]
        if self.cluster:
            args += ["--cluster-enabled", "yes", "--cluster-config-file", os.path.join(d, "nodes.conf"),
                     "--cluster-node-timeout", "2000"]
        if self.password:
            args += ["--requirepass", self.password]
        self.procs[port] = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                            preexec_fn=_die_with_parent)
        for _ in range(200):
            if cli(port, "PING", password=self.password) == "PONG":
                return
            time.sleep(0.02)
        raise RuntimeError("redis-server on port %d did not answer" % port)

    def kill(self, port):
        p = self.procs.pop(port, None)
        if p:
            p.kill()
            p.wait()

    def stop(self):
        for port in list(self.procs):
            self.kill(port)
        shutil.rmtree(self.dir, ignore_errors=True)
        if self in _live:
            _live.remove(self)

    def seeds(self):
        return ",".join("%s:%d" % (HOST, p) for p in self.ports)


class RedisSingle(_Servers):
    def __init__(self, password=None):
        super().__init__(1, False, password)
        self._start(self.ports[0])


class RedisCluster(_Servers):
    def __init__(self, masters=3, password=None, replicas=0):
        super().__init__(masters * (1 + replicas), True, password)
        for p in self.ports:
            self._start(p)
        env = dict(os.environ)
        if password:
            env["REDISCLI_AUTH"] = password
        r = subprocess.run(["redis-cli", "--cluster", "create"] + ["%s:%d" % (HOST, p) for p in self.ports] +
                           ["--cluster-replicas", str(replicas), "--cluster-yes"], capture_output=True, text=True,
                           timeout=60, env=env)
        if r.returncode:
            raise RuntimeError("redis-cli --cluster create failed: " + r.stdout[-400:] + r.stderr[-400:])
        self.wait_ok()

    def wait_ok(self, timeout=30):
        t_end = time.time() + timeout
        while time.time() < t_end:
            states = [cli(p, "CLUSTER", "INFO", password=self.password) for p in self.procs]
            # with replicas: every replica linked to its master too (a failover needs it)
            nodes = cli(next(iter(self.procs)), "CLUSTER", "NODES", password=self.password)
            linked = all(" connected" in line for line in nodes.splitlines() if line.strip())
            if all("cluster_state:ok" in s for s in states) and linked:
                return
            time.sleep(0.1)
        raise RuntimeError("cluster did not reach cluster_state:ok")


def _stop_all(*_):
    for s in list(_live):
        s.stop()


atexit.register(_stop_all)


def _on_signal(sig, _frame):
    _stop_all()
    sys.exit(128 + sig)


def main(argv):
    masters, single, pwfile, failover = 3, False, None, False
    i = 0
    while i < len(argv) and argv[i] != "--":
        if argv[i] == "--masters":
            masters = int(argv[i + 1])
            i += 2
        elif argv[i] == "--single":
            single = True
            i += 1
        elif argv[i] == "--failover":
            failover = True
            i += 1
        elif argv[i] == "--password-file":
            pwfile = argv[i + 1]
            i += 2
        else:
            sys.exit("redis_cluster.py: unknown option " + argv[i])
    cmd = argv[i + 1:]
    if not cmd:
        sys.exit("usage: redis_cluster.py [--masters N] [--single] [--failover] [--password-file F] -- CMD ARGS...")
    if not have_redis():
        print("redis_cluster.py: redis-server / redis-cli not installed: skip")
        sys.exit(77)
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    password = open(pwfile).read().strip() if pwfile else None
    env = dict(os.environ)
    c = RedisCluster(masters, password)
    env["KVT_TEST_REDIS_CLUSTER"] = c.seeds()
    env["KVT_TEST_REDIS_PORTS"] = ",".join(str(p) for p in c.ports)
    if single:
        # the single server always asks for a password (the AUTH path)
        spw = "kvt-test-%d" % random.randrange(1 << 30)
        s = RedisSingle(spw)
        env["KVT_TEST_REDIS_SINGLE"] = s.seeds()
        env["KVT_TEST_REDIS_SINGLE_PASSWORD"] = spw
    if failover:
        f = RedisCluster(3, password, replicas=1)
        env["KVT_TEST_REDIS_FAILOVER"] = f.seeds()
    try:
        rc = subprocess.run(cmd, env=env, timeout=600).returncode
    finally:
        _stop_all()
    sys.exit(rc)


if __name__ == "__main__":
    main(sys.argv[1:])
