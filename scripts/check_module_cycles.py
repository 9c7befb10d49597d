#!/usr/bin/env python3
"""Module import-cycle check for every crate under crates/ and examples/ (issue 52, item 5).

Usage: scripts/check_module_cycles.py [--root DIR] [--baseline FILE] [--verbose]
       scripts/check_module_cycles.py --self-test

For each crate root (src/lib.rs, src/main.rs, src/bin/*.rs) it follows the `mod x;`
declarations to get the module tree: one node per module file (`src/x.rs` or `src/x/mod.rs`
is `x`, `src/view/offline.rs` is `view::offline`, the crate root is `crate`). An edge A -> B
means code of A refers to an item of B:
  - `use` lines, grouped trees included (`use crate::{a, b::c}`), and paths in code
    (`crate::b::f()`, `super::X`, `self::x::Y`, `child::f()` for a child module of A);
  - a path is walked down the module tree as far as it names modules; the item it then
    names is looked up among that module's imports, so `crate::Error` re-exported by
    lib.rs as `pub use error::Error` leads to `error`, not to the root;
  - `mod x;` declarations are not edges, and a `pub use` of a module's own descendant is a
    re-export (an alias that later references are resolved through), not an edge;
  - `pub(in crate::x)` visibilities are not references;
  - comments and string literals are ignored.
Items under `#[cfg(test)]` (test modules inline or in their own files, test-only `use`s and
functions) are ignored: a test module importing its parent with `use super::*` is not a
cycle of the code that ships. Other `cfg`s are read as if enabled. Inline non-test modules
(`mod headers { .. }`) belong to their file's node.

Every strongly connected component of more than one module is reported with the edges
inside it (file:line of one reference per edge), so a reader knows what to move.

The baseline (scripts/module_cycles.baseline) lists the cycles known today, one line per
cycle: `<crate dir>: <module> <module> ...` (sorted). The check exits 1 when a cycle is
not in the baseline, and also when a baseline cycle is gone or changed (shrink the
baseline then), so the baseline cannot rot.

Standard library only.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections import defaultdict

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


# ---------------------------------------------------------------------------------------
# Source text: comments, literals and #[cfg(test)] items blanked (newlines kept)
# ---------------------------------------------------------------------------------------


def strip_comments_and_literals(src: str) -> str:
    """Replaces comments, string, byte-string, raw-string and char literals by spaces,
    keeping every newline so that offsets still map to the same lines."""
    out = list(src)
    n = len(src)
    i = 0

    def blank(a: int, b: int) -> None:
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = src[i]
        if c == "/" and i + 1 < n and src[i + 1] == "/":
            j = src.find("\n", i)
            j = n if j < 0 else j
            blank(i, j)
            i = j
        elif c == "/" and i + 1 < n and src[i + 1] == "*":
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            blank(i, j)
            i = j
        elif c in "rb" and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            # r"..", r#".."#, br"..", b"..", b'x'
            j = i + 1
            if c == "b" and j < n and src[j] == "r":
                j += 1
            raw = src[j - 1] == "r"
            hashes = 0
            while raw and j < n and src[j] == "#":
                hashes, j = hashes + 1, j + 1
            if j < n and src[j] == '"' and (raw or c == "b"):
                if raw:
                    end = src.find('"' + "#" * hashes, j + 1)
                    end = n if end < 0 else end + 1 + hashes
                else:
                    end = skip_string(src, j)
                blank(i, end)
                i = end
            elif c == "b" and j == i + 1 and j < n and src[j] == "'":
                end = skip_char(src, j)
                blank(i, end if end else j + 1)
                i = end if end else j + 1
            else:
                i += 1
        elif c == '"':
            end = skip_string(src, i)
            blank(i, end)
            i = end
        elif c == "'":
            end = skip_char(src, i)
            if end:
                blank(i, end)
                i = end
            else:  # a lifetime
                i += 1
        else:
            i += 1
    return "".join(out)


def skip_string(src: str, i: int) -> int:
    """Index after the string literal whose opening quote is at i."""
    j = i + 1
    while j < len(src):
        if src[j] == "\\":
            j += 2
        elif src[j] == '"':
            return j + 1
        else:
            j += 1
    return len(src)


def skip_char(src: str, i: int) -> int | None:
    """Index after the char literal whose quote is at i, or None for a lifetime."""
    if i + 1 < len(src) and src[i + 1] == "\\":
        j = src.find("'", i + 2)
        return None if j < 0 else j + 1
    if i + 2 < len(src) and src[i + 2] == "'":
        return i + 3
    return None


def matching_brace(text: str, open_at: int) -> int:
    depth = 0
    for k in range(open_at, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return k + 1
    return len(text)


CFG_TEST = re.compile(r"#\s*\[\s*cfg\s*\(\s*test\s*\)\s*\]")
ATTR = re.compile(r"\s*#\s*\[")


def blank_cfg_test(text: str) -> tuple[str, set[str]]:
    """Blanks every item under `#[cfg(test)]`; returns the text and the names of test-only
    `mod x;` declarations (their files are not part of the shipped module tree)."""
    out = list(text)
    test_mods: set[str] = set()
    pos = 0
    while True:
        m = CFG_TEST.search(text, pos)
        if not m:
            break
        j = m.end()
        # skip further attributes on the same item
        while True:
            a = ATTR.match(text, j)
            if not a:
                break
            depth, k = 0, a.end() - 1
            while k < len(text):
                if text[k] == "[":
                    depth += 1
                elif text[k] == "]":
                    depth -= 1
                    if depth == 0:
                        break
                k += 1
            j = k + 1
        decl = re.match(r"\s*(?:pub\s*(?:\([^)]*\))?\s*)?mod\s+(" + IDENT + r")\s*;", text[j:])
        if decl:
            test_mods.add(decl.group(1))
        # the item ends at the first `;` outside brackets, or at the brace closing its body
        depth, k, end = 0, j, len(text)
        while k < len(text):
            ch = text[k]
            if ch in "([":
                depth += 1
            elif ch in ")]":
                depth -= 1
            elif ch == ";" and depth == 0:
                end = k + 1
                break
            elif ch == "{" and depth == 0:
                end = matching_brace(text, k)
                break
            k += 1
        for q in range(m.start(), end):
            if out[q] != "\n":
                out[q] = " "
        pos = end
    return "".join(out), test_mods


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


# ---------------------------------------------------------------------------------------
# Module tree
# ---------------------------------------------------------------------------------------

MOD_DECL = re.compile(r"(?<![\w:])(?:pub\s*(?:\([^)]*\)\s*)?)?mod\s+(" + IDENT + r")\s*([;{])")


class Module:
    def __init__(self, path: tuple[str, ...], file: str, text: str, dir_for_children: str):
        self.path = path
        self.file = file
        self.text = text  # cleaned
        self.dir = dir_for_children
        self.children: set[str] = set()
        self.inline: list[tuple[int, int]] = []  # spans of inline (non-test) modules

    @property
    def name(self) -> str:
        return "::".join(self.path) if self.path else "crate"


def load_tree(root_file: str) -> dict[tuple[str, ...], Module]:
    modules: dict[tuple[str, ...], Module] = {}

    def visit(path: tuple[str, ...], file: str, child_dir: str) -> None:
        with open(file, encoding="utf-8") as f:
            raw = f.read()
        text, test_mods = blank_cfg_test(strip_comments_and_literals(raw))
        mod = Module(path, file, text, child_dir)
        modules[path] = mod
        for m in MOD_DECL.finditer(text):
            name, kind = m.group(1), m.group(2)
            if kind == "{":
                mod.inline.append((m.end() - 1, matching_brace(text, m.end() - 1)))
                continue
            if name in test_mods or any(a <= m.start() < b for a, b in mod.inline):
                continue
            flat = os.path.join(child_dir, name + ".rs")
            nested = os.path.join(child_dir, name, "mod.rs")
            if os.path.isfile(flat):
                mod.children.add(name)
                visit(path + (name,), flat, os.path.join(child_dir, name))
            elif os.path.isfile(nested):
                mod.children.add(name)
                visit(path + (name,), nested, os.path.join(child_dir, name))

    visit((), root_file, os.path.dirname(root_file))
    return modules


# ---------------------------------------------------------------------------------------
# References
# ---------------------------------------------------------------------------------------

USE_STMT = re.compile(
    r"(?<![\w:])(?P<vis>pub\s*(?:\(\s*(?:crate|super|self|in\s[^)]*)\s*\)\s*)?)?use\s+(?P<tree>[^;]*);"
)
VIS_IN = re.compile(r"pub\s*\(\s*in\s[^)]*\)")
TOKEN = re.compile(r"::|[{},*]|" + IDENT)


def expand_use_tree(tree: str) -> list[tuple[list[str], str | None]]:
    """`a::{b, c::{d as e, self}}` -> [(['a','b'], 'b'), (['a','c','d'], 'e'), (['a','c'], 'c')]
    (path, name bound; None for a glob). A tree starting with `::` names an extern crate."""
    toks = TOKEN.findall(tree)
    if toks and toks[0] == "::":
        return []
    pos = 0

    def peek() -> str | None:
        return toks[pos] if pos < len(toks) else None

    def parse(prefix: list[str]) -> list[tuple[list[str], str | None]]:
        nonlocal pos
        segs: list[str] = []
        while True:
            t = peek()
            if t == "{":
                pos += 1
                items: list[tuple[list[str], str | None]] = []
                while peek() not in ("}", None):
                    items.extend(parse(prefix + segs))
                    if peek() == ",":
                        pos += 1
                pos += 1
                return items
            if t == "*":
                pos += 1
                return [(prefix + segs, None)]
            if t is not None and re.fullmatch(IDENT, t) and t != "as":
                pos += 1
                segs.append(t)
                if peek() == "::":
                    pos += 1
                    continue
            break
        path = prefix + segs
        if segs == ["self"]:
            path = prefix
        name = path[-1] if path else None
        if peek() == "as":
            pos += 1
            name = peek()
            pos += 1
        return [(path, name)] if path else []

    out: list[tuple[list[str], str | None]] = []
    while pos < len(toks):
        before = pos
        out.extend(parse([]))
        if peek() == ",":
            pos += 1
        if pos == before:
            pos += 1
    return out


class Graph:
    """Module graph of one crate root."""

    def __init__(self, modules: dict[tuple[str, ...], Module]):
        self.modules = modules
        # per module: name -> (module importing, path) or None for an external name
        self.aliases: dict[tuple[str, ...], dict[str, tuple[tuple[str, ...], list[str], int] | None]] = defaultdict(dict)
        self.edges: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[str, int, str]] = {}
        self._pending: list[tuple[Module, int, list[str], int]] = []
        for mod in modules.values():
            self._collect(mod)
        for mod, offset, segs, depth in self._pending:
            target = self.resolve(mod.path, segs, depth)
            if target is not None and target != mod.path:
                key = (mod.path, target)
                if key not in self.edges:
                    self.edges[key] = (mod.file, line_of(mod.text, offset), "::".join(segs))

    def _inline_depth(self, mod: Module, offset: int) -> int:
        return sum(1 for a, b in mod.inline if a <= offset < b)

    def _local(self, mod: Module, first: str) -> bool:
        return first in ("crate", "super", "self") or first in mod.children

    def _collect(self, mod: Module) -> None:
        text = VIS_IN.sub(lambda m: " " * len(m.group(0)), mod.text)
        uses = []
        for m in USE_STMT.finditer(text):
            uses.append((m.start(), m.end()))
            depth = self._inline_depth(mod, m.start())
            public = bool(m.group("vis"))
            for path, name in expand_use_tree(m.group("tree")):
                if not path:
                    continue
                if path[0] == "":
                    continue
                local = self._local(mod, path[0])
                if name is not None and depth == 0:
                    self.aliases[mod.path][name] = (mod.path, path, depth) if local else None
                if not local:
                    continue
                reexport = public and self._is_descendant_path(mod, path)
                if not reexport:
                    self._pending.append((mod, m.start("tree"), path, depth))
        # paths in code, outside use statements
        chars = list(text)
        for a, b in uses:
            for k in range(a, b):
                if chars[k] != "\n":
                    chars[k] = " "
        code = "".join(chars)
        heads = ["crate", "super", "self"] + sorted(mod.children)
        pat = re.compile(r"(?<![\w:])(?:" + "|".join(map(re.escape, heads)) + r")(?:\s*::\s*" + IDENT + r")+")
        for m in pat.finditer(code):
            segs = [s.strip() for s in m.group(0).split("::")]
            self._pending.append((mod, m.start(), segs, self._inline_depth(mod, m.start())))

    def _is_descendant_path(self, mod: Module, path: list[str]) -> bool:
        """A `pub use` of the module's own descendant (`pub use child::X`, `self::child`)."""
        segs = path[1:] if path[0] == "self" else path
        return bool(segs) and segs[0] in mod.children

    def _start(self, at: tuple[str, ...], segs: list[str], depth: int) -> tuple[tuple[str, ...], int] | None:
        first = segs[0]
        if first == "crate":
            return (), 1
        i, cur = 0, at
        if first == "self":
            return at, 1
        if first == "super":
            ups = 0
            while i < len(segs) and segs[i] == "super":
                ups, i = ups + 1, i + 1
            ups -= depth  # supers inside inline modules stay in the file
            if ups > 0:
                if ups > len(cur):
                    return None
                cur = cur[: len(cur) - ups]
            return cur, i
        if first in self.modules[at].children:
            return at + (first,), 1
        return None

    def resolve(self, at: tuple[str, ...], segs: list[str], depth: int = 0, hops: int = 0) -> tuple[str, ...] | None:
        start = self._start(at, segs, depth)
        if start is None:
            return None
        cur, i = start
        while i < len(segs):
            s = segs[i]
            child = cur + (s,)
            if child in self.modules and s in self.modules[cur].children:
                cur, i = child, i + 1
                continue
            if s in self.aliases.get(cur, {}) and hops < 16:
                alias = self.aliases[cur][s]
                if alias is None:
                    return cur  # an external name imported there: count the module
                amod, apath, adepth = alias
                return self.resolve(amod, apath + segs[i + 1 :], adepth, hops + 1)
            break
        return cur


