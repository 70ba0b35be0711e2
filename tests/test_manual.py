#!/usr/bin/env python3
# ctest-labels: unit
"""tests/test_manual.py — the documentation cannot drift from the code.

docs/manual.toml is the one source of the man pages, both --help texts and the
documented configuration (cmake/gen_manual.py). This test holds the rest of the
tree to it:
  - configs/kvtier.conf is exactly the generated one (tests/test_config.c holds that
    file to the parser's key table, so the manual's keys and defaults are the parser's);
  - every kvtier command's usage line(s), as the binary prints them for `--help`
    (some are written by hand in engine/cli), equal the manual's synopsis;
  - every option the manual gives kvtierd is accepted by kvtierd, and every option
    string in kvtierd's main is in the manual;
  - every numeric key's documented range is the parser's, and is what it says: both
    ends accepted by `kvtierd --check-config`, just beyond either end refused (the
    cases are generated from the manual's own text, cross-key bounds included);
  - both binaries' --version name the project version, a commit and the backends;
  - the man pages format without a groff warning (when groff is installed).

usage: test_manual.py SOURCE_DIR BUILD_DIR
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

SRC, BUILD = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
GEN = [sys.executable, os.path.join(SRC, "cmake", "gen_manual.py"), "--source", os.path.join(SRC, "docs", "manual.toml")]
FAILS = []


def check(cond, what):
    if not cond:
        FAILS.append(what)
        print("FAIL:", what, flush=True)
    return cond


def run(argv, **kw):
    env = dict(os.environ)
    env.pop("KVTIER_CONFIG", None)
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=60, **kw)
    return p.returncode, p.stdout


def norm(s):
    return " ".join(s.split())


def usage_lines(text, cmd):
    """The logical usage lines of `kvtier CMD` in a --help text (continuations joined)."""
    logical = []
    for line in text.split("\n"):
        t = line.strip()
        if t.startswith("usage:"):
            t = t[len("usage:"):].strip()
        if not t:
            continue
        if t.startswith("[") and logical:
            logical[-1] += " " + t
        else:
            logical.append(t)
    return [norm(l) for l in logical if l == "kvtier " + cmd or l.startswith("kvtier " + cmd + " ")]


def test_conf(tmp):
    out = os.path.join(tmp, "kvtier.conf")
    rc, text = run(GEN + ["--conf", out])
    check(rc == 0, "gen_manual --conf: " + text)
    with open(out) as f:
        want = f.read()
    with open(os.path.join(SRC, "configs", "kvtier.conf")) as f:
        have = f.read()
    if not check(have == want, "configs/kvtier.conf differs from the one docs/manual.toml generates "
                 "(regenerate: python3 cmake/gen_manual.py --conf configs/kvtier.conf)"):
        import difflib
        sys.stdout.writelines(difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                                   "configs/kvtier.conf", "generated"))


def test_synopses():
    rc, text = run(GEN + ["--synopsis"])
    check(rc == 0, "gen_manual --synopsis")
    by_cmd = {}
    for line in text.split("\n"):
        if line:
            by_cmd.setdefault(line.split()[1], []).append(norm(line))
    check(len(by_cmd) >= 7, "only %d commands in the manual" % len(by_cmd))
    kvtier = os.path.join(BUILD, "kvtier")
    for cmd, want in by_cmd.items():
        rc, out = run([kvtier, cmd, "--help"])
        check(rc == 0, "kvtier %s --help: exit %d" % (cmd, rc))
        got = usage_lines(out, cmd)
        check(sorted(got) == sorted(want), "kvtier %s --help prints\n  %s\nbut docs/manual.toml says\n  %s"
              % (cmd, "\n  ".join(got) or "(no usage line)", "\n  ".join(want)))


def test_kvtierd_options(tmp):
    import tomllib
    with open(os.path.join(SRC, "docs", "manual.toml"), "rb") as f:
        m = tomllib.load(f)
    kvtierd = os.path.join(BUILD, "kvtierd")
    conf = os.path.join(tmp, "k.conf")
    with open(conf, "w") as f:
        f.write("[tier.nvme]\ncapacity = 64M\n")
    sample = {"FILE": conf, "HOST:PORT": "127.0.0.1:0", "DIR": os.path.join(tmp, "data"), "PATH": "m.gguf"}
    documented = set()
    for o in m["kvtierd"]["option"]:
        for alt in o["flags"].split(", "):
            flag, _, arg = alt.partition(" ")
            documented.add(flag)
            if flag in ("--check-config", "--print-config", "--version", "-h", "--help"):
                argv = [kvtierd, flag]
            else:
                argv = [kvtierd, flag, sample.get(arg, arg.split("|")[0]), "--check-config"]
            rc, out = run(argv, cwd=tmp)
            check(rc == 0, "kvtierd does not take the documented %s: %s -> %d %s" % (alt, argv[1:], rc, out[-300:]))
    rc, out = run([kvtierd, "--no-such-option", "x"], cwd=tmp)
    check(rc == 64, "kvtierd took an unknown option (exit %d)" % rc)
    with open(os.path.join(SRC, "engine", "serve", "kvtierd_main.c")) as f:
        in_code = set(re.findall(r'"(--?[a-z][a-z-]*)"', f.read()))
    missing = sorted(in_code - documented)
    check(not missing, "kvtierd_main.c takes options docs/manual.toml does not document: %s" % missing)


SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
NUM = r"-?\d[\d.]*[KMGTP]?"


def fmt(v):
    """A number as a config value, exactly (no rounding to 6 digits as %g would)."""
    return ("%.6f" % v).rstrip("0").rstrip(".") if isinstance(v, float) else str(v)


def num(text):
    """A documented number: '64', '0.5', '1K', '1P' (sizes in powers of 1024)."""
    m = re.fullmatch(r"(-?[\d.]+)([KMGTP]?)", text)
    v = float(m.group(1)) * SUFFIX[m.group(2)]
    return int(v) if v == int(v) else v


def documented_ranges(m):
    """{(section, key): range} for every key whose doc (or man) text gives a range "[> ]LO .. HI".

    A range is a dict: lo, hi (numbers, the spelling kept in lo_text / hi_text), lo_open ("> LO"),
    hi_key (HI names another key of the section: its top), below (the value must stay below that
    key), at_most (another key that must be at least this one), zero_or ("0 (...) or LO .. HI")."""
    out = {}
    for sec in m["conf"]["section"]:
        keys = {k["name"]: k for k in sec.get("key", [])}
        for name, k in keys.items():
            text = " ".join((k.get("doc") or k.get("man") or "").split())
            r = re.search(r"(> ?)?(%s) ?\.\. ?(%s|[a-z_]+)\b" % (NUM, NUM), text)
            if not r:
                continue
            rng = {"lo_open": bool(r.group(1)), "lo_text": r.group(2), "lo": num(r.group(2)),
                   "hi_text": r.group(3), "hi_key": None, "below": None, "at_most": None,
                   "zero_or": bool(re.search(r"\b0 \([^)]*\) or $", text[:r.start()]))}
            if r.group(3) in keys:
                rng["hi_key"] = r.group(3)
            else:
                rng["hi"] = num(r.group(3))
            for rel in ("below", "at_most"):
                b = re.search(r"\b%s ([a-z_]+)" % rel.replace("_", " "), text)
                if b and b.group(1) in keys:
                    rng[rel] = b.group(1)
            out[(sec["name"], name)] = rng
    for (sec, name), rng in out.items():  # "1..max_tokens_limit": that key's top
        if rng["hi_key"]:
            other = out.get((sec, rng["hi_key"]))
            rng["hi"], rng["hi_text"] = (other["hi"], other["hi_text"]) if other else (None, None)
    return out


def test_ranges(tmp):
    """Each documented range is the parser's, its ends are accepted and just beyond them refused."""
    import tomllib
    with open(os.path.join(SRC, "docs", "manual.toml"), "rb") as f:
        m = tomllib.load(f)
    kvtierd = os.path.join(BUILD, "kvtierd")
    conf = os.path.join(tmp, "range.conf")

    def check_config(sec, values):
        with open(conf, "w") as f:
            f.write("[%s]\n%s" % (sec, "".join("%s = %s\n" % kv for kv in values.items())))
        return run([kvtierd, "--check-config", "-c", conf], cwd=tmp)

    ranges = documented_ranges(m)
    n_cases = 0
    for sec in m["conf"]["section"]:
        for k in sec.get("key", []):
            key = (sec["name"], k["name"])
            # the parser's range, as its error for a value that is no number states it
            rc, out = check_config(sec["name"], {k["name"]: "x!"})
            p = re.search(r"allowed: (?:\"auto\", or )?(?:bytes )?(> )?(%s) \.\. (%s)\b" % (NUM, NUM), out)
            if not p:
                continue
            rng = ranges.get(key)
            if not check(rng is not None, "[%s] %s: the parser takes %s%s .. %s, the manual gives no range"
                         % (key + (p.group(1) or "", p.group(2), p.group(3)))):
                continue
            lo = 0 if rng["zero_or"] else rng["lo"]
            check((bool(p.group(1)), num(p.group(2)), num(p.group(3))) == (rng["lo_open"], lo, rng["hi"]),
                  "[%s] %s: the manual says %s%s .. %s, the parser %s%s .. %s"
                  % (key + ("> " if rng["lo_open"] else "", rng["lo_text"], rng["hi_text"])
                     + (p.group(1) or "", p.group(2), p.group(3))))
            sizes = "bytes" in out
            step = 1 if sizes or re.search(r"not a whole number", out) else 0.001
            # the keys the manual ties this one to, at their top for this key's top (its hi_key, at_most,
            # below) and at their bottom for its bottom (those whose hi_key, at_most or below it is)
            top, bottom = {}, {}
            for rel in ("hi_key", "at_most", "below"):
                if rng[rel]:
                    top[rng[rel]] = ranges[(sec["name"], rng[rel])]["hi_text"]
                for (s2, other), r2 in ranges.items():
                    if s2 == sec["name"] and r2[rel] == k["name"]:
                        bottom[other] = r2["lo_text"] if not r2["lo_open"] else fmt(r2["lo"] + step)
            cases = []  # (value, other keys, accepted?)
            if rng["lo_open"]:
                cases += [(rng["lo_text"], bottom, False), (fmt(rng["lo"] + step), bottom, True)]
            else:
                cases += [(rng["lo_text"], bottom, True), (fmt(rng["lo"] - step), bottom, False)]
            if rng["zero_or"]:
                cases += [("0", {}, True)]
            if rng["below"]:
                cases += [(rng["hi_text"], top, False), (fmt(rng["hi"] - step), top, True)]
            else:
                cases += [(rng["hi_text"], top, True)]
            cases += [(fmt(rng["hi"] + step), top, False)]
            for value, others, want in cases:
                n_cases += 1
                rc, out = check_config(sec["name"], dict(others, **{k["name"]: value}))
                check((rc == 0) == want, "[%s] %s = %s (with %s): %s, but docs/manual.toml documents it %s: %s"
                      % (key + (value, others or "the defaults", "accepted" if rc == 0 else "refused",
                                "in range" if want else "out of range", out.strip()[-300:])))
    check(n_cases > 150, "only %d range cases were generated from the manual" % n_cases)
    print("ranges: %d cases from %d documented ranges" % (n_cases, len(ranges)))


