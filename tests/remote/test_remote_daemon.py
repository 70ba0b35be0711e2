#!/usr/bin/env python3
"""tests/remote/test_remote_daemon.py — T3 end to end: two kvtierd nodes over a real Redis Cluster.

Starts a 3-master Redis Cluster on loopback ports (redis_cluster.py) and two
kvtierd nodes (the default model, f16 tiers, a small NVMe tier, one shared
server secret, [tier.remote] on the cluster), then:

  crossnode   turn 1 of a conversation on node A; turn 2 on node B is served
              from `remote` (every full block of turn 1's prompt and reply) and
              says what turn 2 says on A
  tenants     the same conversation as another tenant on B: 0 cached tokens,
              0 from remote
  chunks      two documents marked for chunk reuse sent on A; on B, in the
              other order, their chunk blocks come from T3 (B never saw them);
              another pair's chunk records damaged in Redis: B counts them
              corrupt, reuses nothing and answers as A's plain prefill does
  corrupt     values of a conversation's blocks damaged in Redis by the test:
              B detects them (counted corrupt), recomputes, and answers as A
  resume      A killed (-9) after a conversation; `kvtier resume` on B restores
              the session (from T3) and its blocks from remote
  haproxy     configs/two-node/haproxy.cfg (ports rewritten) in front of A and B:
              each session lives on one node, and its turn 2 lands there too
              (cached locally, nothing from remote); skipped without haproxy
  failover    a master killed while B serves conversations A wrote: 0 failed
              requests, the replies A gave, T3 degraded in /v1/stats, /metrics
              and /health; the master back: writes resume

Every process (redis-server, kvtierd) is killed at the end, pass or fail; temp
dirs are removed. Usage: test_remote_daemon.py BUILD_DIR. Exit 0 pass, 1 fail,
77 skip (no model, no redis-server).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "daemon"))
import redis_cluster  # noqa: E402
from kvtierd_proc import FAILS, Daemon, build_arg, check, http  # noqa: E402

MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
BT = 16
PREFIX = "kvtt:"


def node(build, tmp, name, seeds, secret):
    return Daemon(build, os.path.join(tmp, name),
                  "[server]\nlisten = 127.0.0.1:0\nsecret_file = %s\n[model]\npath = %s\ndevice = cpu\ncontext = 2048\n"
                  "[tier.hbm]\ncapacity = 64M\n[tier.host]\ncapacity = 64M\ndtype = f16\n[tier.nvme]\ncapacity = 16M\n"
                  "[tier.remote]\nenabled = true\nseeds = %s\nprefix = %s\ncommand_timeout = 0.5\n"
                  "[index]\ndata_dir = @DATA@\n" % (secret, MODEL, seeds, PREFIX))


def chat(d, messages, session=None, user=None, max_tokens=20):
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    if session:
        body["session_id"] = session
    if user:
        body["user"] = user
    st, r = http("POST", d.url + "/v1/chat/completions", body, timeout=120)
    if not check(st == 200, "chat on %s: status %s: %s" % (d.data_dir, st, r)):
        raise RuntimeError("chat failed")
    return r


def reply(r):
    return r["choices"][0]["message"]["content"]


def by_tier(r):
    return r["usage"]["kvtier"]["cached_tokens_by_tier"]


def cached(r):
    return r["usage"]["prompt_tokens_details"]["cached_tokens"]


def full_blocks(r):
    """Full blocks of a turn's prompt and reply (+ the end-of-turn token when it stopped), in tokens."""
    u = r["usage"]
    n = u["prompt_tokens"] + u["completion_tokens"] + (1 if r["choices"][0]["finish_reason"] == "stop" else 0)
    return n // BT * BT


def stats(d):
    st, s = http("GET", d.url + "/v1/stats", timeout=30)
    return s if st == 200 else {}


def drain(d, timeout=15):
    """Wait until the node's T3 writes are in Redis: the write queue empty and the count of
    blocks written unchanged for 0.5 s (write_queue does not count a batch the writer has
    taken and is still sending, so an empty queue alone can come just before the writes)."""
    t_end = time.time() + timeout
    quiet_since, last = None, None
    while time.time() < t_end:
        r = stats(d).get("remote") or {}
        now = (r.get("write_queue", 1), r.get("writes"))
        if now[0] == 0 and now == last:
            quiet_since = quiet_since or time.time()
            if time.time() - quiet_since >= 0.5:
                return True
        else:
            quiet_since = None
        last = now
        time.sleep(0.05)
    return check(False, "%s: T3 write queue did not drain" % d.data_dir)


