"""Parallel corpora for the translation task (the paper's §4.4: English->French on WMT15), read
as the TensorFlow seq2seq tutorial reads them (tensorflow/models tutorials/rnn/translate,
data_utils.py and translate.py @006649f; docs/experiments_translation.md).

Layout: plain-text files, one sentence per line, line n of the source file translating line n
of the target file, named <prefix>.<lang>:

    DIR/giga-fren.release2.fixed.en   DIR/giga-fren.release2.fixed.fr   training (WMT's 10^9 corpus)
    DIR/newstest2013.en               DIR/newstest2013.fr               development (WMT15 dev-v2)

Each file may also be gzipped (<name>.gz, as training-giga-fren.tar holds them) and the dev files
may sit in DIR/dev/ (as dev-v2.tgz unpacks). data.root names DIR; with data.root null, an embedded
corpus of that name (data=bible_enes: mpt_repro/data/embedded/bible_enes/, train.{en,es}.gz and
dev.{en,es}.gz, English -> Spanish verse pairs; mpt_repro/data/embedded/README.md).

Tokenisation is the tutorial's basic_tokenizer reimplemented: split on whitespace, then split
each fragment on the punctuation characters . , ! ? " ' : ; ) ( keeping them as tokens; with
data.normalize_digits every digit becomes 0 before the vocabulary lookup. The tutorial runs its
regular expressions on bytes (data_utils.py L45-46, `_WORD_SPLIT` and `_DIGIT_RE` are bytes
patterns; create_vocabulary opens the file "rb", L136), so whitespace is ASCII's six characters
and a digit is 0-9. data.tokenizer=bytes (the default) does exactly that: since UTF-8 never puts
an ASCII byte inside a multi-byte character, splitting the decoded text at those ASCII
characters gives the tokens splitting the bytes does. data.tokenizer=text applies Python's
Unicode rules instead: str.split() also splits at U+00A0 (frequent in giga-fren's French side),
U+0085, U+2009, U+3000, U+001C-U+001F..., and \\d maps every Unicode decimal digit (Arabic-Indic,
full-width, ...) to 0; its vocabularies differ from the tutorial's
(docs/experiments_translation.md#tokenisation measures by how much). Lines end at "\n" only, as
the tutorial's binary reads split them (a lone "\r" inside a line is whitespace, not a new line
that would shift every later pair). Each language's
vocabulary is _PAD, _GO, _EOS, _UNK followed by its training tokens by descending count (ties in
order of first appearance, as Python's stable sort leaves them in the tutorial), cut at the
model's vocabulary size.

A pair goes into the first bucket (S, T) with len(source) < S and len(target + _EOS) < T, as
the tutorial's read_data does; pairs that fit no bucket are left out (so are they there).
"""

from __future__ import annotations

import gzip
import io
import re
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import Any

import torch

from mpt_repro.data import data_root
from mpt_repro.errors import DataError
from mpt_repro.safeio import open_regular

PAD, GO, EOS, UNK = "_PAD", "_GO", "_EOS", "_UNK"
SPECIALS = [PAD, GO, EOS, UNK]
PAD_ID, GO_ID, EOS_ID, UNK_ID = range(4)
# data.name -> the folder of the corpus shipped with the package, read when data.root is null
EMBEDDED = {"bible_enes": Path(__file__).parent / "embedded" / "bible_enes"}

_WORD_SPLIT = re.compile(r"""([.,!?"':;)(])""")  # the tutorial's _WORD_SPLIT
# data.tokenizer -> (what str.strip strips and split splits at, the digits that become 0)
_ASCII_WHITESPACE = " \t\n\r\x0b\x0c"  # bytes.split()'s whitespace: Python's bytes.isspace()
TOKENIZERS = {
    "bytes": (re.compile(f"[{_ASCII_WHITESPACE}]+"), re.compile(r"[0-9]")),  # the tutorial's
    "text": (None, re.compile(r"\d")),  # Unicode: str.split() and \d on str
}


