"""tests/daemon/test_ack_durable.py — a reply received is never lost (DESIGN §8 invariant 6).

    test_ack_durable.py BUILD [TRIALS]

Serves the small synthetic model `BUILD/bench_gpu --synth` writes (so a start takes a
fraction of a second) and runs TRIALS (default 100, or $KVT_ACK_TRIALS) trials of one
session turn each: the instant the reply has arrived (the whole non-streamed body, or a
stream's `[DONE]`), kvtierd gets SIGKILL; it is restarted and the session must hold
exactly that turn's history (its prompt and reply: `tokens` of GET /v1/sessions equals
the reply's prompt_tokens + completion_tokens). Eight sessions take turns, each turn a
prompt of a length the session never had before, so a turn rolled back to the previous
one is seen as well as a lost one. Every fourth trial streams. After each restart every
session row's `durable_tokens` (how far it says its blocks are durable) must be covered by
the blocks found on NVMe. The data dir uses a
16 MiB NVMe tier and is removed at the end (kept on failure).
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvtierd_proc import FAILS, Daemon, check, http  # noqa: E402

N_SESSIONS = 8
BT = 16  # tokens per block (the default [cache] block_tokens)


def stream_turn(url, body):
    """POST a streamed completion; returns the usage of its last chunk once `data: [DONE]` is read."""
    host, port = url.split("//")[1].split(":")
    payload = json.dumps(dict(body, stream=True, stream_options={"include_usage": True})).encode()
    s = socket.create_connection((host, int(port)), timeout=60)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(payload) + payload)
    buf = b""
    while b"data: [DONE]" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    s.close()
    usage = None
    for line in buf.split(b"\n"):
        if line.startswith(b"data: {"):
            ev = json.loads(line[6:])
            usage = ev.get("usage") or usage
    return b"data: [DONE]" in buf, usage


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    build = os.path.abspath(sys.argv[1])
    trials = int(sys.argv[2]) if len(sys.argv) > 2 else int(os.environ.get("KVT_ACK_TRIALS", "100"))
    tmp = tempfile.mkdtemp(prefix="kvt_ack_durable_")
    model = os.path.join(tmp, "synth.gguf")
    subprocess.run([os.path.join(build, "bench_gpu"), "--synth", model], check=True, stdout=subprocess.DEVNULL)
    data = os.path.join(tmp, "data")
    d = Daemon(build, data,
               "[server]\nlisten = 127.0.0.1:0\n[model]\npath = %s\ndevice = cpu\ncontext = 2048\n"
               "[tier.hbm]\ncapacity = 32M\n[tier.host]\ncapacity = 32M\n[tier.nvme]\ncapacity = 16M\n"
               "[index]\ndata_dir = @DATA@\n" % model)
    lost = rolled = over = 0
    t0 = time.time()
    d.start()
    try:
        for i in range(trials):
            sid = "s%d" % (i % N_SESSIONS)
            n_prompt = 20 + i  # every turn of a session is longer than its last
            prompt = [3 + (i * 31 + k * 7) % 250 for k in range(n_prompt)]
            body = {"prompt": prompt, "max_tokens": 3 + i % 5, "temperature": 0, "session_id": sid}
            if i % 4 == 3:
                done, usage = stream_turn(d.url, body)
                os.kill(d.proc.pid, signal.SIGKILL)  # the instant [DONE] arrived
                if not check(done and usage, "trial %d: the stream ended without [DONE] or usage" % i):
                    d.proc.wait()
                    d.start()
                    continue
            else:
                st, r = http("POST", d.url + "/v1/completions", body, timeout=60)
                os.kill(d.proc.pid, signal.SIGKILL)  # the instant the reply arrived
                if not check(st == 200, "trial %d: status %s: %s" % (i, st, r)):
                    d.proc.wait()
                    d.start()
                    continue
                usage = r["usage"]
            d.proc.wait()
            want = usage["prompt_tokens"] + usage["completion_tokens"]
            d.start()
            st, rows = http("GET", d.url + "/v1/sessions")
            got = {row["id"]: row["tokens"] for row in rows.get("data", [])} if st == 200 else {}
            # the row never claims more than is durable: after the restart every block it counts is found (NVMe)
            for row in rows.get("data", []) if st == 200 else []:
                found = sum(row["blocks_in"].values()) * BT
                if not check(0 <= row.get("durable_tokens", -1) <= min(found, row["tokens"]),
                             "trial %d: session %s says %s tokens durable, %d found after kill -9"
                             % (i, row["id"], row.get("durable_tokens"), found)):
                    over += 1
            if sid not in got:
                lost += 1
                check(False, "trial %d: session %s lost after kill -9 right after its reply" % (i, sid))
            elif got[sid] != want:
                rolled += 1
                check(False, "trial %d: session %s holds %d tokens after kill -9, the acknowledged turn has %d"
                      % (i, sid, got[sid], want))
    finally:
        d.stop(signal.SIGKILL)
    print(json.dumps({"test": "ack_durable", "trials": trials, "lost": lost, "rolled_back": rolled,
                      "durable_overclaimed": over,
                      "seconds": round(time.time() - t0, 1)}), flush=True)
    if not FAILS:
        shutil.rmtree(tmp, ignore_errors=True)
    print("test_ack_durable: %d failure(s)" % len(FAILS))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