def block_keys(cl):
    keys = set()
    for p in cl.procs:
        out = redis_cluster.cli(p, "--scan", "--pattern", PREFIX + "b:*")
        keys.update(k for k in out.split() if k)
    return keys


def conversation(topic):
    return [{"role": "user", "content": "Tell me, in three long sentences, everything you know about %s, "
             "its history, and why people care about it." % topic}]


DOCS = [
    "The lighthouse on Gray Point was built in 1871 from granite blocks quarried two miles inland and hauled "
    "to the cliff on oxen-drawn sledges. Its lamp burned whale oil until 1890, then kerosene, and was finally "
    "electrified in 1934. The keeper's log records that in the winter of 1888 the tower was struck by lightning "
    "three times in one night.\n\n",
    "The river town of Millbrook grew around a paper mill that opened in 1902. At its peak the mill employed "
    "four hundred workers and shipped rolls of newsprint by barge to the coast every week. A fire in 1957 "
    "destroyed the east wing, and the mill closed for good in 1971.\n\n",
    "The orchard on Hollow Lane was planted in 1820 with forty apple trees brought by cart from the valley. "
    "Every autumn the family pressed cider in a wooden press that still stands in the barn, and in 1903 a late "
    "frost killed every blossom, so that no apples were picked that year at all.\n\n",
    "The night train from Ashford to the coast ran for sixty years on a single track through the hills. It "
    "carried mail, milk churns and a few passengers, stopped at nine small stations, and was replaced by a bus "
    "service in 1966 after the viaduct at Lowmoor was found to be unsafe.\n\n",
]


def chunk_chat(d, docs, question, marked=True):
    mark = {"kvtier": {"reuse": "anywhere"}} if marked else {}
    parts = [dict({"type": "text", "text": t}, **mark) for t in docs] + [{"type": "text", "text": question}]
    body = {"messages": [{"role": "user", "content": parts}], "max_tokens": 16, "temperature": 0}
    st, r = http("POST", d.url + "/v1/chat/completions", body)
    check(st == 200, "chunk chat on %s: %s %s" % (d.data_dir, st, r))
    return r


def chunks_case(cl, a, b):
    r = chunk_chat(a, [DOCS[0], DOCS[1]], "Question: when was the lighthouse electrified?")
    check(r["usage"]["kvtier"]["chunk_tokens"] > 128, "A: marked spans: %s" % r["usage"]["kvtier"])
    drain(a)
    rb = chunk_chat(b, [DOCS[1], DOCS[0]], "Question: what did the mill ship?")
    check(rb["usage"]["kvtier"]["chunk_reused_tokens"] > 0,
          "B reuses A's chunks from T3: %s" % rb["usage"]["kvtier"])
    # another pair, its records damaged in Redis before B asks
    before = block_keys(cl)
    chunk_chat(a, [DOCS[2], DOCS[3]], "Question: when was the orchard planted?")
    drain(a)
    new = block_keys(cl) - before
    check(len(new) >= 4, "A wrote the second pair's blocks to T3: %d keys" % len(new))
    for k in new:
        port = [p for p in cl.procs if redis_cluster.cli(p, "EXISTS", k) == "1"]
        if port:
            redis_cluster.cli(port[0], "SETRANGE", k, "5000", "X")
    c0 = (stats(b).get("remote") or {}).get("corrupt", 0)
    q = "Question: why did the night train stop running?"
    rbc = chunk_chat(b, [DOCS[3], DOCS[2]], q)
    c1 = (stats(b).get("remote") or {}).get("corrupt", 0)
    check(c1 > c0, "B counted the damaged chunk records corrupt: %d -> %d" % (c0, c1))
    check(rbc["usage"]["kvtier"]["chunk_reused_tokens"] == 0 and
          rbc["usage"]["kvtier"]["chunk_recomputed_tokens"] == 0,
          "nothing reused from damaged records: %s" % rbc["usage"]["kvtier"])
    rap = chunk_chat(a, [DOCS[3], DOCS[2]], q, marked=False)
    check(reply(rap) == reply(rbc), "B's reply is a plain prefill's:\nA %r\nB %r" % (reply(rap), reply(rbc)))


