#!/usr/bin/env python3
"""No crate's tests use a crate above it.

A crate's dev-dependency on a workspace crate its own code does not already depend on (in
`cargo metadata`: not in its normal dependencies' closure) is a crate above it, or beside it.
Its tests (`src/` unit tests and `tests/`) must not name it; its benches may (the gateway's
benches measure the whole of `postern serve`, which the host crate puts together).
`postern-testkit` depends on no Postern crate and is below everything.

Prints each use it finds and exits 1; prints one line and exits 0 when there is none.
"""

import json
import pathlib
import re
import subprocess
import sys

BELOW_EVERYTHING = {"postern-testkit"}


def main() -> int:
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    members = {p["name"]: p for p in meta["packages"]}
    normal = {
        name: {d["name"] for d in p["dependencies"] if d["name"] in members and d["kind"] is None}
        for name, p in members.items()
    }

    def closure(name: str) -> set:
        seen, todo = set(), list(normal[name])
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(normal[n])
        return seen

    problems = []
    for name, p in sorted(members.items()):
        root = pathlib.Path(p["manifest_path"]).parent
        above = {
            d["name"]
            for d in p["dependencies"]
            if d["name"] in members and d["kind"] == "dev"
        } - closure(name) - BELOW_EVERYTHING
        for crate in sorted(above):
            ident = re.compile(r"\b" + crate.replace("-", "_") + r"\b")
            for folder in ("src", "tests"):
                for path in sorted((root / folder).rglob("*.rs")):
                    for n, line in enumerate(path.read_text().splitlines(), 1):
                        if ident.search(line):
                            rel = path.relative_to(pathlib.Path.cwd())
                            problems.append(f"{rel}:{n}: a test of {name} uses {crate}, a crate above it")
    for line in problems:
        print(line)
    if problems:
        return 1
    print("crate graph: no crate's tests use a crate above it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