def test_version():
    with open(os.path.join(SRC, "CMakeLists.txt")) as f:
        version = re.search(r"project\(kvtier VERSION ([0-9.]+)", f.read()).group(1)
    for exe in ("kvtierd", "kvtier"):
        rc, out = run([os.path.join(BUILD, exe), "--version"])
        check(rc == 0, "%s --version: exit %d" % (exe, rc))
        check(out.startswith("%s %s\n" % (exe, version)), "%s --version: %r" % (exe, out))
        check(re.search(r"^commit: ([0-9a-f]{7,}(-dirty)?|unknown)$", out, re.M), "%s --version: no commit: %r" % (exe, out))
        check(re.search(r"^build: \S+ \(KVT_CUDA=", out, re.M), "%s --version: no build options: %r" % (exe, out))
        check(re.search(r"^backends: cpu( cuda)?$", out, re.M), "%s --version: no backends: %r" % (exe, out))


def test_man_pages(tmp):
    rc, out = run(GEN + ["--outdir", tmp, "--version", "0"])
    check(rc == 0, "gen_manual --outdir: " + out)
    groff = shutil.which("groff")
    for page in ("kvtierd.8", "kvtier.1", "kvtier.conf.5"):
        path = os.path.join(tmp, page)
        check(os.path.getsize(path) > 1000, page + " is nearly empty")
        if not groff:
            continue
        p = subprocess.run([groff, "-man", "-ww", "-z", "-Tutf8", path], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
        check(p.returncode == 0 and not p.stderr.strip(), "groff warns about %s: %s" % (page, p.stderr))
    if not groff:
        print("note: no groff, man pages not formatted")


def main():
    with tempfile.TemporaryDirectory(prefix="kvt-manual-") as tmp:
        test_conf(tmp)
        test_synopses()
        test_kvtierd_options(tmp)
        test_ranges(tmp)
        test_version()
        test_man_pages(tmp)
    if FAILS:
        print("%d check(s) failed" % len(FAILS))
        return 1
    print("test_manual: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
