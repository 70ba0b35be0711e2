#!/usr/bin/env python3
"""tests/daemon/test_retention.py — retention end to end, on the default model.

Each case starts the real kvtierd on an ephemeral loopback port with its own
data dir (small tiers) and talks to it over HTTP:

  wire       cache_control on a system content part, on a message, at the
             top of a completions body, prompt_cache_retention "24h",
             prompt_cache_key: usage.kvtier reports the tokens written to and
             read from retained cache; bad values are 400s naming the field
  quota      two tenants (API keys), [tenants] retain_quota: alice asks for
             more than her quota and gets the prefix that fits (usage says
             partial); her next prompt pushes out her own older retention,
             never bob's; /v1/stats shows both tenants' numbers
  restart    a retained prompt survives a restart (its deadline is in the
             index): /v1/stats counts it, and it is served from cache after
             a flood of other prompts; deleting its session ends retention
  dashboard  GET /dashboard is behind the admin key; loaded in headless
             Debian chromium against the live daemon, the DOM shows the
             numbers /v1/stats reports (tiers, tenants, sessions, why prompts
             missed the cache); a screenshot is kept (path printed)

Usage: test_retention.py BUILD_DIR [CASE ...]. Exit 0 pass, 1 fail, 77 skip
(no model). The dashboard case needs `chromium` (scripts/install_deps.sh);
without it that case is skipped unless KVT_TEST_STRICT=1.
"""
import html.parser
import json
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kvtierd_proc import SKIPS, Daemon, check, http, run_cases  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
BT = 16
HOST_BLOCK = 207360  # an int8kv host record of SmolLM2-135M ([tier.host] dtype's default; kvtier size): what a retained block counts
SYSTEM = ("You are a careful assistant who answers questions about oceans, rivers, lakes, "
          "mountains and forests in plain, short words. ") * 4


def daemon(build, data_dir, server="", extra=""):
    return Daemon(build, data_dir,
                  "[server]\nlisten = 127.0.0.1:0\n%s[model]\npath = %s\ndevice = cpu\ncontext = 2048\n"
                  "[tier.hbm]\ncapacity = 64M\n[tier.host]\ncapacity = 64M\n[tier.nvme]\ncapacity = 64M\n"
                  "[index]\ndata_dir = @DATA@\n%s" % (server, MODEL, extra))


def post(d, path, body, key=None):
    return http("POST", d.url + path, body, {"Authorization": "Bearer " + key} if key else {})


def ok(d, path, body, key=None):
    st, r = post(d, path, body, key)
    if not check(st == 200, "%s: status %s: %s" % (path, st, r)):
        raise RuntimeError("request failed")
    return r["usage"]


def sys_chat(user_text, cc=None, on="part", **extra):
    """A chat body whose system prompt carries cache_control on its content part or the message."""
    part = {"type": "text", "text": SYSTEM}
    msg = {"role": "system", "content": [part]}
    if cc is not None:
        (part if on == "part" else msg)["cache_control"] = cc
    body = {"messages": [msg, {"role": "user", "content": user_text}], "max_tokens": 2, "temperature": 0}
    body.update(extra)
    return body


def stats(d, key=None):
    st, r = http("GET", d.url + "/v1/stats", None, {"Authorization": "Bearer " + key} if key else {})
    check(st == 200, "/v1/stats: %s" % st)
    return r


def tenant_of(st, name):
    for t in st["retention"]["tenants"]:
        if t["tenant"] == name:
            return t
    return None


