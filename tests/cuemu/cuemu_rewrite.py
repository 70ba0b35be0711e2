#!/usr/bin/env python3
"""
tests/cuemu/cuemu_rewrite.py IN OUT [LINE_NAME] — turn a .cu file into C++ the
CPU emulator (tests/cuemu) compiles with the host compiler.

Two rewrites, each kept on its own line so line numbers do not move:
  kernel<targs><<<grid, block[, smem[, stream]]>>>(args)
      -> cuemu::launch(kernel<targs>, "kernel<targs>", grid, block[, ...])(args)
  extern __shared__ T name[];
      -> T *const name = (T *)cuemu::dyn_smem();
  __shared__ T a[N], b;        (static storage under the emulator)
      -> the same, then CUEMU_SHARED_REG(a); CUEMU_SHARED_REG(b);
         (registered for poisoning before every block)
and a `#line 1 "LINE_NAME"` (default: IN) on top, so compiler errors and the
emulator's messages (which use __LINE__) point at the real file.

The launch configuration may hold `->`, `?:`, `<` and parentheses; kernel
template arguments may not nest `<>`. Any `<<<` or `extern __shared__` that
does not match exits non-zero naming the line: nothing is passed through
half-rewritten.
"""
import re
import sys

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_:]*$")
EXTERN_SHARED = re.compile(
    r"extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?([A-Za-z_][\w\s:*]*?)\s*\b([A-Za-z_]\w*)\s*\[\s*\]\s*;")


def fail(path, lineno, msg):
    sys.stderr.write("%s:%d: cuemu_rewrite: %s\n" % (path, lineno, msg))
    sys.exit(1)


def kernel_start(line, at, path, lineno):
    """Index where `name<targs>` (or `name`) ends right before `<<<` at `at` begins."""
    j = at
    while j > 0 and line[j - 1] in " \t":
        j -= 1
    end = j
    if j > 0 and line[j - 1] == ">":  # template arguments, not nested
        lt = line.rfind("<", 0, j - 1)
        if lt < 0 or ">" in line[lt + 1:j - 1]:
            fail(path, lineno, "cannot find the template arguments of the kernel before <<<")
        j = lt
    m = IDENT.search(line[:j])
    if not m:
        fail(path, lineno, "no kernel name before <<<")
    return m.start(), end


def config_end(line, start, path, lineno):
    """Index of the `>>>` closing the configuration that starts at `start`."""
    depth = 0
    i = start
    while i < len(line):
        c = line[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and line.startswith(">>>", i):
            return i
        i += 1
    fail(path, lineno, "no >>> closing the launch configuration on this line")


SHARED_DECL = re.compile(r"^(\s*)__shared__\s+([A-Za-z_][\w:]*(?:\s*\*)?)\s+([^;]+);\s*(//.*|/\*.*\*/)?$")


def shared_names(decls, path, lineno):
    """Names declared by `a[N], b[M][K]` (brackets may hold commas only inside parentheses)."""
    names, depth, cur = [], 0, ""
    for c in decls + ",":
        if c in "[(":
            depth += 1
        elif c in "])":
            depth -= 1
        if c == "," and depth == 0:
            m = re.match(r"\s*\**\s*([A-Za-z_]\w*)\s*(\[.*\])?\s*$", cur)
            if not m:
                fail(path, lineno, "cannot parse the __shared__ declarator '%s'" % cur.strip())
            names.append(m.group(1))
            cur = ""
        else:
            cur += c
    return names


def rewrite_line(line, path, lineno):
    out = line
    while True:
        at = out.find("<<<")
        if at < 0:
            break
        ks, ke = kernel_start(out, at, path, lineno)
        ce = config_end(out, at + 3, path, lineno)
        cfg = out[at + 3:ce].strip()
        if not cfg or cfg.count(",") < 1:
            fail(path, lineno, "launch configuration needs at least grid and block")
        rest = out[ce + 3:]
        if not rest.lstrip().startswith("("):
            fail(path, lineno, "no argument list after >>>")
        name = out[ks:ke]
        out = '%scuemu::launch(%s, "%s", %s)%s' % (out[:ks], name, name.replace(" ", ""), cfg, rest)
    if "__shared__" in out and "extern" in out:
        m = EXTERN_SHARED.search(out)
        if not m:
            fail(path, lineno, "cannot rewrite this extern __shared__ declaration")
        typ, name = m.group(1).strip(), m.group(2)
        out = out[:m.start()] + "%s *const %s = (%s *)cuemu::dyn_smem();" % (typ, name, typ) + out[m.end():]
    elif re.search(r"\b__shared__\b", out):  # static: register it, so each block starts poisoned
        m = SHARED_DECL.match(out)
        if not m:
            fail(path, lineno, "a __shared__ declaration must stand alone on its line (`__shared__ T a[N], b;`)")
        regs = " ".join("CUEMU_SHARED_REG(%s);" % n for n in shared_names(m.group(3), path, lineno))
        out = out.rstrip("\n") + " " + regs
    return out


def main():
    if len(sys.argv) not in (3, 4):
        sys.stderr.write("usage: cuemu_rewrite.py IN OUT [LINE_NAME]\n")
        return 2
    src, dst = sys.argv[1], sys.argv[2]
    line_name = sys.argv[3] if len(sys.argv) == 4 else src
    with open(src, encoding="utf-8") as f:
        lines = f.read().split("\n")
    body = [rewrite_line(l, src, i + 1) for i, l in enumerate(lines)]
    text = "// generated by tests/cuemu/cuemu_rewrite.py from %s; do not edit\n" % src
    text += "#include \"cuemu.h\"\n#line 1 \"%s\"\n" % line_name.replace("\\", "/")
    text += "\n".join(body)
    tmp = dst + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    import os
    os.replace(tmp, dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