def strongly_connected(nodes, edges) -> list[list]:
    """Tarjan's algorithm, iterative."""
    succ = defaultdict(list)
    for a, b in edges:
        succ[a].append(b)
    index: dict = {}
    low: dict = {}
    on_stack: set = set()
    stack: list = []
    comps: list[list] = []
    counter = 0
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, pi = work.pop()
            if pi == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack.add(v)
            recurse = False
            nbrs = sorted(succ[v])
            for k in range(pi, len(nbrs)):
                w = nbrs[k]
                if w not in index:
                    work.append((v, k + 1))
                    work.append((w, 0))
                    recurse = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if recurse:
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                comps.append(comp)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return comps


# ---------------------------------------------------------------------------------------
# Crates, cycles, baseline
# ---------------------------------------------------------------------------------------


def crate_roots(repo: str) -> list[tuple[str, str]]:
    """(label, root file) of every crate root under crates/ and examples/."""
    roots = []
    for group in ("crates", "examples"):
        base = os.path.join(repo, group)
        if not os.path.isdir(base):
            continue
        for name in sorted(os.listdir(base)):
            src = os.path.join(base, name, "src")
            if not os.path.isdir(src):
                continue
            label = f"{group}/{name}"
            if os.path.isfile(os.path.join(src, "lib.rs")):
                roots.append((label, os.path.join(src, "lib.rs")))
            if os.path.isfile(os.path.join(src, "main.rs")):
                roots.append((f"{label} (bin)", os.path.join(src, "main.rs")))
            bindir = os.path.join(src, "bin")
            if os.path.isdir(bindir):
                for f in sorted(os.listdir(bindir)):
                    p = os.path.join(bindir, f)
                    if f.endswith(".rs"):
                        roots.append((f"{label} (bin {f[:-3]})", p))
                    elif os.path.isfile(os.path.join(p, "main.rs")):
                        roots.append((f"{label} (bin {f})", os.path.join(p, "main.rs")))
    return roots


