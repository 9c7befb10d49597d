#!/usr/bin/env python3
"""Holds the runtime crate to issue 52's length bars: no source file over MAX_FILE lines,
no function over MAX_FN lines outside tests (a `#[cfg(test)]` item, a `tests.rs` file).

A long file or function is where a newcomer stops reading; the bar makes a split happen
when code grows instead of in a clean-up round. Lines count as the editor shows them.

Usage: scripts/check_lengths.py [--self-test] [CRATE_SRC ...]
       (default: crates/eventfold-runtime/src)
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

MAX_FILE = 700
MAX_FN = 80
ROOT = Path(__file__).resolve().parent.parent
DEFAULT = [ROOT / "crates" / "eventfold-runtime" / "src"]


def blank_out(src: str) -> str:
    """The source with comments, string and char literals replaced by spaces (newlines
    kept), so braces inside them do not count."""
    out, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif src.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if src.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif src.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif m := re.match(r'b?r(#*)"', src[i:i + 300]):
            close = '"' + m.group(1)
            j = src.find(close, i + m.end())
            j = n if j < 0 else j + len(close)
            out.append(re.sub(r"[^\n]", " ", src[i:j]))
            i = j
        elif c == '"' or src.startswith('b"', i):
            j = i + (2 if c == "b" else 1)
            while j < n and src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append(re.sub(r"[^\n]", " ", src[i:j + 1]))
            i = j + 1
        elif c == "'" and (m := re.match(r"'(\\.[^']*|[^\\'])'", src[i:i + 12])):
            out.append(" " * m.end())
            i += m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def block_end(code: str, open_at: int) -> int:
    """Index of the brace closing the one at `open_at`."""
    depth = 0
    for j in range(open_at, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code) - 1


def test_spans(code: str) -> list[tuple[int, int]]:
    """Character spans of items under `#[cfg(test)]`."""
    spans = []
    for m in re.finditer(r"#\[cfg\(test\)\]", code):
        brace, semi = code.find("{", m.end()), code.find(";", m.end())
        if brace >= 0 and (semi < 0 or brace < semi):
            spans.append((m.start(), block_end(code, brace)))
    return spans


def long_functions(src: str) -> list[tuple[str, int, int]]:
    """(name, first line, length in lines) of every function over MAX_FN lines outside tests."""
    code = blank_out(src)
    tests = test_spans(code)
    found = []
    for m in re.finditer(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)", code):
        if any(a <= m.start() <= b for a, b in tests):
            continue
        # The body starts at the first `{` after the signature; a `;` first means no body.
        depth, j = 0, m.end()
        while j < len(code):
            ch = code[j]
            if ch in "(<[":
                depth += 1
            elif ch in ")>]":
                depth = max(0, depth - 1) if not (ch == ">" and code[j - 1] == "-") else depth
            elif ch == ";" and depth == 0:
                j = -1
                break
            elif ch == "{" and depth == 0:
                break
            j += 1
        if j < 0 or j >= len(code):
            continue
        end = block_end(code, j)
        first, last = code.count("\n", 0, m.start()) + 1, code.count("\n", 0, end) + 1
        if last - first + 1 > MAX_FN:
            found.append((m.group(1), first, last - first + 1))
    return found


def check(dirs: list[Path]) -> list[str]:
    problems = []
    for d in dirs:
        for path in sorted(d.rglob("*.rs")):
            if path.name == "tests.rs" or path.parent.name == "tests" or path.stem.endswith("_tests"):
                continue
            src = path.read_text()
            rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
            lines = src.count("\n")
            if lines > MAX_FILE:
                problems.append(f"{rel}: {lines} lines (bar {MAX_FILE}): split it by responsibility")
            for name, first, length in long_functions(src):
                problems.append(f"{rel}:{first}: fn {name} is {length} lines (bar {MAX_FN})")
    return problems


def self_test() -> None:
    body = "\n".join(f"    let x{i} = \"{{\"; // }}" for i in range(MAX_FN))
    long_fn = f"fn long() {{\n{body}\n}}\n"
    assert [f[0] for f in long_functions(long_fn)] == ["long"], long_functions(long_fn)
    short = "fn short() -> Vec<u8> { vec![b'{'] }\nfn decl(&self) -> u8;\n"
    assert long_functions(short) == [], long_functions(short)
    in_tests = f"#[cfg(test)]\nmod tests {{\n{long_fn}}}\n"
    assert long_functions(in_tests) == [], "a test module's functions are exempt"
    raw = f"fn r() {{ let s = r#\"}}\"#; }}\n{long_fn}"
    assert [f[0] for f in long_functions(raw)] == ["long"], "a brace in a raw string does not count"
    print("check_lengths self-test: ok")


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["--self-test"]:
        self_test()
        return 0
    problems = check([Path(a) for a in args] or DEFAULT)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"{len(problems)} over the length bars (scripts/check_lengths.py)", file=sys.stderr)
        return 1
    print("length bars: every file and function of the runtime is within them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