class Front:
    """The load balancer's address, where chat() wants a node."""
    def __init__(self, url):
        self.url, self.data_dir = url, "haproxy"


def haproxy_case(tmp, a, b):
    port = redis_cluster.free_ports(1)[0]
    cfg = open(os.path.join(ROOT, "configs", "two-node", "haproxy.cfg")).read()
    cfg = (cfg.replace("127.0.0.1:8080", "127.0.0.1:%d" % port)
           .replace("127.0.0.1:8081", a.url[len("http://"):]).replace("127.0.0.1:8082", b.url[len("http://"):]))
    path = os.path.join(tmp, "haproxy.cfg")
    with open(path, "w") as f:
        f.write(cfg)
    log = open(os.path.join(tmp, "haproxy.log"), "w")
    hp = subprocess.Popen(["haproxy", "-db", "-f", path], stdout=log, stderr=subprocess.STDOUT)
    try:
        front = Front("http://127.0.0.1:%d" % port)
        t_end = time.time() + 10
        while time.time() < t_end:
            try:
                if http("GET", front.url + "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        sids = ["hp%d" % i for i in range(4)]
        first = {}
        for sid in sids:
            m = conversation("topic number %s" % sid)
            first[sid] = (m, chat(front, m, session=sid))
        on = {}
        for d, name in ((a, "A"), (b, "B")):
            st, r = http("GET", d.url + "/v1/sessions")
            for x in (r.get("data") or []) if st == 200 else []:
                on.setdefault(x["id"], []).append(name)
        check(all(len(on.get(sid, [])) == 1 for sid in sids),
              "through haproxy each session lives on exactly one node: %s" % {s: on.get(s) for s in sids})
        for sid in sids:  # turn 2 lands where turn 1 did: all from that node's own tiers, nothing from T3
            m, r1 = first[sid]
            m2 = m + [{"role": "assistant", "content": reply(r1)}, {"role": "user", "content": "Go on."}]
            r2 = chat(front, m2, session=sid)
            check(cached(r2) == full_blocks(r1) and by_tier(r2)["remote"] == 0,
                  "%s turn 2 through haproxy: %d cached (%s), expected %d locally" %
                  (sid, cached(r2), by_tier(r2), full_blocks(r1)))
    finally:
        hp.kill()
        hp.wait()
        log.close()


def main():
    build = build_arg(__doc__, MODEL)
    if not redis_cluster.have_redis():
        print("skip: redis-server / redis-cli not installed")
        return 77 if not os.environ.get("KVT_TEST_STRICT") else 1
    tmp = tempfile.mkdtemp(prefix="kvt_remote_")
    nodes = []
    cl = None
    t0 = time.time()

    def on_signal(sig, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        cl = redis_cluster.RedisCluster(3)
        secret = os.path.join(tmp, "secret")
        with open(secret, "wb") as f:
            f.write(os.urandom(32))
        os.chmod(secret, 0o600)
        a = node(build, tmp, "a", cl.seeds(), secret)
        b = node(build, tmp, "b", cl.seeds(), secret)
        nodes += [a, b]
        a.start()
        b.start()
        print("setup: %.1f s" % (time.time() - t0), flush=True)

        # crossnode: turn 1 on A, turn 2 on B from remote, same reply as on A
        t = time.time()
        m = conversation("the sea")
        r1 = chat(a, m, session="s1")
        drain(a)
        m2 = m + [{"role": "assistant", "content": reply(r1)},
                  {"role": "user", "content": "Now the same about mountains, please."}]
        rb = chat(b, m2, session="s1")
        want = full_blocks(r1)
        check(want >= 2 * BT, "turn 1 spans at least two blocks (%d tokens)" % want)
        check(by_tier(rb)["remote"] == want and cached(rb) == want,
              "turn 2 on B: %d cached, by tier %s; expected %d from remote" % (cached(rb), by_tier(rb), want))
        ra = chat(a, m2, session="s1")
        check(reply(ra) == reply(rb), "turn 2 on B says what A says:\nA %r\nB %r" % (reply(ra), reply(rb)))
        sb = stats(b)
        rt = [x for x in sb.get("tiers", []) if x["name"] == "remote"]
        check(rt and rt[0]["hits"] * BT >= want, "B's remote tier counts its hits: %s" % rt)
        check(sb.get("engine", {}).get("cached_tokens_by_tier", {}).get("remote") == want,
              "B's engine counts the remote tokens: %s" % sb.get("engine"))
        st, met = http("GET", b.url + "/metrics")
        check(st == 200 and 'kvtier_tier_hits_total{tier="remote"}' in met and "kvtier_remote_round_seconds_bucket" in met,
              "metrics have the remote tier")
        print("crossnode: %.1f s" % (time.time() - t), flush=True)

        # tenants: another tenant on B, the same conversation: nothing cached, nothing from remote
        t = time.time()
        ro = chat(b, m2, user="othertenant")
        check(cached(ro) == 0 and by_tier(ro)["remote"] == 0,
              "another tenant got %d cached tokens (%s)" % (cached(ro), by_tier(ro)))
        print("tenants: %.1f s" % (time.time() - t), flush=True)

        # chunks: A's chunk blocks reach B through T3, and damaged ones are refused there
        t = time.time()
        chunks_case(cl, a, b)
        print("chunks: %.1f s" % (time.time() - t), flush=True)

        # corrupt: damage the values of a new conversation's blocks; B detects, recomputes, answers as A
        t = time.time()
        before = block_keys(cl)
        mc = conversation("old clocks")
        rc1 = chat(a, mc, session="s3")
        drain(a)
        new = block_keys(cl) - before
        check(len(new) >= 2, "A wrote the conversation's blocks to T3: %d keys" % len(new))
        for k in new:  # one byte in each payload, past the 1280-byte header
            port = [p for p in cl.procs if redis_cluster.cli(p, "EXISTS", k) == "1"]
            if port:
                redis_cluster.cli(port[0], "SETRANGE", k, "5000", "X")
        c0 = (stats(b).get("remote") or {}).get("corrupt", 0)
        mc2 = mc + [{"role": "assistant", "content": reply(rc1)}, {"role": "user", "content": "And pocket watches?"}]
        rbc = chat(b, mc2, session="s3")
        c1 = (stats(b).get("remote") or {}).get("corrupt", 0)
        check(c1 > c0, "B counted the corrupt records: %d -> %d" % (c0, c1))
        check(by_tier(rbc)["remote"] == 0, "nothing served from the corrupt records: %s" % by_tier(rbc))
        rac = chat(a, mc2, session="s3")
        check(reply(rac) == reply(rbc), "recomputed on B, the same reply as A:\nA %r\nB %r" % (reply(rac), reply(rbc)))
        print("corrupt: %.1f s" % (time.time() - t), flush=True)

        # haproxy: configs/two-node/haproxy.cfg in front of A and B keeps each session on one node
        if shutil.which("haproxy"):
            t = time.time()
            haproxy_case(tmp, a, b)
            print("haproxy: %.1f s" % (time.time() - t), flush=True)
        else:
            print("haproxy: not installed, case not run", flush=True)

        # references for the failover (on A, written to T3)
        refs = []
        for topic in ("volcanoes", "bees", "trains"):
            mm = conversation(topic)
            mm = mm + [{"role": "assistant", "content": reply(chat(a, mm))},
                       {"role": "user", "content": "One more sentence, please."}]
            refs.append((mm, reply(chat(a, mm))))
        drain(a)

        # resume: A killed; the session continues on B
        t = time.time()
        mr = conversation("deserts")
        rr = chat(a, mr, session="s2")
        drain(a)
        a.stop(signal.SIGKILL)
        p = subprocess.run([os.path.join(build, "kvtier"), "resume", "s2", "--url", b.url, "--json"],
                           capture_output=True, text=True, timeout=120)
        check(p.returncode == 0, "kvtier resume on B: exit %d: %s" % (p.returncode, p.stderr))
        done = [json.loads(x) for x in p.stdout.splitlines() if x.strip() and '"done"' in x]
        want = full_blocks(rr)
        if check(len(done) == 1, "resume printed a final report: %s" % p.stdout):
            rep = done[0]
            check(rep.get("session_from_remote") is True, "the session came from T3: %s" % rep)
            # the conversations share their first blocks (the template and the question's start): B has those
            check(sum(rep["restored_tokens"].values()) == want and rep["restored_tokens"]["remote"] >= BT,
                  "resume restored %s, expected %d tokens, the ones B lacked from remote"
                  % (rep["restored_tokens"], want))
        mr2 = mr + [{"role": "assistant", "content": reply(rr)}, {"role": "user", "content": "What lives there?"}]
        rb2 = chat(b, mr2, session="s2")
        check(cached(rb2) == want and by_tier(rb2)["remote"] == 0,
              "after the resume the turn is served locally: %d cached, %s" % (cached(rb2), by_tier(rb2)))
        print("resume: %.1f s" % (time.time() - t), flush=True)

        # failover: a master dies while B serves; 0 failed requests, the same replies
        t = time.time()
        victim = cl.ports[1]
        n_fail = 0
        got = []
        for i, (mm, ref) in enumerate(refs):
            if i == 1:
                cl.kill(victim)
            try:
                got.append(reply(chat(b, mm)))
            except Exception as e:  # noqa: BLE001 - a failed request is what this case counts
                n_fail += 1
                print("request failed:", e)
            if i == 1:
                # B is degraded once it has sent something to the dead master (a lookup or a
                # write of a key in its slots), and for 2 s after each failure. That need not
                # have happened by the time a turn is answered (its end-of-turn writes go
                # later), so new turns keep traffic going until every view showed it.
                seen = {"stats": None, "metrics": False, "health": None}
                deadline = time.time() + 30
                k = 0
                while time.time() < deadline and not all(seen.values()):
                    sb = stats(b)
                    if (sb.get("remote") or {}).get("degraded") is True:
                        seen["stats"] = sb.get("remote")
                    st, met = http("GET", b.url + "/metrics")
                    seen["metrics"] = seen["metrics"] or 'kvtier_tier_degraded{tier="remote"} 1' in met
                    st, h = http("GET", b.url + "/health")
                    if st == 200 and "remote" in (h.get("degraded") or []):
                        seen["health"] = h
                    if not all(seen.values()):
                        k += 1
                        try:  # a fresh conversation: its blocks are looked up in, and written to, T3
                            chat(b, conversation("topic %d of the failover" % k), session="fo%d" % k)
                        except Exception as e:  # noqa: BLE001 - counted like the others
                            n_fail += 1
                            print("request failed:", e)
                check(seen["stats"] is not None, "T3 degraded after the kill (stats): %s" % sb.get("remote"))
                check(seen["metrics"], "metrics say remote degraded")
                check(seen["health"] is not None, "/health names remote: %s" % h)
                print("failover: degraded seen in stats, metrics and /health after %d more turns" % k)
        check(n_fail == 0, "%d requests failed with a master down" % n_fail)
        check(got == [ref for _, ref in refs], "replies with a master down equal A's:\n%r\n%r" % (got, [x for _, x in refs]))
        # the master comes back (no data: no persistence); B's writes resume
        cl._start(victim)
        cl.wait_ok()
        w0 = (stats(b).get("remote") or {}).get("writes", 0)
        chat(b, conversation("rivers"), session="s4")
        drain(b, timeout=20)
        w1 = (stats(b).get("remote") or {}).get("writes", 0)
        check(w1 > w0, "writes resumed after the master came back: %d -> %d" % (w0, w1))
        print("failover: %.1f s" % (time.time() - t), flush=True)
    except KeyboardInterrupt:
        check(False, "interrupted")
    except Exception as e:  # a crash is a failure
        check(False, "%s: %s" % (type(e).__name__, e))
    finally:
        for d in nodes:
            try:
                d.stop(signal.SIGKILL)
            except Exception:  # noqa: BLE001
                pass
        if cl:
            cl.stop()
        if FAILS:
            for d in nodes:
                print("---- %s (tail)" % d.log)
                print(d._log()[-2000:])
        shutil.rmtree(tmp, ignore_errors=True)
    print("test_remote_daemon: %d failure(s), %.1f s" % (len(FAILS), time.time() - t0))
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
