#!/usr/bin/env python3
"""bench/bench_store.py — kvtierd's Redis-protocol store against redis-server, in one run.

Both servers run on loopback on this machine and get the same work from the same
client: --clients connections (threads), each sending its commands --depth at a
time (pipelined), values of each --sizes size, --mib MiB of them per size.

  set / get (RAM)  SET every key, then GET every key; MB/s and p99 latency of one
                   pipelined round. kvtier twice: durable (the default: a SET is
                   answered once its value is on NVMe and its row committed) and
                   `durable = false` (answered from RAM, written behind).
                   redis-server runs without persistence (--save "" --appendonly no).
  get (NVMe)       kvtierd restarted (SIGTERM): its RAM is empty, every value is read
                   from its NVMe file; MB/s against the device's O_DIRECT read
                   bandwidth of the same file, measured right after (dd iflag=direct
                   bs=4M), target >= 0.7x.
  restart          keys each server still has after a restart (redis-server without
                   persistence: none).

Rounds alternate (redis, kvtier durable, kvtier not durable) --rounds times; medians
are reported, and ratios against redis-server from the same round. Every process
is killed and every data dir deleted at the end. Prints one JSON object last.
Usage: bench_store.py BUILD_DIR [--sizes 256K,4M,64M] [--mib 256] [--clients 4] [--depth 4] [--rounds 2]
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "daemon"))
from kvtierd_proc import Daemon  # noqa: E402

MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def parse_size(t):
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(t[:-1]) * m[t[-1].upper()] if t[-1].upper() in m else int(t)


class Conn:
    """A minimal RESP2 client: the same for both servers, reads replies byte-exactly."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=120)
        self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()

    def send(self, *args):
        parts = [b"*%d\r\n" % len(args)]
        for a in args:
            parts.append(b"$%d\r\n" % len(a))
            parts.append(a)
            parts.append(b"\r\n")
        self.s.sendall(b"".join(parts) if sum(len(p) for p in parts) < (1 << 20) else parts[0])
        if sum(len(p) for p in parts) >= (1 << 20):
            for p in parts[1:]:
                self.s.sendall(p)

    def _fill(self, n):
        while len(self.buf) < n:
            chunk = self.s.recv(max(1 << 20, n - len(self.buf)))
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk

    def _line(self):
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[:i + 2]
                return line
            self._fill(len(self.buf) + 1)

    def reply(self):
        line = self._line()
        if line[:1] == b"$":
            n = int(line[1:])
            if n < 0:
                return None
            out = bytearray(n + 2)
            view = memoryview(out)
            have = min(len(self.buf), n + 2)
            view[:have] = self.buf[:have]
            del self.buf[:have]
            while have < n + 2:  # straight into the value's buffer: no growing copies
                got = self.s.recv_into(view[have:])
                if not got:
                    raise ConnectionError("closed")
                have += got
            view.release()
            del out[n:]
            return out
        if line[:1] == b"-":
            raise RuntimeError(line.decode())
        return line

    def close(self):
        self.s.close()


def run_clients(port, cmds_of, n_clients, depth):
    """Each client sends its commands depth at a time; returns (seconds, round latencies, replies)."""
    lat, out, errs = [], [], []
    lock = threading.Lock()

    def work(ci):
        try:
            c = Conn(port)
            mine, got = cmds_of(ci), []
            for i in range(0, len(mine), depth):
                t0 = time.perf_counter()
                for cmd in mine[i:i + depth]:
                    c.send(*cmd)
                got += [c.reply() for _ in mine[i:i + depth]]
                with lock:
                    lat.append(time.perf_counter() - t0)
            c.close()
            with lock:
                out.extend(got)
        except Exception as e:  # noqa: BLE001
            errs.append(repr(e))

    th = [threading.Thread(target=work, args=(i,)) for i in range(n_clients)]
    t0 = time.perf_counter()
    for t in th:
        t.start()
    for t in th:
        t.join()
    if errs:
        raise RuntimeError("client: %s" % errs[0])
    return time.perf_counter() - t0, lat, out


def p99(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * 0.99))]


def set_get(port, size, n_keys, a, values, tag):
    keys = [b"bench:%s:%d:%d" % (tag.encode(), size, i) for i in range(n_keys)]
    per = lambda ci: keys[ci::a.clients]  # noqa: E731
    secs, lat, rep = run_clients(port, lambda ci: [(b"SET", k, values[i % len(values)])
                                                   for i, k in enumerate(per(ci))], a.clients, a.depth)
    assert all(r == b"+OK" for r in rep), "a SET was not answered +OK"
    mb = size * n_keys / 1e6
    res = {"set_MBps": mb / secs, "set_p99_ms": p99(lat) * 1e3}
    secs, lat, rep = run_clients(port, lambda ci: [(b"GET", k) for k in per(ci)], a.clients, a.depth)
    assert all(r is not None and len(r) == size for r in rep), "a GET missed"
    res.update({"get_MBps": mb / secs, "get_p99_ms": p99(lat) * 1e3})
    return res, keys


