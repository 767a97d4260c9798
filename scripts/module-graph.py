#!/usr/bin/env python3
"""The module graphs of the engine and gateway crates: lists every import that runs from a lower
role to a higher one, every cycle between modules and every `pub mod` of a crate root that is not
a role, and exits non-zero if there is any (CI runs it). The engine crate holds the four lowest
roles and the gateway the three above; cargo keeps the engine from importing the gateway.

Roles, lowest first: catalog, channel, approval, engine, caller, delivery, door (ARCHITECTURE.md).
A module may import from its own role or a lower one. A module and its own submodules are one
thing (a child's `use super::*` is not a cycle); any other circle of imports is reported.
Reads `crate::…` paths (in `use` groups too), `super::…` paths and `use child::…` of a declared
child, in tests as well: a test that needs a higher module is a sign the code is misplaced.

    python3 scripts/module-graph.py [--edges] [SRC_DIR ...]
    python3 scripts/module-graph.py --self-test   # the checker on crates it plants problems in
"""
import pathlib
import re
import sys

ROLES = ["catalog", "channel", "approval", "engine", "caller", "delivery", "door"]
DEFAULT = ["crates/postern-engine/src", "crates/postern-gateway/src"]


def modules(src):
    """Module path (tuple) → file, for every .rs under src."""
    found = {}
    for f in sorted(src.rglob("*.rs")):
        parts = list(f.relative_to(src).with_suffix("").parts)
        if parts[-1] == "mod":
            parts.pop()
        if parts == ["lib"] or parts == ["main"]:
            parts = []
        found[tuple(parts)] = f
    return found


