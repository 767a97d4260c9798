#!/usr/bin/env python3
"""Checks every relative link in the repository's Markdown (README, ARCHITECTURE, SECURITY,
CHANGELOG, CONTRIBUTING and the book under docs/src): the file must exist and an `#anchor` must
name a heading in it (GitHub's and mdBook's slug rule). Exits 1 listing each broken link."""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"(?<!\!)\[[^\]]*\]\(([^)\s]+)\)|\!\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading):
    text = re.sub(r"`|\*|_(?=\w)|(?<=\w)_", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def text_of(path):
    """A file's text with mdBook's `{{#include FILE}}` lines replaced by that file."""
    out = []
    for line in path.read_text().splitlines():
        m = re.match(r"^\{\{#include (\S+)\}\}$", line.strip())
        out.extend(text_of((path.parent / m.group(1)).resolve()).splitlines() if m else [line])
    return "\n".join(out)


def anchors(path):
    found, fence = set(), False
    for line in text_of(path).splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and re.match(r"^#{1,6} ", line):
            found.add(slug(line.lstrip("#")))
    return found


def main():
    files = [ROOT / n for n in ("README.md", "ARCHITECTURE.md", "SECURITY.md", "CHANGELOG.md", "CONTRIBUTING.md")]
    files += sorted((ROOT / "docs" / "src").rglob("*.md"))
    broken = []
    for f in files:
        if not f.exists():
            broken.append(f"{f.relative_to(ROOT)}: missing")
            continue
        # Code blocks hold no links; blanked, so line numbers stay right. A link may wrap.
        kept, fence = [], False
        for line in f.read_text().splitlines():
            if line.startswith("```"):
                fence = not fence
                line = ""
            kept.append("" if fence else line)
        text = "\n".join(kept)
        for m in LINK.finditer(text):
            n = text.count("\n", 0, m.start()) + 1
            target = m.group(1) or m.group(2)
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (f.parent / path).resolve() if path else f
            if not dest.exists():
                broken.append(f"{f.relative_to(ROOT)}:{n}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{f.relative_to(ROOT)}:{n}: {target}: no such heading")
    for b in broken:
        print(b)
    if broken:
        sys.exit(1)
    print(f"doc links: {len(files)} files, every relative link resolves")


if __name__ == "__main__":
    main()
