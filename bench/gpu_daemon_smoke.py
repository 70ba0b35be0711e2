#!/usr/bin/env python3
"""bench/gpu_daemon_smoke.py BIN_DIR TMP_DIR [DEVICE ...] — kvtierd end to end on each device.

For each device (default: cuda, then cpu) it serves the small synthetic model that
`bench_gpu --synth` writes, and runs one session through three turns of greedy
/v1/completions on token-id prompts, with a SIGTERM and a restart before the third:
  turn 1: 407 tokens; turn 2: turn 1's prompt + 100 tokens, whose cached_tokens
  must be turn 1's full blocks (400); SIGTERM (exit status 0), restart, resume the
  session (tokens restored, fewer than a block missing: the partial tail); turn 3: turn 2's prompt + 50 tokens, cached
  tokens = turn 2's full blocks (496); on cuda the turn's greedy decode steps ran as
  device decode calls (scheduler.device_steps > 0; 0 on cpu).
Then it compares each turn's text across the devices (greedy on the GPU should
pick the CPU's tokens; the parity test checks that bit by bit, this reports it).
Prints one JSON line per device and one for the comparison; exits 1 on any
failed check. The device check (bench/device_check.sh) runs it on the GPU machine
with the binaries it carried; here it runs with `cpu` alone as a dry run.
"""
import json
import os
import shutil
import signal
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "daemon"))
from kvtierd_proc import FAILS, Daemon, check, http  # noqa: E402

BT = 16


def complete(d, prompt):
    st, r = http("POST", d.url + "/v1/completions",
                 {"prompt": prompt, "max_tokens": 24, "temperature": 0, "session_id": "smoke"})
    if not check(st == 200, "completions: status %s: %s" % (st, r)):
        raise RuntimeError("completions failed")
    return r


def cached(r):
    return r["usage"]["prompt_tokens_details"]["cached_tokens"]


def run(bin_dir, tmp, device, model):
    data = os.path.join(tmp, "data-" + device)
    shutil.rmtree(data, ignore_errors=True)
    d = Daemon(bin_dir, data,
               "[server]\nlisten = 127.0.0.1:0\n[model]\npath = %s\ndevice = %s\ncontext = 2048\n"
               "[tier.hbm]\ncapacity = 64M\n[tier.host]\ncapacity = 64M\n[tier.nvme]\ncapacity = 128M\n"
               "[index]\ndata_dir = @DATA@\n" % (model, device))
    p1 = [3 + (i * 13) % 250 for i in range(407)]
    p2 = p1 + [5 + (i * 7) % 240 for i in range(100)]
    p3 = p2 + [9 + (i * 11) % 230 for i in range(50)]
    out = {"bench": "gpu_daemon_smoke", "device": device}
    d.start()
    try:
        st, s = http("GET", d.url + "/v1/stats")
        out["stats_model"] = s.get("model") if st == 200 else st
        r1 = complete(d, p1)
        r2 = complete(d, p2)
        check(cached(r2) == len(p1) // BT * BT, "%s turn 2: cached %d, expected %d" % (device, cached(r2), len(p1) // BT * BT))
    finally:
        rc = d.stop(signal.SIGTERM)
    check(rc == 0, "%s: SIGTERM exit status %d" % (device, rc))
    d.restart()
    try:
        st, res = http("POST", d.url + "/v1/sessions/smoke/resume", {})
        check(st == 200 and sum(res.get("restored_tokens", {}).values()) > 0 and res.get("missing_tokens", BT) < BT,
              "%s resume after restart: %s %s" % (device, st, res))
        r3 = complete(d, p3)
        check(cached(r3) == len(p2) // BT * BT, "%s turn 3: cached %d, expected %d" % (device, cached(r3), len(p2) // BT * BT))
        # greedy decode steps run as one device call (a CUDA graph) on cuda, never on cpu
        st, s = http("GET", d.url + "/v1/stats")
        sched = s.get("scheduler", {}) if st == 200 else {}
        out["steps"], out["device_steps"] = sched.get("steps"), sched.get("device_steps")
        ok = (out["device_steps"] or 0) > 0 if device == "cuda" else out["device_steps"] == 0
        check(ok, "%s: %s of %s scheduler steps ran as device decode calls" % (device, out["device_steps"], out["steps"]))
    finally:
        rc = d.stop(signal.SIGTERM)
    check(rc == 0, "%s: second SIGTERM exit status %d" % (device, rc))
    log = open(d.log).read()
    out.update({"cached": [cached(r1), cached(r2), cached(r3)], "resume": res,
                "texts": [r["choices"][0]["text"] for r in (r1, r2, r3)],
                "ttft_ms": [r["usage"].get("kvtier", {}).get("ttft_ms") for r in (r1, r2, r3)],
                "loaded": [l.split(": ", 1)[-1] for l in log.splitlines() if "model loaded on" in l][:1]})
    print(json.dumps(out), flush=True)
    return out


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    bin_dir, tmp = sys.argv[1], sys.argv[2]
    devices = sys.argv[3:] or ["cuda", "cpu"]
    os.makedirs(tmp, exist_ok=True)
    model = os.path.join(tmp, "smoke_synth.gguf")
    subprocess.run([os.path.join(bin_dir, "bench_gpu"), "--synth", model], check=True)
    runs = []
    for dev in devices:
        try:
            runs.append(run(bin_dir, tmp, dev, model))
        except Exception as e:  # a failed start or request: report and go on to the next device
            check(False, "%s: %s" % (dev, e))
    if len(runs) > 1:
        same = [runs[0]["texts"][i] == runs[1]["texts"][i] for i in range(3)]
        print(json.dumps({"bench": "gpu_daemon_smoke", "compare": [r["device"] for r in runs[:2]],
                          "same_text_per_turn": same}), flush=True)
    print("gpu_daemon_smoke: %d failed checks" % len(FAILS), flush=True)
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
