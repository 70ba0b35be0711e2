"""tests/daemon/test_store.py — kvtierd's Redis-protocol key-value store ([store], docs/store.md).

    test_store.py BUILD [CASE ...]

Each case starts kvtierd on the small synthetic model `BUILD/bench_gpu --synth` writes (a start
takes a fraction of a second) with `[store] listen = 127.0.0.1:0` (the port is read from the log
line "store: Redis protocol on HOST:PORT") and small tiers ([tier.nvme] capacity 256M at most), in
a temporary data dir removed afterwards (kept on failure). Cases:

  lmcache   redis-py driving LMCache's two-key layout exactly as LMCache's RedisConnector does
            (LMCache/LMCache lmcache/v1/storage_backend/connector/redis_connector.py at commit
            3ff496a27fc2feee34ad5117e11f30eb3ea69098; keys as CacheEngineKey.to_string() in
            lmcache/utils.py, "model@world_size@worker_id@chunk_hash_hex@dtype"; metadata as
            RemoteMetadata.serialize() in lmcache/v1/protocol.py, struct "iiiiiii": length, fmt,
            dtype, shape[0..3]): put = SET <key>kv_bytes, then SET <key>metadata; exists =
            EXISTS <key>metadata; get = GET <key>metadata, then GET <key>kv_bytes, and DEL
            <key>metadata when the bytes are gone. The metadata must describe the bytes read.
  raw       8 threads, each a blocking socket as LMCache's native client uses one: fixed-size
            values, pipelined SETs then GETs, replies compared byte for byte (+OK, :1, $N).
  conns     300 connections open at once (LMCache's redis-py pool opens up to 150; the listener must
            take 256 and more), each SET then GET its own key; the 301st, over [store]
            max_connections = 300, refused with Redis's error.
  big       an 80 MiB value round trip (raw socket and redis-py), then INFO and /v1/stats.
  auth      two API keys (tenants a, b) and an admin key: the same key name holds two values;
            no AUTH -> NOAUTH; a wrong key -> WRONGPASS; AUTH user pass (user "default" or the
            tenant); /v1/stats shows a tenant only its own store row; /metrics' kvtier_store_*
            families are each documented in docs/http-api.md.
  restart   SIGTERM, restart: every acknowledged value back whole; then half of a 64 MiB SET
            sent, kill -9, restart: every acknowledged value whole, the half-sent key absent; then
            5 times a 4 MiB SET and kill -9 the instant its +OK arrives: the value back whole.
  evict     a full NVMe share: 3x the store's NVMe bytes written, every SET +OK, the oldest keys
            gone, the newest present, evictions counted in /v1/stats.
  hostile   negative and huge lengths, bad framing, inline garbage, a declared 1 GiB value with
            nothing after it (RSS must not grow by it): each closed with -ERR Protocol error, the
            daemon alive, stored values intact.
"""
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvtierd_proc import FAILS, Daemon, check, http, proc_status  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

try:
    import redis  # redis-py (PyPI), installed into .venv-test by scripts/test.sh
except ImportError:
    redis = None


def conf(model, host="256M", nvme="256M", share="0.25", extra_store="", server=""):
    return ("[server]\nlisten = 127.0.0.1:0\n%s[model]\npath = %s\ndevice = cpu\ncontext = 2048\n"
            "[tier.hbm]\ncapacity = 32M\n[tier.host]\ncapacity = %s\n[tier.nvme]\ncapacity = %s\n"
            "[store]\nlisten = 127.0.0.1:0\nshare = %s\n%s[index]\ndata_dir = @DATA@\n"
            % (server, model, host, nvme, share, extra_store))