class Redis:
    def __init__(self, tmp):
        self.dir = os.path.join(tmp, "redis")
        os.makedirs(self.dir, exist_ok=True)
        self.port = free_port()
        self.p = None

    def start(self):
        self.p = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no", "--dir", self.dir, "--proto-max-bulk-len", "1gb",
                                   "--client-query-buffer-limit", "1gb"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port)

    def stop(self):
        if self.p:
            self.p.send_signal(signal.SIGTERM)
            self.p.wait(60)
            self.p = None


def wait_port(port, timeout=120):
    t_end = time.time() + timeout
    while time.time() < t_end:
        try:
            c = Conn(port)
            c.send(b"PING")
            if c.reply() == b"+PONG":
                c.close()
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("port %d never answered PING" % port)


class Kvtier:
    def __init__(self, build, tmp, name, durable, ram, nvme):
        self.port = free_port()
        self.d = Daemon(build, os.path.join(tmp, name),
                        "[server]\nlisten = 127.0.0.1:0\n[model]\npath = %s\ndevice = cpu\n"
                        "[tier.hbm]\ncapacity = 128M\n[tier.host]\ncapacity = %d\n[tier.nvme]\ncapacity = %d\n"
                        "[store]\nlisten = 127.0.0.1:%d\nshare = 0.9\ndurable = %s\n"
                        "[index]\ndata_dir = @DATA@\n" % (MODEL, ram * 10 // 9, nvme * 10 // 9, self.port,
                                                          "true" if durable else "false"))
        self.data = os.path.join(tmp, name)

    def start(self):
        self.d.start()
        wait_port(self.port)

    def stop(self):
        self.d.stop()


def device_read_MBps(path, mib):
    t0 = time.perf_counter()
    subprocess.run(["dd", "if=" + path, "of=/dev/null", "bs=4M", "iflag=direct", "count=%d" % (mib // 4)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return mib * 1048576 / 1e6 / (time.perf_counter() - t0)


def nvme_round(k, size, keys, a):
    k.stop()
    k.start()
    per = lambda ci: keys[ci::a.clients]  # noqa: E731
    secs, lat, rep = run_clients(k.port, lambda ci: [(b"GET", x) for x in per(ci)], a.clients, a.depth)
    kept = sum(1 for r in rep if r is not None and len(r) == size)
    mb = size * kept / 1e6
    dev = device_read_MBps(os.path.join(k.data, "store.t2"), min(a.mib * 2, 1024))
    return {"nvme_get_MBps": mb / secs, "nvme_get_p99_ms": p99(lat) * 1e3, "device_read_MBps": dev,
            "nvme_vs_device": mb / secs / dev, "kept_after_restart": kept, "keys": len(keys)}


def one_size(size, a, servers, rounds):
    n_keys = max(a.clients, a.mib * 1048576 // size)
    values = [os.urandom(size) for _ in range(2)]
    rows = {name: [] for name in servers}
    for r in range(a.rounds):
        for name, srv in servers.items():
            res, keys = set_get(srv.port, size, n_keys, a, values, "r%d" % r)
            if name == "kvtier_durable":
                res.update(nvme_round(srv, size, keys, a))
            elif name == "redis":
                srv.stop()
                srv.start()
                c = Conn(srv.port)
                c.send(b"EXISTS", *keys[:1000])
                res["kept_after_restart"] = int(c.reply()[1:])
                c.close()
            rows[name].append(res)
            print("size %d round %d %s: %s" % (size, r, name, json.dumps({x: round(y, 2) for x, y in res.items()})),
                  flush=True)
    rounds.append({"size": size, "keys": n_keys, "rows": rows})


def summarize(rounds):
    out = []
    for r in rounds:
        med = {n: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for n, rs in r["rows"].items()}
        red = med["redis"]
        s = {"size": r["size"], "keys": r["keys"], "median": med, "ratio_vs_redis": {}}
        for n in ("kvtier_durable", "kvtier_async"):
            s["ratio_vs_redis"][n] = {k: med[n][k] / red[k] for k in ("set_MBps", "get_MBps")}
        out.append(s)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--sizes", default="256K,4M,64M")
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    if not shutil.which("redis-server"):
        sys.exit("redis-server is not installed")
    tmp = tempfile.mkdtemp(prefix="kvt_bench_store_")
    n_sizes = len(a.sizes.split(","))
    ram = max(1 << 30, a.mib * 1048576 * a.rounds * n_sizes * 5 // 4)  # the store keeps every value: no eviction
    nvme = ram
    servers = {"redis": Redis(tmp), "kvtier_durable": Kvtier(a.build, tmp, "kd", True, ram, nvme),
               "kvtier_async": Kvtier(a.build, tmp, "ka", False, ram, nvme)}
    rounds = []
    try:
        for s in servers.values():
            s.start()
        for size in [parse_size(x) for x in a.sizes.split(",")]:
            one_size(size, a, servers, rounds)
    finally:
        for s in servers.values():
            try:
                s.stop()
            except Exception:  # noqa: BLE001
                pass
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"bench": "store", "clients": a.clients, "depth": a.depth, "mib_per_size": a.mib,
                      "sizes": summarize(rounds)}, indent=1))


if __name__ == "__main__":
    main()