def find_cycles(repo: str, verbose: bool = False):
    """[(label, sorted module names, [(from, to, file, line, path)])]"""
    found = []
    for label, root in crate_roots(repo):
        g = Graph(load_tree(root))
        if verbose:
            print(f"{label}: {len(g.modules)} modules, {len(g.edges)} edges", file=sys.stderr)
        name = lambda p: "::".join(p) if p else "crate"  # noqa: E731
        for comp in strongly_connected(list(g.modules), list(g.edges)):
            if len(comp) < 2:
                continue
            members = set(comp)
            inner = []
            for (a, b), (file, line, path) in sorted(g.edges.items()):
                if a in members and b in members:
                    inner.append((name(a), name(b), os.path.relpath(file, repo), line, path))
            found.append((label, sorted(name(p) for p in comp), inner))
    return found


def cycle_key(label: str, names: list[str]) -> str:
    return f"{label}: {' '.join(sorted(names))}"


def read_baseline(path: str) -> list[str]:
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        lines = [ln.strip() for ln in f]
    out = []
    for ln in lines:
        if not ln or ln.startswith("#"):
            continue
        label, _, mods = ln.partition(":")
        out.append(cycle_key(label.strip(), mods.split()))
    return out


def report(found, baseline: list[str], out=sys.stdout) -> int:
    keys = {cycle_key(label, names): (label, names, edges) for label, names, edges in found}
    new = [k for k in keys if k not in baseline]
    gone = [k for k in baseline if k not in keys]
    for k, (label, names, edges) in keys.items():
        tag = "NEW CYCLE" if k in new else "known cycle (baseline)"
        print(f"{tag} in {label}: {' '.join(names)}", file=out)
        for a, b, file, line, path in edges:
            print(f"    {a} -> {b}    {file}:{line}  ({path})", file=out)
    if not keys:
        print("no module import cycles", file=out)
    status = 0
    if new:
        status = 1
        print(
            f"\n{len(new)} cycle(s) not in scripts/module_cycles.baseline: break them (move the shared"
            " items the edges above name into a module of their own), or, if a cycle only changed"
            " shape, update its baseline line.",
            file=out,
        )
    if gone:
        status = 1
        print("\nbaseline cycle(s) no longer found: shrink scripts/module_cycles.baseline by removing:", file=out)
        for k in gone:
            print(f"    {k}", file=out)
    if status == 0:
        print(f"\nok: {len(keys)} known cycle(s), all in the baseline, none new", file=out)
    return status