class Store:
    """kvtierd with the store on; .port is the Redis-protocol port (from the log)."""

    def __init__(self, build, tmp, **kw):
        self.model = os.path.join(tmp, "synth.gguf")
        if not os.path.exists(self.model):
            subprocess.run([os.path.join(build, "bench_gpu"), "--synth", self.model], check=True,
                           stdout=subprocess.DEVNULL)
        self.d = Daemon(build, os.path.join(tmp, "data"), conf(self.model, **kw))
        self.port = None

    def start(self):
        n = len(re.findall(r"store: Redis protocol on", self.d._log()))
        self.d.start()
        ports = re.findall(r"store: Redis protocol on [0-9.]+:(\d+)", self.d._log())
        check(len(ports) > n, "no store port in the log")
        self.port = int(ports[-1])

    def stop(self, sig=signal.SIGTERM):
        return self.d.stop(sig)

    def client(self, **kw):
        return redis.Redis(host="127.0.0.1", port=self.port, protocol=2, **kw)

    def sock(self, timeout=60):
        s = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s


def cmd(*args):
    """One command as a RESP multibulk."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += [b"$%d\r\n" % len(a), a, b"\r\n"]
    return b"".join(out)


def read_exact(s, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise EOFError("closed after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return bytes(buf)


def read_until_closed(s, limit=1 << 16):
    buf = b""
    s.settimeout(10)
    try:
        while len(buf) < limit:
            chunk = s.recv(4096)
            if not chunk:
                break
            buf += chunk
    except (ConnectionResetError, socket.timeout):
        pass
    return buf


def pattern(seed, n):
    """n deterministic bytes for seed (fast: a repeated 4 KiB block with the seed in it)."""
    block = bytes((seed * 131 + i * 7) & 0xFF for i in range(4096))
    return (block * (n // 4096 + 1))[:n]


# ---- cases ----------------------------------------------------------------------------------------

def lmcache_key(chunk_hash):
    return "meta-llama/Llama-3.1-8B-Instruct@1@0@%x@bfloat16" % chunk_hash


def lmcache_put(r, key, kv_bytes, shape):
    meta = struct.pack("iiiiiii", len(kv_bytes), 1, 3, *shape)  # fmt 1 (KV_2LTD), dtype 3 (bfloat16)
    # "kv bytes needs to be set first to avoid race condition" (redis_connector.py _put)
    check(r.set(key + "kv_bytes", kv_bytes) is True, "lmcache: SET kv_bytes")
    check(r.set(key + "metadata", meta) is True, "lmcache: SET metadata")


def lmcache_get(r, key):
    meta = r.get(key + "metadata")
    if meta is None:
        return None
    length, fmt, dtype, s0, s1, s2, s3 = struct.unpack_from("iiiiiii", meta)
    kv = r.get(key + "kv_bytes")
    if kv is None:
        r.delete(key + "metadata")
        return None
    check(len(kv) >= length, "lmcache: kv_bytes shorter than its metadata says (%d < %d)" % (len(kv), length))
    return kv[:length], (s0, s1, s2, s3)


def case_lmcache(build, tmp):
    st = Store(build, tmp)
    st.start()
    try:
        r = st.client()
        chunks = {}
        for i in range(24):
            shape = (2, 4, 256, 128 + i)  # [kv, layers, tokens, hidden]: a bfloat16 chunk
            kv = pattern(i, 2 * 4 * 256 * (128 + i) * 2)
            key = lmcache_key(0x9E3779B97F4A7C15 * (i + 1) & (2 ** 63 - 1))
            lmcache_put(r, key, kv, shape)
            chunks[key] = (kv, shape)
        # batched_async_contains: EXISTS on each metadata key in order
        hits = 0
        for key in chunks:
            if not r.exists(key + "metadata"):
                break
            hits += 1
        check(hits == len(chunks), "lmcache: %d of %d chunks found by EXISTS" % (hits, len(chunks)))
        for key, (kv, shape) in chunks.items():
            got = lmcache_get(r, key)
            check(got is not None and got[0] == kv and got[1] == shape, "lmcache: chunk %s read back wrong" % key)
        check(r.exists(lmcache_key(12345) + "metadata") == 0, "lmcache: an unknown chunk exists")
        check(lmcache_get(r, lmcache_key(12345)) is None, "lmcache: an unknown chunk read")
        # metadata whose bytes are gone: the connector deletes the metadata
        gone = lmcache_key(777)
        lmcache_put(r, gone, b"x" * 100, (1, 1, 1, 100))
        check(r.delete(gone + "kv_bytes") == 1, "lmcache: DEL kv_bytes")
        check(lmcache_get(r, gone) is None and r.exists(gone + "metadata") == 0,
              "lmcache: metadata without bytes not dropped")
        # the handshake redis-py does by default (RESP3 HELLO, NOPROTO, fall back to RESP2)
        r3 = redis.Redis(host="127.0.0.1", port=st.port)
        check(r3.ping() is True and r3.get(next(iter(chunks)) + "metadata") is not None,
              "lmcache: redis-py's default (RESP3 first) client does not work")
        r.close()
        r3.close()
    finally:
        st.stop()


def raw_worker(port, tid, n, size, errors):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
        vals = [pattern(tid * 1000 + i, size) for i in range(n)]
        s.sendall(b"".join(cmd("SET", "raw:%d:%d" % (tid, i), vals[i]) for i in range(n)))
        got = read_exact(s, 5 * n)
        if got != b"+OK\r\n" * n:
            errors.append("thread %d: SET replies %r" % (tid, got[:40]))
        for i in range(n):
            s.sendall(cmd("EXISTS", "raw:%d:%d" % (tid, i)))
            if read_exact(s, 4) != b":1\r\n":
                errors.append("thread %d: EXISTS %d" % (tid, i))
            s.sendall(cmd("GET", "raw:%d:%d" % (tid, i)))
            head = b"$%d\r\n" % size
            if read_exact(s, len(head) + size + 2) != head + vals[i] + b"\r\n":
                errors.append("thread %d: GET %d not byte-exact" % (tid, i))
        s.sendall(cmd("GET", "raw:none:%d" % tid) + cmd("EXISTS", "raw:none:%d" % tid) + cmd("DEL", "raw:%d:0" % tid))
        tail = read_exact(s, 5 + 4 + 4)
        if tail != b"$-1\r\n:0\r\n:1\r\n":
            errors.append("thread %d: miss/del replies %r" % (tid, tail))
        s.close()
    except Exception as e:  # noqa: BLE001 — a thread's failure is reported by the case
        errors.append("thread %d: %s: %s" % (tid, type(e).__name__, e))


def case_raw(build, tmp):
    st = Store(build, tmp)
    st.start()
    try:
        errors = []
        threads = [threading.Thread(target=raw_worker, args=(st.port, t, 16, 256 << 10, errors)) for t in range(8)]
        t0 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        check(not errors, "raw: %s" % errors[:3])
        print("raw: 8 x 16 x 256 KiB SET+GET in %.2f s" % (time.time() - t0), flush=True)
    finally:
        st.stop()


N_CONNS = 300


def case_conns(build, tmp):
    st = Store(build, tmp, extra_store="max_connections = %d\n" % N_CONNS)
    st.start()
    try:
        socks = [st.sock() for _ in range(N_CONNS)]
        for i, s in enumerate(socks):
            s.sendall(cmd("SET", "c%d" % i, "v%d" % i))
        ok = sum(read_exact(s, 5) == b"+OK\r\n" for s in socks)
        for i, s in enumerate(socks):
            s.sendall(cmd("GET", "c%d" % i))
        good = 0
        for i, s in enumerate(socks):
            v = b"v%d" % i
            good += read_exact(s, len(b"$%d\r\n" % len(v)) + len(v) + 2) == b"$%d\r\n%s\r\n" % (len(v), v)
        check(ok == N_CONNS and good == N_CONNS, "conns: %d SETs, %d GETs of %d right" % (ok, good, N_CONNS))
        # one more: over [store] max_connections, refused with Redis's error
        extra = st.sock()
        got = read_until_closed(extra)
        check(got == b"-ERR max number of clients reached\r\n", "conns: connection %d got %r" % (N_CONNS + 1, got[:60]))
        extra.close()
        code, stats = http("GET", st.d.url + "/v1/stats")
        lst = (stats.get("store") or {}).get("listener") or {}
        check(code == 200 and lst.get("connections") == N_CONNS and lst.get("connections_refused") == 1,
              "conns: /v1/stats store.listener %s, want %d open, 1 refused" % (lst, N_CONNS))
        for s in socks:
            s.close()
        time.sleep(0.5)
        code, stats = http("GET", st.d.url + "/v1/stats")
        lst = (stats.get("store") or {}).get("listener") or {}
        check(lst.get("connections") == 0, "conns: %s connections still open after the clients closed" % lst.get("connections"))
    finally:
        st.stop()


def case_big(build, tmp):
    st = Store(build, tmp, host="256M", nvme="256M", share="0.5")  # 128 MiB of RAM and of NVMe for the store
    st.start()
    try:
        n = 80 << 20
        val = pattern(80, n)
        s = st.sock()
        t0 = time.time()
        s.sendall(cmd("SET", "big", val))
        check(read_exact(s, 5) == b"+OK\r\n", "big: SET not +OK")
        t1 = time.time()
        s.sendall(cmd("GET", "big"))
        head = b"$%d\r\n" % n
        got = read_exact(s, len(head) + n + 2)
        t2 = time.time()
        check(got[:len(head)] == head and got[len(head):-2] == val and got[-2:] == b"\r\n", "big: GET not byte-exact")
        print("big: 80 MiB SET %.2f s, GET %.2f s (raw socket)" % (t1 - t0, t2 - t1), flush=True)
        s.close()
        r = st.client()
        check(r.get("big") == val, "big: redis-py GET differs")
        info = r.info()
        check(info.get("redis_version") and info.get("db0", {}).get("keys") == 1, "big: INFO %s" % info.get("db0"))
        r.close()
        code, stats = http("GET", st.d.url + "/v1/stats")
        tot = (stats.get("store") or {}).get("total") or {}
        check(code == 200 and tot.get("keys") == 1 and tot.get("bytes") == n, "big: /v1/stats store.total %s" % tot)
    finally:
        st.stop()


def metrics_documented():
    doc = open(os.path.join(ROOT, "docs", "http-api.md")).read()
    block = doc.split("## `GET /metrics`", 1)[1].split("```", 2)[1]
    return {m.group(1): m.group(2) for m in re.finditer(r"^(kvtier_\w+)(?:\{[^}]*\})?\s+(counter|gauge)", block, re.M)}


def case_auth(build, tmp):
    st = Store(build, tmp, server='api_keys = "a:key-a, b:key-b"\nadmin_keys = "ops:key-admin"\n')
    st.start()
    try:
        s = st.sock()
        s.sendall(cmd("GET", "k") + cmd("PING"))
        check(read_exact(s, 34 * 2) == b"-NOAUTH Authentication required.\r\n" * 2, "auth: no NOAUTH before AUTH")
        s.sendall(cmd("AUTH", "nope"))
        want = b"-WRONGPASS invalid username-password pair or user is disabled.\r\n"
        check(read_exact(s, len(want)) == want, "auth: wrong key not WRONGPASS")
        s.sendall(cmd("AUTH", "b", "key-a"))  # the tenant named must be the key's
        check(read_exact(s, len(want)) == want, "auth: key-a accepted for user b")
        s.sendall(cmd("AUTH", "a", "key-a") + cmd("SET", "k", "from-a"))
        check(read_exact(s, 10) == b"+OK\r\n+OK\r\n", "auth: AUTH a key-a / SET")
        s.close()
        rb = st.client(password="key-b")  # AUTH key-b (one argument)
        check(rb.get("k") is None, "auth: tenant b sees tenant a's key")
        rb.set("k", "from-b")
        ra = st.client(username="default", password="key-a")
        check(ra.get("k") == b"from-a" and rb.get("k") == b"from-b", "auth: tenants not apart")
        check(ra.exists("k") == 1 and ra.delete("k") == 1 and rb.get("k") == b"from-b", "auth: DEL crossed tenants")
        rb.set("only-b", "x" * 1000)
        try:
            redis.Redis(host="127.0.0.1", port=st.port, protocol=2, password="wrong").ping()
            check(False, "auth: redis-py with a wrong password connected")
        except redis.exceptions.AuthenticationError:
            pass
        # /v1/stats: a tenant key sees its own store row only; the admin key every row
        code, sb = http("GET", st.d.url + "/v1/stats", headers={"Authorization": "Bearer key-b"})
        rows = (sb.get("store") or {}).get("tenants") if code == 200 else None
        check(rows is not None and [x["tenant"] for x in rows] == ["b"] and rows[0]["keys"] == 2,
              "auth: tenant b's /v1/stats store rows %s" % rows)
        code, sa = http("GET", st.d.url + "/v1/stats", headers={"Authorization": "Bearer key-admin"})
        names = sorted(x["tenant"] for x in (sa.get("store") or {}).get("tenants", []))
        check(code == 200 and names == ["a", "b"], "auth: the admin's /v1/stats store rows %s" % names)
        code, text = http("GET", st.d.url + "/metrics", headers={"Authorization": "Bearer key-admin"})
        exposed = set(re.findall(r"^# TYPE (kvtier_store_\w+) (\w+)", text, re.M)) if code == 200 else set()
        documented = metrics_documented()
        check(len(exposed) > 10, "auth: /metrics has %d kvtier_store_ families" % len(exposed))
        for name, kind in sorted(exposed):
            check(documented.get(name) == kind, "/metrics family %s (%s) is not documented in docs/http-api.md as such"
                  % (name, kind))
        for name in sorted(n for n in documented if n.startswith("kvtier_store_")):
            check(name in {e[0] for e in exposed}, "docs/http-api.md lists %s, which /metrics does not expose" % name)
        check('kvtier_store_keys{tenant="b"} 2' in text, "auth: kvtier_store_keys for tenant b")
        # kvtier stats: the store section (the admin's: every tenant; a tenant's: its own line)
        for key, want, not_want in (("key-admin", ["tenant a", "tenant b", "connections"], []),
                                    ("key-b", ["tenant b"], ["tenant a "])):
            out = subprocess.run([os.path.join(build, "kvtier"), "stats", "--url", st.d.url, "--api-key", key],
                                 capture_output=True, text=True, timeout=60)
            check(out.returncode == 0 and "store (Redis protocol)" in out.stdout
                  and all(w in out.stdout for w in want) and not any(w in out.stdout for w in not_want),
                  "auth: kvtier stats with %s: %s%s" % (key, out.stdout[-600:], out.stderr[-300:]))
        dashboard_check(st, tmp)
        ra.close()
        rb.close()
    finally:
        st.stop()


def dashboard_check(st, tmp):
    """The dashboard's store table (headless chromium, as test_retention's dashboard case): a row per tenant
    and the total, each cell the /v1/stats figure."""
    from test_retention import DomValues, chromium  # noqa: E402 — the same DOM reader
    browser = chromium()
    if not browser:
        check(os.environ.get("KVT_TEST_STRICT") != "1", "dashboard: no chromium (scripts/install_deps.sh installs it)")
        print("skip: dashboard: no chromium", flush=True)
        return
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--user-data-dir=" + os.path.join(tmp, "chromium"), "--virtual-time-budget=5000"]
    dom = subprocess.run([browser] + flags + ["--dump-dom", st.d.url + "/dashboard?key=key-admin"],
                         capture_output=True, text=True, timeout=120).stdout
    code, want = http("GET", st.d.url + "/v1/stats", headers={"Authorization": "Bearer key-admin"})
    p = DomValues()
    p.feed(dom)
    ks = want.get("store") or {}
    rows = [("store-tenant-" + t["tenant"], t) for t in ks.get("tenants", [])] + [("store-total", ks.get("total"))]
    for rid, t in rows:
        exp = [str(t[k]) for k in ("keys", "bytes", "ram_bytes", "nvme_bytes")] + \
              [str(t["hits_ram"] + t["hits_nvme"]), str(t["misses"]), str(t["sets"]), str(t["evicted"])]
        check(p.rows.get(rid) == exp, "dashboard: %s: DOM %s, /v1/stats %s" % (rid, p.rows.get(rid), exp))
    check(len(rows) == 3, "dashboard: store rows %s" % [r for r, _ in rows])


def case_restart(build, tmp):
    st = Store(build, tmp, share="0.5")  # 128 MiB of NVMe for the store
    st.start()
    vals = {}
    try:
        r = st.client()
        for i in range(40):
            vals["r%d" % i] = pattern(i, (i + 1) * 37 * 1024)
            check(r.set("r%d" % i, vals["r%d" % i]) is True, "restart: SET r%d" % i)
        r.close()
        check(st.stop() == 0, "restart: SIGTERM exit status")
        st.start()
        r = st.client()
        bad = [k for k, v in vals.items() if r.get(k) != v]
        check(not bad, "restart: after SIGTERM %d of %d values not back whole: %s" % (len(bad), len(vals), bad[:5]))
        # kill -9 in the middle of a 64 MiB SET
        s = st.sock()
        n = 64 << 20
        half = cmd("SET", "half", pattern(64, n))[: n // 2]
        s.sendall(half)
        time.sleep(0.5)
        st.stop(signal.SIGKILL)
        s.close()
        st.start()
        r = st.client()
        bad = [k for k, v in vals.items() if r.get(k) != v]
        check(not bad, "restart: after kill -9 %d values not back whole: %s" % (len(bad), bad[:5]))
        check(r.exists("half") == 0 and r.get("half") is None, "restart: the half-sent value exists")
        r.close()
        # kill -9 the instant +OK arrives: the acknowledged value is whole after the restart (durable = true)
        lost = 0
        for trial in range(5):
            key, val = "ack%d" % trial, pattern(100 + trial, (4 << 20) + trial * 4097)
            s = st.sock()
            s.sendall(cmd("SET", key, val))
            ok = read_exact(s, 5)
            os.kill(st.d.proc.pid, signal.SIGKILL)
            st.d.proc.wait()
            s.close()
            check(ok == b"+OK\r\n", "restart: trial %d: SET %r" % (trial, ok))
            st.start()
            r = st.client()
            lost += r.get(key) != val
            r.close()
        check(lost == 0, "restart: %d of 5 values acknowledged right before kill -9 lost" % lost)
    finally:
        st.stop()


def case_evict(build, tmp):
    st = Store(build, tmp, host="64M", nvme="256M")  # store: 16 MiB RAM, 64 MiB NVMe
    st.start()
    try:
        code, stats = http("GET", st.d.url + "/v1/stats")
        cap = (stats.get("store") or {}).get("nvme_capacity", 0)
        check(cap >= 32 << 20, "evict: store nvme_capacity %s" % cap)
        size = 1 << 20
        n = 3 * max(cap, 32 << 20) // size
        s = st.sock()
        oks = 0
        for i in range(n):  # in pipelined groups of 8
            if i % 8 == 0:
                grp = range(i, min(n, i + 8))
                s.sendall(b"".join(cmd("SET", "e%d" % j, pattern(j, size)) for j in grp))
                oks += read_exact(s, 5 * len(grp)) == b"+OK\r\n" * len(grp)
        check(oks == (n + 7) // 8, "evict: %d of %d SET groups answered +OK" % (oks, (n + 7) // 8))
        r = st.client()
        check(r.get("e0") is None, "evict: the oldest key survived 3x the store's NVMe")
        newest = [r.get("e%d" % j) == pattern(j, size) for j in range(n - 4, n)]
        check(all(newest), "evict: the newest keys %s" % newest)
        code, stats = http("GET", st.d.url + "/v1/stats")
        tot = (stats.get("store") or {}).get("total") or {}
        check(tot.get("evicted", 0) > 0, "evict: no evictions counted: %s" % tot)
        print("evict: %d x 1 MiB into %d MiB: %s evicted, %s kept" % (n, cap >> 20, tot.get("evicted"), tot.get("keys")),
              flush=True)
        r.close()
        s.close()
    finally:
        st.stop()


HOSTILE = [
    (b"*1\r\n$-5\r\n", b"invalid bulk length"),
    (b"*1\r\n$99999999999999999999\r\n", b"invalid bulk length"),
    (b"*2\r\n$3\r\nGET\r\n$1073741824\r\n", b"invalid bulk length"),
    (b"*1\r\n$1073741824\r\n", b"invalid bulk length"),
    (b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$999999999999\r\n", b"invalid bulk length"),
    (b"*99999999\r\n", b"invalid multibulk length"),
    (b"*1\r\n+PING\r\n", b"expected '$'"),
    (b"*1\r\n$4\r\nPINGxx", b"expected CRLF"),
    (b"GET a\r\n\x00\x01\x02garbage\r\n", b"invalid inline request"),
    (b"x" * 70000, b"too big inline request"),
]


def case_hostile(build, tmp):
    st = Store(build, tmp, extra_store="max_value = 2G\n")
    st.start()
    try:
        r = st.client()
        keep = pattern(5, 300 << 10)
        r.set("keep", keep)
        for data, why in HOSTILE:
            s = st.sock()
            s.sendall(data)
            got = read_until_closed(s)
            check(b"-ERR Protocol error: " + why in got and got.endswith(b"\r\n"),
                  "hostile %r: got %r" % (data[:24], got[:80]))
            s.close()
        # a declared 1 GiB value and a few bytes: not allocated up front
        pid = st.d.proc.pid
        rss0 = proc_status(pid)["VmRSS"]
        socks = []
        for i in range(4):
            s = st.sock()
            s.sendall(b"*3\r\n$3\r\nSET\r\n$4\r\nhuge\r\n$1073741824\r\n" + b"y" * 1000)
            socks.append(s)
        time.sleep(1.0)
        rss1 = proc_status(pid)["VmRSS"]
        check(rss1 - rss0 < 64 << 20, "hostile: RSS grew %d MiB for 4 declared 1 GiB values" % ((rss1 - rss0) >> 20))
        for s in socks:
            s.close()
        time.sleep(0.3)
        check(st.d.proc.poll() is None, "hostile: the daemon died")
        check(r.get("keep") == keep and r.exists("huge") == 0 and r.exists("k") == 0,
              "hostile: stored values changed")
        code, stats = http("GET", st.d.url + "/v1/stats")
        pe = ((stats.get("store") or {}).get("listener") or {}).get("protocol_errors")
        check(pe == len(HOSTILE), "hostile: protocol_errors %s, want %d" % (pe, len(HOSTILE)))
        # over max_connections: refused with an error (the config's limit)
        r.close()
    finally:
        st.stop()


CASES = {"lmcache": case_lmcache, "raw": case_raw, "conns": case_conns, "big": case_big, "auth": case_auth,
         "restart": case_restart, "evict": case_evict, "hostile": case_hostile}


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    if redis is None:
        print("skip: the redis package (redis-py) is not installed in", sys.executable)
        return 77
    from kvtierd_proc import run_cases
    build = os.path.abspath(sys.argv[1])
    if not os.path.exists(os.path.join(build, "bench_gpu")):
        print("skip: no bench_gpu (writes the synthetic model) in", build)
        return 77
    return run_cases("store", __doc__, os.path.join(build, "bench_gpu"), CASES)


if __name__ == "__main__":
    sys.exit(main())
