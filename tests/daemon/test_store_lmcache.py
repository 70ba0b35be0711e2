"""tests/daemon/test_store_lmcache.py — LMCache's own native RESP client against kvtierd's store.

    test_store_lmcache.py BUILD

Optional: runs only when $KVT_LMCACHE_PYTHON names a Python interpreter that imports LMCache (PyPI
`lmcache`, tested with 0.5.6, which pulls in torch and runs on the CPU: its client needs no GPU);
otherwise it exits 77 (skipped). CI does not install LMCache (several GB with torch).

The client is lmcache.v1.storage_backend.native_clients.resp_client.RESPClient, the C++ client
(lmcache.lmcache_redis) behind LMCache's `resp://` remote_url and its daemon's `resp` L2 adapter:
8 worker connections, byte-exact reply parsing. A child process under that interpreter:
  put      batch_set of 48 keys of 256 KiB (one LMCache chunk size), keys in LMCache's format;
  check    batch_exists (all True, and a missing key False), batch_get, every byte compared;
  single   set / exists / get of one 2 MiB value.
The daemon is then stopped with SIGTERM and started again, and a fresh client checks every value;
then kill -9 and a restart, and the same check (a SET answered +OK is on NVMe: [store] durable).
"""
import os
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvtierd_proc import FAILS, check  # noqa: E402
from test_store import Store  # noqa: E402

CHILD = r'''
import asyncio, hashlib, sys
from lmcache.v1.storage_backend.native_clients.resp_client import RESPClient

port, mode = int(sys.argv[1]), sys.argv[2]
N, SIZE = 48, 256 * 1024

def key(i):
    return "SmolLM2-135M@1@0@%s@half" % hashlib.sha256(b"chunk%d" % i).hexdigest()[:32]

def val(i, n):
    return (hashlib.sha256(b"v%d" % i).digest() * (n // 32 + 1))[:n]

async def main():
    c = RESPClient("127.0.0.1", port, 8, asyncio.get_running_loop())
    keys = [key(i) for i in range(N)]
    if mode == "put":
        await c.batch_set(keys, [memoryview(bytearray(val(i, SIZE))) for i in range(N)])
        await c.set("single", memoryview(bytearray(val(999, 2 << 20))))
    ex = await c.batch_exists(keys + ["absent-" + keys[0]])
    assert ex == [True] * N + [False], "batch_exists: %r" % ex
    bufs = [memoryview(bytearray(SIZE)) for _ in range(N)]
    await c.batch_get(keys, bufs)
    bad = [i for i in range(N) if bytes(bufs[i]) != val(i, SIZE)]
    assert not bad, "values differ: %r" % bad
    assert await c.exists("single")
    one = memoryview(bytearray(2 << 20))
    await c.get("single", one)
    assert bytes(one) == val(999, 2 << 20), "the 2 MiB value differs"
    c.close()
    print("OK", mode)

asyncio.run(main())
'''


def child(py, port, mode):
    r = subprocess.run([py, "-c", CHILD, str(port), mode], capture_output=True, text=True, timeout=300)
    ok = r.returncode == 0 and ("OK " + mode) in r.stdout
    check(ok, "LMCache client (%s): rc %d\n%s%s" % (mode, r.returncode, r.stdout[-2000:], r.stderr[-3000:]))
    return ok


def main():
    build = os.path.abspath(sys.argv[1])
    py = os.environ.get("KVT_LMCACHE_PYTHON", "")
    if not py or subprocess.run([py, "-c", "import lmcache.lmcache_redis"], capture_output=True).returncode:
        print("test_store_lmcache: skipped: set KVT_LMCACHE_PYTHON to a Python with LMCache (pip install lmcache)")
        sys.exit(77)
    with tempfile.TemporaryDirectory(prefix="kvt_store_lmc_") as tmp:
        s = Store(build, tmp)
        s.start()
        try:
            if child(py, s.port, "put"):
                s.stop()
                s.start()
                child(py, s.port, "check")
                s.stop(signal.SIGKILL)
                s.start()
                child(py, s.port, "check")
        finally:
            s.stop()
    print("test_store_lmcache: %d failed" % len(FAILS))
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