# ---------------------------------------------------------------------------------------
# Self-test
# ---------------------------------------------------------------------------------------


def self_test() -> int:
    def write(root: str, rel: str, text: str) -> None:
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w", encoding="utf-8") as f:
            f.write(text)

    failures = []

    def check(cond: bool, what: str) -> None:
        print(f"  {'ok  ' if cond else 'FAIL'} {what}")
        if not cond:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        # crate with cycles: a <-> b::inner through a grouped use and a code path; the
        # re-export in lib.rs resolves to `c`; the test module and comments add nothing.
        write(tmp, "crates/cyc/src/lib.rs", "mod a;\nmod b;\nmod c;\nmod d;\npub use c::Shared;\n")
        write(
            tmp,
            "crates/cyc/src/a.rs",
            "use crate::{b::inner::Thing, Shared};\n// crate::d::never() in a comment\n"
            'const S: &str = "crate::d::never()";\npub fn f() {}\n',
        )
        write(tmp, "crates/cyc/src/b/mod.rs", "pub mod inner;\npub fn g() { inner::h() }\n")
        write(tmp, "crates/cyc/src/b/inner.rs", "pub struct Thing;\npub fn h() {\n    crate::a::f();\n}\n")
        write(tmp, "crates/cyc/src/c.rs", "pub struct Shared;\n")
        write(
            tmp,
            "crates/cyc/src/d.rs",
            "pub(in crate::d) struct X;\npub fn k() { super::a::f() }\n"
            "#[cfg(test)]\nmod tests {\n    use crate::c::Shared;\n}\n",
        )
        # parent/child cycle through super:: ; a cfg(test) module file importing its parent
        write(tmp, "crates/pc/src/lib.rs", "pub mod view;\n")
        write(tmp, "crates/pc/src/view.rs", "mod offline;\n#[cfg(test)]\nmod tests;\npub struct Opts;\npub fn run() { offline::go() }\n")
        write(tmp, "crates/pc/src/view/offline.rs", "use super::Opts;\npub fn go() {}\n")
        write(tmp, "crates/pc/src/view/tests.rs", "use super::*;\n")
        # no cycle: a crate where only one direction exists, and a test module going back
        write(tmp, "examples/clean/src/lib.rs", "pub mod x;\npub mod y;\npub mod shared;\n")
        write(tmp, "examples/clean/src/x.rs", "use crate::shared::Opts;\nuse crate::y;\npub fn f() { y::g() }\n")
        write(
            tmp,
            "examples/clean/src/y.rs",
            "use crate::shared::{self, Opts};\npub fn g() {}\n#[cfg(test)]\nmod tests {\n    use crate::x::f;\n}\n",
        )
        write(tmp, "examples/clean/src/shared.rs", "pub struct Opts;\n")

        found = find_cycles(tmp)
        by_label = {(label, tuple(names)): edges for label, names, edges in found}
        print("self-test: cycles found in the fake crates:")
        for (label, names), edges in by_label.items():
            print(f"    {label}: {' '.join(names)}")
        cyc = by_label.get(("crates/cyc", ("a", "b::inner")))
        check(cyc is not None, "a <-> b::inner is found (grouped use + code path)")
        if cyc:
            check(
                ("a", "b::inner", "crates/cyc/src/a.rs", 1, "crate::b::inner::Thing") in cyc
                and ("b::inner", "a", "crates/cyc/src/b/inner.rs", 3, "crate::a::f") in cyc,
                "the cycle's edges carry file:line of a reference",
            )
        check(
            not any(label == "crates/cyc" and "c" in names for label, names, _ in found),
            "a root re-export (`pub use c::Shared`) leads to `c` and makes no cycle",
        )
        check(
            not any("d" in names for label, names, _ in found),
            "comments, strings, pub(in ..) and #[cfg(test)] modules add no edge",
        )
        check(("crates/pc", ("view", "view::offline")) in by_label, "a parent/child cycle through super:: is found")
        check(not any(label == "examples/clean" for label, _, _ in found), "the crate without a cycle has none")

        baseline = os.path.join(tmp, "baseline")
        with open(baseline, "w", encoding="utf-8") as f:
            f.write("# comment\ncrates/cyc: b::inner a\ncrates/pc: view view::offline\n")
        sink = open(os.devnull, "w")
        check(report(found, read_baseline(baseline), sink) == 0, "baseline with every cycle: exit 0")
        with open(baseline, "w", encoding="utf-8") as f:
            f.write("crates/cyc: a b::inner\n")
        check(report(found, read_baseline(baseline), sink) == 1, "a cycle missing from the baseline: exit 1")
        with open(baseline, "w", encoding="utf-8") as f:
            f.write("crates/cyc: a b::inner\ncrates/pc: view view::offline\nexamples/clean: x y\n")
        check(report(found, read_baseline(baseline), sink) == 1, "a baseline cycle that is gone: exit 1")
        sink.close()

    print("self-test " + ("passed" if not failures else f"FAILED: {len(failures)} check(s)"))
    return 1 if failures else 0


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.dirname(here), help="repository root")
    ap.add_argument("--baseline", default=os.path.join(here, "module_cycles.baseline"))
    ap.add_argument("--self-test", action="store_true", help="check the checker on fake crates")
    ap.add_argument("--verbose", action="store_true", help="print module and edge counts per crate")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    return report(find_cycles(args.root, args.verbose), read_baseline(args.baseline))


if __name__ == "__main__":
    sys.exit(main())
