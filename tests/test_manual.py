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
        test_version()
        test_man_pages(tmp)
    if FAILS:
        print("%d check(s) failed" % len(FAILS))
        return 1
    print("test_manual: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