def layout(d: Any) -> str:
    """The expected layout, for error messages."""
    files = ", ".join(
        f"{prefix}.{lang}"
        for prefix in (d.train_prefix, d.dev_prefix)
        for lang in (d.source_lang, d.target_lang)
    )
    return (
        f"a folder with {files} (plain text, one sentence per line, aligned line by line; "
        "each may be gzipped as <name>.gz, the dev files may be in dev/ as WMT's dev-v2.tgz "
        "unpacks)"
    )


# -- tokens and vocabularies -----------------------------------------------------------------------
def basic_tokenizer(sentence: str, tokenizer: str = "bytes") -> list[str]:
    """The tutorial's basic_tokenizer: whitespace, then punctuation kept as tokens; whitespace
    as `tokenizer` (data.tokenizer) defines it."""
    space = TOKENIZERS[tokenizer][0]
    fragments = sentence.split() if space is None else space.split(sentence)
    words: list[str] = []
    for fragment in fragments:
        words.extend(_WORD_SPLIT.split(fragment))
    return [w for w in words if w]  # the empty ends the split leaves at leading/trailing space


def tokenize(sentence: str, normalize_digits: bool, tokenizer: str = "bytes") -> list[str]:
    tokens = basic_tokenizer(sentence, tokenizer)
    digit = TOKENIZERS[tokenizer][1]
    return [digit.sub("0", t) for t in tokens] if normalize_digits else tokens


