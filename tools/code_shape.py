#!/usr/bin/env python3
"""The shape of the workspace's code, for reviews of its readability.

    python3 tools/code_shape.py [--top N] [ROOT]

Prints, for the non-test code of every crate (each crate's `src/`, without
`tests.rs` files and `#[cfg(test)]` modules; examples, benches and
integration tests are left out):

* the N largest files (lines; modules compiled only for tests, such as the
  core's `testkit`, are left out);
* the N longest functions (lines from `fn` to its closing brace);
* the import cycles between each crate's top-level modules: a module `a`
  (`src/a.rs` or `src/a/**`) uses `b` when it names `crate::b`, or `super::b`
  from its root file; the strongly connected components of that graph with
  more than one module are the cycles.

The parsing is lexical (comments, strings, chars and lifetimes are skipped
before braces are matched), which is enough for rustfmt-formatted code.
"""

import os
import re
import sys
from collections import defaultdict


def strip(text):
    """The text with comments, strings and char literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "r" and re.match(r'r#*"', text[i:]) and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r"r(#*)\"", text[i:]).group(1)
            end = text.find('"' + hashes, i + 2 + len(hashes))
            end = n if end < 0 else end + 1 + len(hashes)
            out.append(re.sub(r"[^\n]", " ", text[i:end]))
            i = end
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", text[i : j + 1]))
            i = j + 1
        elif c == "'":
            m = re.match(r"'(\\.[^']*|[^'\\])'", text[i:])
            if m:
                out.append(" " * len(m.group(0)))
                i += len(m.group(0))
            else:  # a lifetime
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching(code, open_at):
    depth = 0
    for j in range(open_at, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code) - 1


def without_test_modules(code):
    """Blanks `#[cfg(test)] mod x { ... }` blocks."""
    for m in reversed(list(re.finditer(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", code))):
        end = matching(code, m.end() - 1)
        code = code[: m.start()] + re.sub(r"[^\n]", " ", code[m.start() : end + 1]) + code[end + 1 :]
    return code


def functions(code):
    """(name, first line, lines) of every function with a body."""
    found = []
    for m in re.finditer(r"\bfn\s+(\w+)", code):
        # The body starts at the first `{` after the signature, unless a `;`
        # (a declaration without a body) comes first at depth 0.
        j, depth = m.end(), 0
        while j < len(code):
            ch = code[j]
            if ch in "(<[":
                depth += 1
            elif ch in ")>]":
                depth -= 1 if ch != ">" or code[j - 1] != "-" else 0
            elif ch == ";" and depth <= 0:
                j = -1
                break
            elif ch == "{" and depth <= 0:
                break
            j += 1
        if j < 0 or j >= len(code):
            continue
        end = matching(code, j)
        first = code.count("\n", 0, m.start()) + 1
        last = code.count("\n", 0, end) + 1
        found.append((m.group(1), first, last - first + 1))
    return found


def crate_sources(root):
    for crate in sorted(os.listdir(root)):
        src = os.path.join(root, crate, "src")
        if not os.path.isfile(os.path.join(root, crate, "Cargo.toml")) or not os.path.isdir(src):
            continue
        files = []
        for dirpath, _, names in os.walk(src):
            for name in names:
                if name.endswith(".rs") and name != "tests.rs" and "/tests" not in dirpath[len(src) :]:
                    files.append(os.path.join(dirpath, name))
        # Modules compiled only for tests (`#[cfg(test)] mod x;`) or only
        # for other crates' tests (the `testkit` feature) are test code.
        test_only = set()
        for f in files:
            with open(f, encoding="utf-8") as fh:
                text = fh.read()
            here = os.path.dirname(f) if os.path.basename(f) in ("mod.rs", "lib.rs", "main.rs") else f[:-3]
            for name in re.findall(r'#\[cfg\((?:test|feature = "testkit")\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;', text):
                test_only.add(os.path.join(here, name))
        files = [f for f in files if not any(f == t + ".rs" or f.startswith(t + os.sep) for t in test_only)]
        yield crate, src, sorted(files)


def top_module(src, path):
    rel = os.path.relpath(path, src)
    head = rel.split(os.sep)[0]
    return head[:-3] if head.endswith(".rs") else head


def cycles(src, files, codes):
    modules = {top_module(src, f) for f in files} - {"lib", "main"}
    uses = defaultdict(set)
    for f in files:
        a = top_module(src, f)
        rel = os.path.relpath(f, src)
        root_file = os.sep not in rel or rel.endswith(os.sep + "mod.rs") and rel.count(os.sep) == 1
        code = codes[f]
        named = set(re.findall(r"\bcrate::(\w+)", code))
        # `use crate::{a::x, b}` groups
        for group in re.findall(r"\bcrate::\{([^}]*)\}", code):
            named |= set(re.findall(r"(?:^|,)\s*(\w+)", group))
        if root_file and a not in ("lib", "main"):
            named |= set(re.findall(r"\bsuper::(\w+)", code))
        for b in named:
            if b in modules and b != a:
                uses[a].add(b)
    # Tarjan's strongly connected components.
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(uses[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(modules | {"lib", "main"} & set(uses)):
        if v not in index:
            visit(v)
    return out


def main():
    args = sys.argv[1:]
    top = 10
    if args[:1] == ["--top"]:
        top, args = int(args[1]), args[2:]
    root = args[0] if args else "."
    sizes, funcs, all_cycles = [], [], []
    for crate, src, files in crate_sources(root):
        codes = {}
        for f in files:
            with open(f, encoding="utf-8") as fh:
                text = fh.read()
            rel = os.path.relpath(f, root)
            sizes.append((text.count("\n"), rel))
            code = without_test_modules(strip(text))
            codes[f] = code
            for name, line, length in functions(code):
                funcs.append((length, f"{name} ({rel}:{line})"))
        for comp in cycles(src, files, codes):
            all_cycles.append(f"{crate}: " + " <-> ".join(comp))
    print(f"largest files (lines), top {top}:")
    for n, rel in sorted(sizes, reverse=True)[:top]:
        print(f"  {n:6}  {rel}")
    print(f"longest functions (lines), top {top}:")
    for n, what in sorted(funcs, reverse=True)[:top]:
        print(f"  {n:6}  {what}")
    print(f"functions over 80 lines: {sum(1 for n, _ in funcs if n > 80)}")
    print(f"import cycles between top-level modules: {len(all_cycles)}")
    for c in all_cycles:
        print(f"  {c}")


if __name__ == "__main__":
    main()
