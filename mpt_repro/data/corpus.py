"""Word-level corpora for the language-model task (PTB, WikiText, One Billion Word layouts).

A corpus is a folder with train.txt, valid.txt and test.txt: whitespace-separated tokens, one
sentence (or line) per line. Every line gets an end-of-sentence token. The vocabulary comes from
train only: words seen fewer than `min_freq` times, and words past the `max_vocab` most frequent,
become <unk>. Words are numbered by descending frequency, because the log-uniform (Zipfian)
sampler of the sampled softmax assumes exactly that order.

Without data.root the embedded corpus is used: King James Bible, Genesis and Exodus
(mpt_repro/data/embedded/README.md says where it comes from).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from mpt_repro.errors import ConfigError, DataError
from mpt_repro.safeio import open_regular

EOS = "<eos>"
UNK = "<unk>"
SPLITS = ("train", "valid", "test")
EMBEDDED_ROOT = Path(__file__).parent / "embedded" / "kjv"
LAYOUT = (
    "a folder with train.txt, valid.txt and test.txt (whitespace tokens, one sentence per line)"
)


@dataclass
class Vocab:
    words: list[str]  # index -> word, most frequent first
    counts: list[int]  # training-set count of each word (after the cut-off)

    def __post_init__(self) -> None:
        self.index = {w: i for i, w in enumerate(self.words)}

    def __len__(self) -> int:
        return len(self.words)

    @property
    def unk(self) -> int:
        return self.index[UNK]

    @property
    def eos(self) -> int:
        return self.index[EOS]

    def encode_file(self, path: Path) -> torch.Tensor:
        """A file as one stream of int32 ids, each line followed by <eos>.

        Streams the file (the One Billion Word training text is ~0.8G tokens: a Python list of
        it would not fit in memory); int32 halves the footprint of the id stream.
        """
        get, unk, eos = self.index.get, self.unk, self.eos

        def ids() -> Iterator[int]:
            for tokens in _token_lines(path):
                yield from (get(t, unk) for t in tokens)
                yield eos

        return torch.from_numpy(np.fromiter(ids(), dtype=np.int32))


def build_vocab(
    counts: Counter, num_lines: int, min_freq: int = 1, max_vocab: int | None = None
) -> Vocab:
    """Vocabulary from training-set token counts; `num_lines` is the count of <eos>."""
    if min_freq < 1:
        raise ConfigError(f"data.min_freq must be >= 1 (got {min_freq})")
    if max_vocab is not None and max_vocab < 3:
        raise ConfigError(
            "data.max_vocab must be >= 3 or null: it holds <unk>, <eos> and words (got "
            f"{max_vocab})"
        )
    counts = Counter(counts)
    # PTB's files already contain <unk>; its count joins the words we cut.
    unk_count = counts.pop(UNK, 0)
    counts.pop(EOS, None)
    # Most frequent first; ties by the word itself, so the numbering never depends on file order.
    ranked = sorted(counts.items(), key=lambda wc: (-wc[1], wc[0]))
    kept = [(w, c) for w, c in ranked if c >= min_freq]
    if max_vocab is not None:
        kept = kept[: max_vocab - 2]  # room for <unk> and <eos>
    unk_count += sum(counts.values()) - sum(c for _, c in kept)
    entries = kept + [(EOS, num_lines), (UNK, unk_count)]
    entries.sort(key=lambda wc: (-wc[1], wc[0]))
    return Vocab([w for w, _ in entries], [c for _, c in entries])


def _token_lines(path: Path) -> Iterator[list[str]]:
    """The non-blank lines of a file, split on whitespace. A file that is not UTF-8 is refused
    with the place of its first bad byte (a UnicodeDecodeError alone names neither)."""
    try:
        with open_regular(path, "r", encoding="utf-8") as f:
            for line in f:
                tokens = line.split()
                if tokens:
                    yield tokens
    except UnicodeDecodeError as e:
        raise DataError(_not_utf8(path, e)) from None


def _not_utf8(path: Path, error: UnicodeDecodeError) -> str:
    """Where the first byte that is not UTF-8 sits (byte offset, line, column), and what to do."""
    bad = _first_bad_utf8(path)
    if bad is None:  # decodable after all (the file changed?): report what Python saw
        return f"{path} is not UTF-8 text ({error}); convert it to UTF-8"
    line, column, byte = 1, 1, b""
    with open_regular(path, "rb") as f:
        remaining = bad
        while remaining > 0:
            chunk = f.read(min(1 << 20, remaining))
            remaining -= len(chunk)
            last = chunk.rfind(b"\n")
            line += chunk.count(b"\n")
            column = len(chunk) - last if last >= 0 else column + len(chunk)
        byte = f.read(1)
    return (
        f"{path} is not UTF-8 text: byte 0x{byte.hex()} at byte offset {bad} (line {line}, "
        f"column {column}) is not valid UTF-8 ({error.reason}). Corpus files must be UTF-8: "
        f"convert the file from its real encoding, e.g. `iconv -f latin1 -t utf-8 {path} > "
        f"{path.name}.utf8`, and put the result in its place"
    )


def _first_bad_utf8(path: Path) -> int | None:
    """Byte offset of the first invalid UTF-8 sequence, reading in chunks (a corpus can be GBs)."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")()
    fed = 0  # bytes given to the decoder before this chunk
    with open_regular(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            held = len(decoder.getstate()[0])  # an unfinished character from the last chunk
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as e:  # e.start counts from the held bytes
                return fed - held + e.start
            if not chunk:
                return None
            fed += len(chunk)


class Corpus:
    """The three splits of a folder as id streams, with the vocabulary built from train."""

    def __init__(self, root: str | Path | None, min_freq: int = 1, max_vocab: int | None = None):
        self.embedded = root is None
        self.root = EMBEDDED_ROOT if root is None else Path(root).expanduser()
        if not self.root.is_dir():
            raise DataError(f"data.root={str(self.root)!r} is not a folder; expected {LAYOUT}")
        self.paths = paths = {split: self.root / f"{split}.txt" for split in SPLITS}
        for path in paths.values():
            if not path.is_file():
                raise DataError(f"{path} is missing; data.root must be {LAYOUT}")
            if next(_token_lines(path), None) is None:
                raise DataError(f"{path} is empty; data.root must be {LAYOUT}")
        counts, num_lines = Counter(), 0
        for tokens in _token_lines(paths["train"]):
            counts.update(tokens)
            num_lines += 1
        self.vocab = build_vocab(counts, num_lines, min_freq, max_vocab)
        self.train, self.valid, self.test = (self.vocab.encode_file(paths[s]) for s in SPLITS)

    def unk_rate(self, split: str = "valid") -> float:
        ids = getattr(self, split)
        return float((ids == self.vocab.unk).float().mean())


def batchify(
    ids: torch.Tensor, batch_size: int, source: str = "", advice: str = ""
) -> torch.Tensor:
    """Cut the stream into `batch_size` contiguous streams: a (steps, batch_size) tensor.

    Column j continues from one BPTT window to the next, which is what lets the hidden state be
    carried across batches. The tail that does not fill a whole row is dropped. Too few tokens
    (fewer than 2 per stream: no window to train or score) is a DataError naming `source` (the
    file and the settings that cut it) and `advice` (what to do).
    """
    steps = ids.numel() // batch_size
    if steps < 2:
        raise DataError(
            f"{source + ': ' if source else ''}{ids.numel()} tokens are too few for "
            f"{batch_size} parallel streams (need 2 per stream){'; ' + advice if advice else ''}"
        )
    return ids[: steps * batch_size].view(batch_size, steps).t().contiguous()


def shard_streams(streams: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """This process's share of the parallel streams: the r-th of `world_size` contiguous blocks
    of columns (as even as possible; empty when there are fewer streams than processes).

    Data-parallel training batchifies the text into the global batch's streams and gives each
    rank a disjoint block of them, so the ranks together train on exactly the windows a single
    process with the global batch trains on. Every rank keeps all the rows (time steps): the
    windows, and so the steps per epoch and a resumed run's skip, are the same on every rank.
    """
    return torch.tensor_split(streams, world_size, dim=1)[rank].contiguous()


def num_bptt_batches(streams: torch.Tensor, seq_len: int) -> int:
    return -(-(streams.size(0) - 1) // seq_len)  # ceil: the last window may be shorter


def bptt_batches(
    streams: torch.Tensor, seq_len: int, skip: int = 0
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(input, target) windows of `seq_len` steps as int64; the target is the input shifted by one
    token.
    """
    for start in range(skip * seq_len, streams.size(0) - 1, seq_len):
        n = min(seq_len, streams.size(0) - 1 - start)
        yield streams[start : start + n].long(), streams[start + 1 : start + 1 + n].long()
