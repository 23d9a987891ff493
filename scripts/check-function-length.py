#!/usr/bin/env python3
"""Fails when a function body in src/ runs over the limit (150 lines by default): a body that long does several
things a reader can name, each worth its own function (docs/architecture.md, "No long bodies").

A small brace matcher, not a C++ parser: comments, strings and character literals are blanked first; a block is a
function body when the text before its `{` ends in a parameter list `)` (optionally `const`, `override`, `noexcept`,
a trailing return type or a constructor's initialiser list) and is not an if / for / while / switch / catch head;
lambdas and blocks inside a function count towards it. Class and namespace bodies are not functions.

Usage: check-function-length.py [SRC_DIR] [LIMIT]
"""
import os
import re
import sys

HEAD = re.compile(r"\)\s*(?:const|override|noexcept|final|mutable|->\s*[\w:<>,\s\*&]+|\s)*$")
CONTROL = re.compile(r"\b(?:if|for|while|switch|catch)\s*\((?:[^()]|\([^()]*\))*\)\s*$")
NAME = re.compile(r"([\w:~<>]+)\s*\(")


def blank(src):
    src = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), src, flags=re.S)
    src = re.sub(r"//[^\n]*", "", src)
    src = re.sub(r'R"(\w*)\(.*?\)\1"', lambda m: "\n" * m.group(0).count("\n"), src, flags=re.S)
    src = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', src)
    return re.sub(r"'(?:\\.|[^'\\\n])*'", "''", src)


def long_functions(path, limit):
    text = blank(open(path, encoding="utf-8", errors="replace").read())
    found, stack, line = [], [], 1
    for i, ch in enumerate(text):
        if ch == "\n":
            line += 1
        elif ch == "{":
            before = text[max(0, i - 400):i]
            stack.append((line, bool(HEAD.search(before)) and not CONTROL.search(before), before))
        elif ch == "}" and stack:
            start, is_function, before = stack.pop()
            if is_function and not any(f for _, f, _ in stack) and line - start + 1 > limit:
                names = NAME.findall(before)
                found.append((line - start + 1, f"{path}:{start}", names[-1] if names else "?"))
    return found


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "src"
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else 150
    found = []
    for d, _, files in os.walk(root):
        for f in sorted(files):
            if f.endswith((".cpp", ".h", ".cu", ".cuh", ".inl", ".inc")):
                found += long_functions(os.path.join(d, f), limit)
    for n, where, name in sorted(found, reverse=True):
        print(f"{where}: {name} is {n} lines (the limit is {limit})")
    if found:
        sys.exit(1)
    print(f"no function in {root} is over {limit} lines")


if __name__ == "__main__":
    main()
