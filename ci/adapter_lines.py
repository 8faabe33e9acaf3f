#!/usr/bin/env python3
"""Hand-written adapter code, counted the way issue 12 asks: every `.rs`, `.cc`, `.cpp` and `.h`
under `adapters/` (sources, build scripts, C++), leaving out tests (`tests/` folders and
`#[cfg(test)] mod tests` blocks) and generated bindings (files marked "Do not edit by hand").
Prints, per git revision given (default HEAD), the lines of code (non-blank, not comments) and
all lines, per adapter and in total.

    python3 ci/adapter_lines.py 0a74453 HEAD
"""

import re
import subprocess
import sys


def _files(rev: str) -> list[str]:
    out = subprocess.check_output(["git", "ls-tree", "-r", "--name-only", rev, "adapters"], text=True)
    return [f for f in out.split() if "/tests/" not in f and re.search(r"\.(rs|cc|cpp|h)$", f)]


def _without_test_module(lines: list[str]) -> list[str]:
    for i, line in enumerate(lines):
        if line.strip() == "#[cfg(test)]" and i + 1 < len(lines) and lines[i + 1].strip().startswith("mod tests"):
            return lines[:i]
    return lines


def code_lines(text: str) -> int:
    n, in_block = 0, False
    for line in _without_test_module(text.splitlines()):
        s = line.strip()
        if in_block:
            in_block = "*/" not in s
            continue
        if not s or s.startswith("//"):
            continue
        if s.startswith("/*"):
            in_block = "*/" not in s
            continue
        n += 1
    return n


def main(revs: list[str]) -> None:
    for rev in revs or ["HEAD"]:
        code, total, per = 0, 0, {}
        for f in _files(rev):
            text = subprocess.check_output(["git", "show", f"{rev}:{f}"], text=True)
            if "Do not edit by hand" in text[:400]:
                continue
            c = code_lines(text)
            code += c
            total += len(_without_test_module(text.splitlines()))
            fw = f.split("/")[1]
            per[fw] = per.get(fw, 0) + c
        print(f"{rev}: {code} lines of code, {total} lines; code per adapter {per}")


if __name__ == "__main__":
    main(sys.argv[1:])