def case_wire(build, tmp):
    d = daemon(build, os.path.join(tmp, "d"))
    d.start()
    try:
        eph = {"type": "ephemeral"}
        u1 = ok(d, "/v1/chat/completions", sys_chat("Name a fish.", eph, prompt_cache_key="team-a"))
        k1 = u1["kvtier"]
        created = k1["cache_creation_input_tokens"]
        # the breakpoint is the end of the system part: its full blocks, well short of the whole prompt
        check(created > 0 and created % BT == 0 and created < u1["prompt_tokens"] - BT,
              "system part retained: %s" % k1)
        check(k1["cache_read_input_tokens"] == 0, "first request reads no retained cache: %s" % k1)
        check(k1["retention"] == {"requested_tokens": created, "retained_tokens": created, "denied_tokens": 0,
                                  "partial": False}, "retention block: %s" % k1.get("retention"))
        check(k1.get("prompt_cache_key") == "team-a", "prompt_cache_key echoed: %s" % k1)
        # another question under the same system prompt: its retained prefix is read, nothing new is written
        u2 = ok(d, "/v1/chat/completions", sys_chat("Name a bird.", {"type": "ephemeral", "ttl": "1h"}))
        k2 = u2["kvtier"]
        check(u2["prompt_tokens_details"]["cached_tokens"] >= created, "cached: %s" % u2)
        check(k2["cache_read_input_tokens"] == created, "read %d, want %d" % (k2["cache_read_input_tokens"], created))
        check(k2["cache_creation_input_tokens"] == 0, "nothing new written: %s" % k2)
        # on the message instead of the part: the same prefix plus the template's end of the message
        u3 = ok(d, "/v1/chat/completions", sys_chat("Name a tree.", eph, on="message"))
        check(u3["kvtier"]["retention"]["requested_tokens"] >= created, "message breakpoint: %s" % u3["kvtier"])
        # no cache control: normal caching, nothing retained or reported as read from retention
        u4 = ok(d, "/v1/chat/completions", sys_chat("Name a flower."))
        check("retention" not in u4["kvtier"] and u4["kvtier"]["cache_creation_input_tokens"] == 0,
              "no cache control: %s" % u4["kvtier"])
        # completions: top-level cache_control (the last prompt element), and prompt_cache_retention 24h
        prompt = "Rivers carry water from the hills to the sea, " * 8
        c1 = ok(d, "/v1/completions", {"prompt": prompt, "max_tokens": 2, "cache_control": eph})
        check(c1["kvtier"]["cache_creation_input_tokens"] == c1["prompt_tokens"] // BT * BT,
              "completions: the whole prompt's full blocks: %s" % c1)
        c2 = ok(d, "/v1/completions", {"prompt": "Lakes are calm. " * 10, "max_tokens": 2,
                                        "prompt_cache_retention": "24h"})
        check(c2["kvtier"]["cache_creation_input_tokens"] == c2["prompt_tokens"] // BT * BT, "24h: %s" % c2)
        ok(d, "/v1/completions", {"prompt": "x", "max_tokens": 1, "prompt_cache_retention": "in_memory"})
        st = stats(d)
        r = st["retention"]
        check(r["tiers"][2]["floor_blocks"] == c2["prompt_tokens"] // BT, "24h blocks have the nvme floor: %s" % r)
        check(r["blocks"] == sum(t["blocks"] for t in r["tenants"]), "totals add up: %s" % r)
        # bad values: 400, naming the field
        bad = [
            (sys_chat("a", {"type": "persistent"}), "messages[0].content[0].cache_control"),
            (sys_chat("a", {"type": "ephemeral", "ttl": "2h"}), "messages[0].content[0].cache_control"),
            (sys_chat("a", {"type": "ephemeral", "scope": "x"}), "messages[0].content[0].cache_control"),
            (sys_chat("a", "yes", on="message"), "messages[0].cache_control"),
            (sys_chat("a", None, prompt_cache_retention="forever"), "prompt_cache_retention"),
            (sys_chat("a", None, prompt_cache_key=7), "prompt_cache_key"),
            (sys_chat("a", None, prompt_cache_key="k" * 300), "prompt_cache_key"),
        ]
        for body, param in bad:
            s, e = post(d, "/v1/chat/completions", body)
            check(s == 400 and isinstance(e, dict) and e.get("error", {}).get("param") == param,
                  "bad %s: %s %s" % (param, s, e))
        s, e = post(d, "/v1/completions", {"prompt": "a b c", "cache_control": {"type": "ephemeral", "ttl": 5}})
        check(s == 400 and e["error"]["param"] == "cache_control", "completions bad ttl: %s %s" % (s, e))
        check(http("GET", d.url + "/health")[0] == 200, "still serving")
    finally:
        d.stop()


def case_quota(build, tmp):
    # alice may retain 3 host blocks, everyone else 64
    d = daemon(build, os.path.join(tmp, "d"), server="api_keys = alice:key-a, bob:key-b\nadmin_keys = ops:key-o\n",
               extra="[tenants]\nretain_quota = \"alice:%d, *:%d\"\n" % (3 * HOST_BLOCK, 64 * HOST_BLOCK))
    d.start()
    try:
        eph = {"type": "ephemeral", "ttl": "1h"}
        p1 = "Alice's first document: the tide rises and falls twice a day. " * 5
        ub = ok(d, "/v1/completions", {"prompt": "Bob's notes: the wind turns at noon. " * 6, "max_tokens": 1,
                                       "cache_control": eph}, key="key-b")
        bob_blocks = ub["kvtier"]["cache_creation_input_tokens"] // BT
        check(bob_blocks >= 3, "bob retains his prompt: %s" % ub["kvtier"])
        ua = ok(d, "/v1/completions", {"prompt": p1, "max_tokens": 1, "cache_control": eph}, key="key-a")
        ra = ua["kvtier"]["retention"]
        check(ra["partial"] and ra["retained_tokens"] == 3 * BT and ra["denied_tokens"] == ra["requested_tokens"] - 3 * BT,
              "alice over quota: the prefix that fits: %s" % ra)
        check(ua["kvtier"]["cache_creation_input_tokens"] == 3 * BT, "alice wrote 3 blocks: %s" % ua["kvtier"])
        time.sleep(1.1)  # a later deadline for the next retention
        p2 = "Alice's second document, unrelated: glaciers move slowly down valleys. " * 4
        ua2 = ok(d, "/v1/completions", {"prompt": p2, "max_tokens": 1, "cache_control": eph}, key="key-a")
        check(ua2["kvtier"]["retention"]["retained_tokens"] == 3 * BT, "alice's newer prompt: %s" % ua2["kvtier"])
        st = stats(d, "key-o")
        a, b = tenant_of(st, "alice"), tenant_of(st, "bob")
        check(a and a["bytes"] == 3 * HOST_BLOCK and a["quota_bytes"] == 3 * HOST_BLOCK and a["quota_released"] == 3,
              "alice's own oldest retention made room: %s" % a)
        check(b and b["blocks"] == bob_blocks and b["quota_released"] == 0 and b["quota_bytes"] == 64 * HOST_BLOCK,
              "bob untouched: %s" % b)
        # a tenant key sees only its own retention
        sb = stats(d, "key-b")
        check([t["tenant"] for t in sb["retention"]["tenants"]] == ["bob"], "tenant view: %s" % sb.get("retention"))
        # alice's first document is no longer retained: a re-read finds it cached but not retained
        ua3 = ok(d, "/v1/completions", {"prompt": p1, "max_tokens": 1}, key="key-a")
        check(ua3["kvtier"]["cache_read_input_tokens"] == 0, "released blocks are not read as retained: %s" % ua3)
    finally:
        d.stop()


def kvtier(build, *args):
    p = subprocess.run([os.path.join(build, "kvtier")] + list(args), capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, "kvtier %s: exit %d: %s" % (" ".join(args), p.returncode, p.stderr))
    return p.stdout


def case_restart(build, tmp):
    # small tiers (T2 too) so a flood of prompts pushes everything unretained out of the cache
    # (T2: 32M, as 8M was for fp8 records: f16 records, [tier.nvme] dtype's default, are twice the size,
    # and the shutdown flush must find room for the last turns beside the flood)
    d = Daemon(build, os.path.join(tmp, "d"),
               "[server]\nlisten = 127.0.0.1:0\n[model]\npath = %s\ndevice = cpu\ncontext = 1024\n"
               "[tier.hbm]\ncapacity = 24M\n[tier.host]\ncapacity = 8M\n[tier.nvme]\ncapacity = 32M\n"
               "[index]\ndata_dir = @DATA@\n" % MODEL)
    d.start()
    try:
        keep = "A document the team queries all day: " + "the archive holds maps of every harbour. " * 10
        body = {"messages": [{"role": "user", "content": [{"type": "text", "text": keep,
                                                            "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}],
                "max_tokens": 2, "temperature": 0, "session_id": "keep"}
        u = ok(d, "/v1/chat/completions", body)
        n_ret = u["kvtier"]["cache_creation_input_tokens"] // BT
        check(n_ret >= 4, "retained: %s" % u["kvtier"])
        before = stats(d)["retention"]
    finally:
        d.stop()
    d.start()
    try:
        after = stats(d)["retention"]
        check(after["blocks"] == before["blocks"] == n_ret, "retention survives the restart: %s vs %s" % (before, after))
        check(after["tenants"] and after["tenants"][0]["tenant"] == "default", "tenant kept: %s" % after)
        # kvtier stats: the retained row per tier, and the tenant table with --tenants
        out = kvtier(build, "stats", "--url", d.url, "--tenants")
        line = [l for l in out.splitlines() if l.strip().startswith("retained")]
        check(line and line[0].split()[1] == "0," and ("%d," % n_ret) in line[0],
              "kvtier stats: retained row %s" % line)
        rows = [l.split() for l in out.splitlines() if l.strip().startswith("default ")]
        check(rows and rows[0][1] == str(n_ret), "kvtier stats --tenants: %s" % out)
        check("retention: %d blocks" % n_ret in out, "kvtier stats: retention line: %s" % out)
        # a flood of other prompts, then the retained one: all of it is still cached
        for i in range(12):
            ok(d, "/v1/completions", {"prompt": ("Flood prompt %d: " % i) + "waves, sand and shells. " * 25,
                                      "max_tokens": 1})
        st = stats(d)
        check(st["tiers"][2]["evictions"] > 0, "the flood evicted from every tier: %s" % st["tiers"])
        u = ok(d, "/v1/chat/completions", {k: v for k, v in body.items() if k != "session_id"})
        check(u["prompt_tokens_details"]["cached_tokens"] >= n_ret * BT, "retained prompt cached after the flood: %s" % u)
        check(u["kvtier"]["cache_read_input_tokens"] == n_ret * BT, "read from retention: %s" % u["kvtier"])
        # deleting the session ends its retention
        st, _ = http("DELETE", d.url + "/v1/sessions/keep")
        check(st == 200, "delete session: %s" % st)
        r = stats(d)["retention"]
        check(r["blocks"] == 0 and r["tenants"][0]["released"] == n_ret, "released with the session: %s" % r)
        # a fresh retention, read back offline from the index of the stopped daemon
        u = ok(d, "/v1/completions", {"prompt": keep, "max_tokens": 1, "cache_control": {"type": "ephemeral"}})
        n2 = u["kvtier"]["cache_creation_input_tokens"] // BT
    finally:
        d.stop()
    out = json.loads(kvtier(build, "stats", "--offline", "--data-dir", d.data_dir, "--json"))
    check(out["retention"]["blocks"] == n2 > 0 and out["retention"]["tenants"][0]["tenant"] == "default",
          "kvtier stats --offline: retention %s, want %d blocks" % (out.get("retention"), n2))


class DomValues(html.parser.HTMLParser):
    """Collect the data-value of every element with an id, and of the cells of rows with an id."""

    def __init__(self):
        super().__init__()
        self.by_id, self.rows, self.row = {}, {}, None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr" and a.get("id"):
            self.row = a["id"]
            self.rows[self.row] = []
        elif tag == "td" and self.row and "data-value" in a:
            self.rows[self.row].append(a["data-value"])
        if a.get("id") and "data-value" in a:
            self.by_id[a["id"]] = a["data-value"]
        if tag == "body" and "data-polls" in a:
            self.by_id["polls"] = a["data-polls"]

    def handle_endtag(self, tag):
        if tag == "tr":
            self.row = None


def chromium():
    for name in ("chromium", "chromium-browser"):
        p = shutil.which(name)
        if p:
            return p
    return None


def case_dashboard(build, tmp):
    browser = chromium()
    if not browser:
        if os.environ.get("KVT_TEST_STRICT") == "1":
            check(False, "dashboard: no chromium (scripts/install_deps.sh installs it)")
        else:
            print("skip: dashboard: no chromium")
            SKIPS.append("dashboard")
        return
    d = daemon(build, os.path.join(tmp, "d"), server="api_keys = alice:key-a, bob:key-b\nadmin_keys = ops:key-o\n")
    d.start()
    try:
        eph = {"type": "ephemeral"}
        ok(d, "/v1/chat/completions", sys_chat("Name a fish.", eph, session_id="s1"), key="key-a")
        ok(d, "/v1/chat/completions", sys_chat("Name a bird.", eph), key="key-a")
        ok(d, "/v1/completions", {"prompt": "Bob writes about clouds. " * 12, "max_tokens": 2, "cache_control": eph,
                                  "session_id": "s2"}, key="key-b")
        st, page = http("GET", d.url + "/dashboard")
        check(st == 401, "dashboard without a key: %s" % st)
        st, page = http("GET", d.url + "/dashboard?key=key-a")
        check(st == 403, "dashboard with a tenant key: %s" % st)
        st, page = http("GET", d.url + "/dashboard", None, {"Authorization": "Bearer key-o"})
        check(st == 200 and "<canvas" in page, "dashboard with the admin key: %s" % st)
        check("http://" not in page.replace("http://www.w3.org", "") and "https://" not in page and "src=" not in page,
              "the page loads nothing from elsewhere")
        url = d.url + "/dashboard?key=key-o"
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                 "--user-data-dir=" + os.path.join(tmp, "chromium"), "--virtual-time-budget=5000"]
        t0 = time.time()
        dom = subprocess.run([browser] + flags + ["--dump-dom", url], capture_output=True, text=True, timeout=120).stdout
        print("dashboard: chromium --dump-dom in %.1f s" % (time.time() - t0))
        want = stats(d, "key-o")  # idle daemon: the same numbers the page read
        p = DomValues()
        p.feed(dom)
        check(int(p.by_id.get("polls", "0")) >= 1, "the page polled /v1/stats: %s" % p.by_id)
        for i, t in enumerate(want["tiers"]):
            row = p.rows.get("tier-" + t["name"])
            ret = want["retention"]["tiers"][i]["bytes"]
            check(row == [str(t["blocks"]), str(t["used_bytes"]), str(ret)],
                  "tier %s: DOM %s, /v1/stats %s" % (t["name"], row, [t["blocks"], t["used_bytes"], ret]))
        for t in want["retention"]["tenants"]:
            row = p.rows.get("tenant-" + t["tenant"])
            exp = [str(t["blocks"]), str(t["bytes"]), str(t["quota_bytes"]), str(t["denied_blocks"]), str(t["expired"])]
            check(row == exp, "tenant %s: DOM %s, /v1/stats %s" % (t["tenant"], row, exp))
        check(len(want["retention"]["tenants"]) == 2, "two tenants retained: %s" % want["retention"])
        e = want["engine"]
        for k in ("running", "queued", "requests"):
            check(p.by_id.get(k) == str(e[k]), "%s: DOM %s, /v1/stats %s" % (k, p.by_id.get(k), e[k]))
        for k in ("ttft_p50_ms", "ttft_p99_ms"):
            v = p.by_id.get(k.replace("_ms", "").replace("_", "-"))
            check(v is not None and abs(float(v) - e[k]) < 1e-6, "%s: DOM %s, /v1/stats %s" % (k, v, e[k]))
        check(p.by_id.get("n-sessions") == str(want["sessions"]) == "2", "sessions: %s" % p.by_id.get("n-sessions"))
        for s in want["sessions_table"]:
            row = p.rows.get("session-%s-%s" % (s["tenant"], s["id"]))
            check(row and row[0] == str(s["tokens"]), "session %s: DOM %s, /v1/stats %s" % (s["id"], row, s))
        misses = e["misses_by_reason"]
        check(misses["new"] >= 1, "the prompts' misses are counted: %s" % misses)
        for reason, n in misses.items():  # "Why prompts missed the cache"
            row = p.rows.get("miss-" + reason)
            check(row == [str(n)], "misses %s: DOM %s, /v1/stats %s" % (reason, row, n))
        # the screenshot, kept as an artifact of the run
        out_dir = os.path.join(build, "Testing")
        os.makedirs(out_dir, exist_ok=True)
        shot = os.path.join(out_dir, "dashboard.png")
        if os.path.exists(shot):
            os.unlink(shot)
        subprocess.run([browser] + flags + ["--window-size=1400,1000", "--screenshot=" + shot, url],
                       capture_output=True, timeout=120)
        check(os.path.exists(shot) and os.path.getsize(shot) > 10000, "screenshot written")
        print("dashboard: screenshot", shot)
    finally:
        d.stop()


CASES = {"wire": case_wire, "quota": case_quota, "restart": case_restart, "dashboard": case_dashboard}


def main():
    return run_cases("retention", __doc__, MODEL, CASES)


if __name__ == "__main__":
    sys.exit(main())