def strip_comments(text):
    """The code without comments, string literals or char literals (which can hold `crate::`
    in a message, or a `"` that would unbalance a naive reading)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c == "r" and re.match(r'r#*"', text[i:]) and not (i and (text[i - 1].isalnum() or text[i - 1] == "_")):
            hashes = re.match(r'r(#*)"', text[i:]).group(1)
            end = text.find('"' + hashes, i + len(hashes) + 2)
            i = n if end < 0 else end + 1 + len(hashes)
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and re.match(r"'(\\.[^']*|[^\\'])'", text[i:]):
            i += re.match(r"'(\\.[^']*|[^\\'])'", text[i:]).end()
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def group_paths(body):
    """The paths a `{…}` use group names, each as a list of segments."""
    items, depth, cur = [], 0, ""
    for ch in body:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    out = []
    for item in items:
        # `engine::Engine as E` imports `engine::Engine`; `self` in a group is the group's head.
        item = re.sub(r"\s+as\s+\w+\s*$", "", item.strip())
        if not item:
            continue
        m = re.match(r"([A-Za-z_][\w:]*?)(::\{(.*)\})?$", item, flags=re.S)
        if not m:
            continue
        head = [s for s in m.group(1).split("::") if s]
        if m.group(3) is not None:
            for tail in group_paths(m.group(3)):
                out.append(head + tail)
        else:
            out.append(head)
    return out


def references(text, here, children):
    """Absolute paths (lists) this file refers to."""
    text = strip_comments(text)
    refs = []
    for m in re.finditer(r"\b(crate|super|self)((?:::super)*)::(\{)?", text):
        base = list(here) if m.group(1) != "crate" else []
        if m.group(1) == "super":
            base = base[:-1]
        base = base[: len(base) - m.group(2).count("super")] if m.group(2) else base
        if m.group(1) == "self":
            base = list(here)
        start = m.end()
        if m.group(3):
            depth, k = 1, start
            while depth and k < len(text):
                depth += {"{": 1, "}": -1}.get(text[k], 0)
                k += 1
            for p in group_paths(text[start : k - 1]):
                refs.append(base + p)
        else:
            p = re.match(r"[A-Za-z_]\w*(?:::[A-Za-z_]\w*)*", text[start:])
            if p:
                refs.append(base + p.group(0).split("::"))
    for m in re.finditer(r"\b(?:use\s+crate\s+as|extern\s+crate\s+self\s+as)\s+(\w+)", text):
        refs.append(["<alias>", m.group(1)])
    for m in re.finditer(r"\buse\s+([a-z_]\w*)::", text):
        if m.group(1) in children:
            refs.append(list(here) + [m.group(1)])
    return refs


def resolve(path, known):
    for n in range(len(path), -1, -1):
        if tuple(path[:n]) in known:
            return tuple(path[:n])
    return ()


def related(a, b):
    return a[: len(b)] == b or b[: len(a)] == a


def role(m):
    return ROLES.index(m[0]) if m and m[0] in ROLES else None


def reexports(src, known):
    """Names the crate root re-exports (`pub use a::b::{X, Y}`), by the module that holds them:
    `crate::X` is an import of that module, not of the root."""
    root = src / "lib.rs"
    names = {}
    if root.exists():
        for m in re.finditer(r"pub use ([\w:]+?)(?:::\{([^}]*)\}|::(\w+));", strip_comments(root.read_text())):
            where = resolve(m.group(1).split("::"), known)
            for name in (m.group(2) or m.group(3)).split(","):
                if name.strip():
                    names[name.strip()] = where
    return names


def check(src):
    known = modules(src)
    exported = reexports(src, known)
    edges, aliases = {}, []
    for here, f in known.items():
        children = {k[-1] for k in known if k[:-1] == here and len(k) == len(here) + 1}
        for ref in references(f.read_text(), here, children):
            if ref[0] == "<alias>":
                aliases.append(f"{src}: {'::'.join(here) or 'crate'} names the crate `{ref[1]}`: write `crate::`")
                continue
            to = resolve(ref, known)
            if to == () and ref and ref[0] in exported:
                to = exported[ref[0]]
            if to and not related(here, to):
                edges.setdefault(here, set()).add(to)
    problems = list(aliases)
    root = src / "lib.rs"
    if root.exists():
        for m in re.finditer(r"(?m)^pub mod (\w+);", strip_comments(root.read_text())):
            if m.group(1) not in ROLES:
                problems.append(f"{src}: `pub mod {m.group(1)}` is not one of the roles ({', '.join(ROLES)})")
    for a, tos in sorted(edges.items()):
        for b in sorted(tos):
            ra, rb = role(a), role(b)
            if ra is not None and rb is not None and ra < rb:
                problems.append(f"{src}: {'::'.join(a)} ({a[0]}) imports {'::'.join(b)} ({b[0]}), a higher role")
    # cycles: strongly connected components of more than one module
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
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
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(known):
        if v not in index:
            visit(v)
    for comp in comps:
        problems.append(f"{src}: an import cycle: {' ↔ '.join('::'.join(m) or 'crate' for m in comp)}")
    return edges, problems


def self_test():
    """The checker on small crates written for the purpose: each must find what it plants."""
    import tempfile

    def crate(files):
        d = pathlib.Path(tempfile.mkdtemp())
        for name, text in files.items():
            (d / name).parent.mkdir(parents=True, exist_ok=True)
            (d / name).write_text(text)
        return check(d)[1]

    base = {"lib.rs": "pub mod engine;\npub mod door;\n", "door/mod.rs": "use crate::engine::Engine;\n"}
    cases = [
        ("clean", {**base, "engine/mod.rs": "pub struct Engine;\n"}, None),
        ("upward", {**base, "engine/mod.rs": "use crate::door::X;\n"}, "a higher role"),
        ("upward, renamed in a group", {**base, "engine/mod.rs": "use crate::{door::X as Y};\n"}, "a higher role"),
        ("upward, nested group", {**base, "engine/mod.rs": "use crate::{door::{self, a::B as C}};\n"}, "a higher role"),
        ("upward through super", {**base, "engine/mod.rs": "pub mod inner;\n", "engine/inner.rs": "use super::super::door::X;\n"}, "a higher role"),
        ("upward in a string only", {**base, "engine/mod.rs": 'const S: &str = "crate::door::X";\n'}, None),
        ("the crate aliased", {**base, "engine/mod.rs": "use crate as root;\n"}, "names the crate"),
        ("a cycle", {"lib.rs": "pub mod engine;\n", "engine/mod.rs": "pub mod a;\npub mod b;\n", "engine/a.rs": "use crate::engine::b::X;\n", "engine/b.rs": "use crate::engine::a::Y;\n"}, "cycle"),
        ("a root module that is no role", {**base, "lib.rs": "pub mod engine;\npub mod door;\npub mod util;\n", "engine/mod.rs": "", "util.rs": ""}, "not one of the roles"),
    ]
    failed = 0
    for name, files, expect in cases:
        found = crate(files)
        ok = (not found) if expect is None else any(expect in p for p in found)
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {found or 'nothing found'}")
        failed += not ok
    if failed:
        sys.exit(1)


def main():
    if "--self-test" in sys.argv:
        return self_test()
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    show = "--edges" in sys.argv
    problems = []
    for src in args or DEFAULT:
        edges, found = check(pathlib.Path(src))
        problems += found
        if show:
            for a, tos in sorted(edges.items()):
                print(f"{'::'.join(a) or 'crate'} -> {', '.join('::'.join(b) or 'crate' for b in sorted(tos))}")
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        sys.exit(1)
    print(f"module graph: no cycles, no import from a lower role to a higher one ({', '.join(args or DEFAULT)})")


if __name__ == "__main__":
    main()