@dataclass
class Vocab:
    words: list[str]  # id -> token: the four specials, then by descending training count

    def __post_init__(self) -> None:
        self.index = {w: i for i, w in enumerate(self.words)}

    def __len__(self) -> int:
        return len(self.words)

    def encode(self, tokens: Iterable[str]) -> list[int]:
        get = self.index.get
        return [get(t, UNK_ID) for t in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        return [self.words[i] for i in ids]


def build_vocab(sentences: Iterable[list[str]], size: int) -> Vocab:
    """The tutorial's create_vocabulary: specials first, then tokens by descending count, ties in
    order of first appearance (sorted() is stable over a dict's insertion order), cut at `size`."""
    counts: Counter = Counter()
    for tokens in sentences:
        counts.update(tokens)
    return vocab_from_counts(counts, size)


def vocab_from_counts(counts: Counter, size: int) -> Vocab:
    """Counter keeps first-seen order, and sorted() is stable: ties stay in that order."""
    ranked = sorted(counts, key=counts.__getitem__, reverse=True)
    return Vocab((SPECIALS + [w for w in ranked if w not in SPECIALS])[:size])


# -- files -----------------------------------------------------------------------------------------
def find_file(root: Path, name: str) -> Path | None:
    for folder in (root, root / "dev"):
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    return None


def read_lines(path: Path, limit: int | None = None) -> Iterator[str]:
    """The first `limit` lines (all when None) of a UTF-8 file, gzipped or not, streamed: the
    giga-fren files are 22.5M lines each."""
    try:
        with open_regular(path, "rb") as handle:  # a FIFO is refused, never waited on
            opened = gzip.open(handle, "rb") if path.suffix == ".gz" else handle
            # newline="\n": lines end where the tutorial's binary reads end them (not at a \r)
            with opened as raw, io.TextIOWrapper(raw, encoding="utf-8", newline="\n") as f:
                for n, line in enumerate(f):
                    if limit is not None and n >= limit:
                        return
                    yield line.rstrip("\n")
    except (UnicodeDecodeError, OSError, EOFError) as e:
        raise DataError(f"{path}: not readable UTF-8 text ({type(e).__name__}: {e})") from None


def corpus_root(d: Any) -> Path:
    """data.root as a folder, or the embedded corpus of data.name when data.root is null."""
    if d.root is None and d.name in EMBEDDED:
        return EMBEDDED[d.name]
    return data_root(d.root, d.name, layout(d))


def read_pairs(d: Any, root: Path, prefix: str, limit: int | None) -> Iterator[tuple[str, str]]:
    """(source, target) sentences of one split (the first `limit` lines), streamed; DataError
    when a file is missing, empty, or the two differ in line count."""
    paths = split_files(d, root, prefix)
    count = 0
    for source, target in zip_longest(*(read_lines(p, limit) for p in paths)):
        if source is None or target is None:  # one file ended first: count both, to say so
            lines = [sum(1 for _ in read_lines(p, limit)) for p in paths]
            raise DataError(
                f"{paths[0]} has {lines[0]} lines but {paths[1]} has {lines[1]}"
                f"{f' (of the first {limit})' if limit else ''}: a parallel corpus needs one "
                "line per sentence in both languages, aligned"
            )
        count += 1
        yield source, target
    if count == 0:
        raise DataError(f"{paths[0]} is empty; expected {layout(d)}")


def split_files(d: Any, root: Path, prefix: str) -> list[Path]:
    """The source and target files of one split; DataError naming the layout if one is missing."""
    paths = []
    for lang in (d.source_lang, d.target_lang):
        path = find_file(root, f"{prefix}.{lang}")
        if path is None:
            raise DataError(
                f"data.root={str(root)!r} has no {prefix}.{lang} (nor .gz, nor in dev/); "
                f"expected {layout(d)}"
            )
        paths.append(path)
    return paths


# -- buckets and batches ---------------------------------------------------------------------------
def bucket_of(source_len: int, target_len: int, buckets: Sequence[Sequence[int]]) -> int | None:
    """The first bucket (S, T) with source_len < S and target_len < T (target_len counts _EOS),
    or None."""
    for i, (s, t) in enumerate(buckets):
        if source_len < s and target_len < t:
            return i
    return None


class PairStore:
    """One bucket's pairs in flat int32 arrays: a Python list of lists would take ~50 GB for
    giga-fren's 22.5M pairs, this ~5 GB. store[i] is (source ids, target ids + _EOS)."""

    def __init__(self) -> None:
        self.source, self.target = array("i"), array("i")
        self.source_end, self.target_end = array("q", [0]), array("q", [0])

    def append(self, pair: tuple[list[int], list[int]]) -> None:
        self.source.extend(pair[0])
        self.target.extend(pair[1])
        self.source_end.append(len(self.source))
        self.target_end.append(len(self.target))

    def __len__(self) -> int:
        return len(self.source_end) - 1

    def __getitem__(self, i: int) -> tuple[list[int], list[int]]:
        if not 0 <= i < len(self):
            raise IndexError(i)
        s, t = self.source_end, self.target_end
        return self.source[s[i] : s[i + 1]].tolist(), self.target[t[i] : t[i + 1]].tolist()

    def __iter__(self) -> Iterator[tuple[list[int], list[int]]]:
        return (self[i] for i in range(len(self)))


@dataclass
class Bucketed:
    """Token-id pairs by bucket: pairs[b][i] is (source ids, target ids + _EOS)."""

    buckets: list[tuple[int, int]]
    pairs: list[PairStore] = field(default_factory=list)
    dropped: int = 0  # pairs too long for the largest bucket

    def __len__(self) -> int:
        return sum(len(p) for p in self.pairs)


def bucketize(
    pairs: Iterable[tuple[list[int], list[int]]], buckets: Sequence[Sequence[int]]
) -> Bucketed:
    """Each pair (target without _EOS) into its bucket, _EOS appended to the target."""
    out = Bucketed([(int(s), int(t)) for s, t in buckets])
    out.pairs = [PairStore() for _ in out.buckets]
    for source, target in pairs:
        target = [*target, EOS_ID]
        b = bucket_of(len(source), len(target), out.buckets)
        if b is None:
            out.dropped += 1
        else:
            out.pairs[b].append((source, target))
    return out


def pad_batch(
    pairs: Sequence[tuple[list[int], list[int]]], bucket: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A bucket's pairs as the tutorial's get_batch lays them out, batch-major:
    encoder input = (source + _PAD...) reversed, length S; decoder input = _GO + target + _PAD...,
    length T; the targets are the decoder input shifted by one (the last one _PAD), and a _PAD
    target has weight 0 (the mask is targets != _PAD)."""
    s_len, t_len = bucket
    enc = [list(reversed(src + [PAD_ID] * (s_len - len(src)))) for src, _ in pairs]
    dec = [[GO_ID, *tgt] + [PAD_ID] * (t_len - len(tgt) - 1) for _, tgt in pairs]
    targets = [row[1:] + [PAD_ID] for row in dec]
    as_long = lambda rows: torch.tensor(rows, dtype=torch.long)  # noqa: E731
    return as_long(enc), as_long(dec), as_long(targets)


def epoch_batches(
    data: Bucketed, batch_size: int, generator: torch.Generator
) -> list[tuple[int, list[int]]]:
    """An epoch as (bucket, indices) batches: each bucket shuffled and cut into full batches,
    the batches of all buckets shuffled together. Every pair is seen once per epoch; the tutorial
    instead draws a bucket in proportion to its size and a batch with replacement from it, which
    has the same expected bucket mix."""
    batches = []
    for b, pairs in enumerate(data.pairs):
        order = torch.randperm(len(pairs), generator=generator).tolist()
        batches += [
            (b, order[i : i + batch_size])
            for i in range(0, len(order) - batch_size + 1, batch_size)
        ]
    shuffled = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[i] for i in shuffled]


def eval_batches(data: Bucketed, batch_size: int) -> Iterator[tuple[int, list[int]]]:
    """Every pair once, in file order within each bucket, in batches of up to batch_size."""
    for b, pairs in enumerate(data.pairs):
        for i in range(0, len(pairs), batch_size):
            yield b, list(range(i, min(i + batch_size, len(pairs))))


# -- the data sets ---------------------------------------------------------------------------------
@dataclass
class ParallelData:
    train: Bucketed
    eval: Bucketed
    source_vocab: Vocab
    target_vocab: Vocab
    references: list[list[str]]  # eval targets' tokens (before _UNK), per bucket pair, for BLEU
    description: str


def load_parallel(d: Any, source_size: int, target_size: int, buckets: Sequence) -> ParallelData:
    """A parallel corpus in the layout above: vocabularies from the training sentences (the first
    data.train_limit lines), the dev set's first data.eval_limit lines."""
    root = corpus_root(d)
    norm, how = d.normalize_digits, d.tokenizer

    def train_tokens() -> Iterator[tuple[list[str], list[str]]]:
        for source, target in read_pairs(d, root, d.train_prefix, d.train_limit):
            yield tokenize(source, norm, how), tokenize(target, norm, how)

    # two passes over the training files, as the tutorial's create_vocabulary and
    # data_to_token_ids make: counts first, then ids; no token list is held
    src_counts, tgt_counts = Counter(), Counter()
    for source, target in train_tokens():
        src_counts.update(source)
        tgt_counts.update(target)
    _check_not_blank(d, root, d.train_prefix, d.train_limit, src_counts, tgt_counts)
    src_vocab = vocab_from_counts(src_counts, source_size)
    tgt_vocab = vocab_from_counts(tgt_counts, target_size)
    train = bucketize(
        ((src_vocab.encode(s), tgt_vocab.encode(t)) for s, t in train_tokens()), buckets
    )
    dev_pairs = list(read_pairs(d, root, d.dev_prefix, d.eval_limit))  # small: kept, for BLEU
    dev_src_tok = [tokenize(s, norm, how) for s, _ in dev_pairs]
    dev_tgt_tok = [tokenize(t, norm, how) for _, t in dev_pairs]
    dev = bucketize(
        ((src_vocab.encode(s), tgt_vocab.encode(t)) for s, t in zip(dev_src_tok, dev_tgt_tok)),
        buckets,
    )
    # the references in the dev set's bucket order, as the words they are (not _UNK)
    references = _bucket_order(dev_tgt_tok, [len(s) for s in dev_src_tok], dev.buckets)
    _check_dev(d, root, len(dev_pairs), dev, references)
    where = f"embedded {d.name} (mpt_repro/data/embedded/README.md)" if d.root is None else root
    about = (
        f"parallel corpus at {where}: {d.train_prefix}.{d.source_lang}-{d.target_lang} "
        f"({len(train)} pairs in buckets, {train.dropped} too long), {d.dev_prefix} "
        f"({len(dev)} pairs, {dev.dropped} too long)"
    )
    return ParallelData(train, dev, src_vocab, tgt_vocab, references, about)


def _limited(n: int, limit: int | None, key: str, what: str = "sentence pairs") -> str:
    """How many were read, and the setting that cut them where it did."""
    return f"{n} {what}{f' (its first, {key}={limit})' if limit is not None and n >= limit else ''}"


def _check_not_blank(
    d: Any, root: Path, prefix: str, limit: int | None, source: Counter, target: Counter
) -> None:
    """Refuse training text without a token in one language: the model would learn to say
    _EOS, and its perplexity would look near perfect (a corpus of blank lines gave 1.008)."""
    for path, counts in zip(split_files(d, root, prefix), (source, target)):
        if not counts:
            lines = sum(1 for _ in read_lines(path, limit))
            raise DataError(
                f"{path}: each of its {_limited(lines, limit, 'data.train_limit', 'lines')} is "
                "blank (no token after tokenisation): there is nothing to translate; point "
                "data.root at a parallel corpus whose files hold sentences"
            )


def _check_dev(d: Any, root: Path, read: int, dev: Bucketed, references: list[list[str]]) -> None:
    """Refuse an evaluation with nothing to score while the data loads: no dev pair fits the
    largest bucket (evaluation would score 0 pairs), or every one that fits has a blank target
    (BLEU has no reference word, the perplexity scores only _EOS)."""
    source, target = split_files(d, root, d.dev_prefix)
    pairs = _limited(read, d.eval_limit, "data.eval_limit")
    if len(dev) == 0:
        s, t = dev.buckets[-1]
        raise DataError(
            f"{source}: none of its {pairs} fits a bucket of model.buckets (the largest, "
            f"[{s}, {t}], takes fewer than {s} source tokens and fewer than {t} target tokens "
            f"with _EOS), so evaluation would score nothing; add a larger bucket to "
            f"model.buckets, or use a dev set of shorter sentences"
        )
    if not any(references):
        raise DataError(
            f"{target}: the target of every dev pair that fits model.buckets ({len(dev)} of "
            f"{pairs}) is blank (no token after tokenisation): BLEU would have no reference "
            f"word and the perplexity would score only _EOS; point data.root at a corpus whose "
            f"{d.dev_prefix} files hold sentences"
        )


def _bucket_order(
    targets: list[list[str]], source_lens: list[int], buckets: list[tuple[int, int]]
) -> list[list[str]]:
    """Target token lists ordered as bucketize orders the pairs (bucket, then file order)."""
    per_bucket: list[list[list[str]]] = [[] for _ in buckets]
    for tokens, s_len in zip(targets, source_lens):
        b = bucket_of(s_len, len(tokens) + 1, buckets)
        if b is not None:
            per_bucket[b].append(tokens)
    return [t for part in per_bucket for t in part]


def synthetic_parallel(
    train_size: int, eval_size: int, source_size: int, target_size: int, buckets, seed: int
) -> ParallelData:
    """Random token pairs of lengths that fit the buckets: the target is the source's tokens
    mapped into the target vocabulary and reversed, so a model can learn something, and BLEU
    can rise above zero."""
    g = torch.Generator().manual_seed(seed)
    longest_src, longest_tgt = buckets[-1]
    max_len = max(1, min(longest_src - 1, longest_tgt - 2))
    vocab_words = lambda n: SPECIALS + [f"w{i}" for i in range(len(SPECIALS), n)]  # noqa: E731
    src_vocab, tgt_vocab = Vocab(vocab_words(source_size)), Vocab(vocab_words(target_size))

    def pairs(n: int) -> list[tuple[list[int], list[int]]]:
        out = []
        for _ in range(n):
            length = int(torch.randint(1, max_len + 1, (), generator=g))
            src = torch.randint(len(SPECIALS), source_size, (length,), generator=g).tolist()
            span = target_size - len(SPECIALS)
            tgt = [len(SPECIALS) + (i - len(SPECIALS)) % span for i in reversed(src)]
            out.append((src, tgt))
        return out

    train, dev = bucketize(pairs(train_size), buckets), bucketize(pairs(eval_size), buckets)
    references = [tgt_vocab.decode(t[:-1]) for part in dev.pairs for _, t in part]
    about = f"synthetic token pairs ({len(train)} train / {len(dev)} eval, reversed-copy targets)"
    return ParallelData(train, dev, src_vocab, tgt_vocab, references, about)
