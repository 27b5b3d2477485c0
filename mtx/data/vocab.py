"""A model's vocabulary: its id table, and how source and target text become ids.

Two kinds, one interface (`Vocabulary`), stored in checkpoints and prepared data as bytes:

- mtx's own (`Joint`): one SentencePiece BPE model trained here for source and target; the
  model's ids are SentencePiece's, 0-3 fixed (pad, unk, bos, eos: `mtx.tokens`). Stored as
  the SentencePiece model proto.
- an imported model's (`Paired`, mtx/formats/): a source and a target SentencePiece model
  over one table of pieces (OPUS-MT's `source.spm`, `target.spm` and `vocab.json`; NLLB's one
  `sentencepiece.bpe.model` for both sides, fairseq's ids and the language codes). Text is
  segmented by its side's model and each piece looked up in the table, a piece the table lacks
  being UNK, as `MarianTokenizer` does. The table is held in mtx's order (the import permutes
  the ids so that PAD, UNK and EOS are 0, 1 and 3; see mtx/formats/marian.py). Stored as a
  zip of `table.json`, `source.spm`, `target.spm` (and an NLLB model's tokenizer files, under
  `files/`, for its export), written byte for byte the same for the same vocabulary.
"""

from __future__ import annotations

import io
import itertools
import json
import zipfile
from collections.abc import Iterable
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import sentencepiece as spm

from mtx.errors import MtxError
from mtx.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

MAX_SENTENCE_BYTES = 1 << 16  # SentencePiece's max_sentence_length here
SKIPPED = "\u2585"  # SentencePiece skips a training sentence holding this (its kUNKStr)
COUNT_BATCH = 100_000  # sentences whose words are counted at a time


def train_bpe(
    sentences: Iterable[str],
    vocab_size: int,
    sample: int,
    character_coverage: float,
    reserved: list[str] | None = None,
) -> bytes:
    """Train a BPE model on `sentences` (source and target text mixed, at most `sample` of
    them where `sample` is not 0: SentencePiece samples no further); returns the model proto.
    `reserved` pieces (target-language tags) get the ids after the fixed four, and are never
    split or merged with text.

    SentencePiece is given each distinct word with its count (`word_counts`, its "tsv" input)
    rather than the sentences: its BPE trainer counts the words of its normalised sentences
    and learns from those counts alone, so the model is the one the sentences give (the
    pieces, scores and proto's bytes; tested), while memory holds the distinct words and not
    millions of sentences."""
    model = io.BytesIO()
    counts = word_counts(sentences)
    spm.SentencePieceTrainer.train(
        sentence_iterator=(f"{word}\t{n}" for word, n in sorted(counts.items())),
        input_format="tsv",
        model_writer=model,
        model_type="bpe",
        vocab_size=vocab_size,
        hard_vocab_limit=False,  # small corpora may support fewer pieces than asked
        character_coverage=character_coverage,
        input_sentence_size=0,  # every distinct word
        shuffle_input_sentence=True,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        max_sentence_length=MAX_SENTENCE_BYTES,
        user_defined_symbols=reserved or [],
        num_threads=2,
        minloglevel=2,
    )
    return _as_from_sentences(model.getvalue(), sample)


def word_counts(sentences: Iterable[str]) -> dict[str, int]:
    """How often each word of `sentences` occurs. A word is what lies between spaces and tabs,
    both of which SentencePiece's normaliser (nmt_nfkc) turns into the whitespace it splits
    words at; whatever else the normaliser does (another space, a character it drops or
    maps to a space) it does to each word alone as to the sentence, and a word it splits the
    trainer splits again. The sentences SentencePiece itself would skip (longer than
    MAX_SENTENCE_BYTES, or holding SKIPPED) are skipped."""
    counts: dict[str, int] = {}
    batch: list[str] = []
    for sentence in itertools.chain(sentences, [None]):
        if sentence is not None:
            batch.append(sentence)
            if len(batch) < COUNT_BATCH:
                continue
        if batch:
            texts = pa.array(batch, type=pa.string())
            kept = pc.and_(
                pc.less_equal(pc.binary_length(texts), MAX_SENTENCE_BYTES),
                pc.invert(pc.match_substring(texts, SKIPPED)),
            )
            words = pc.list_flatten(pc.split_pattern(pc.replace_substring(
                texts.filter(kept), "\t", " "), " "))  # fmt: skip
            found = pc.value_counts(words)
            for word, n in zip(
                found.field("values").to_pylist(), found.field("counts").to_pylist()
            ):
                if word:
                    counts[word] = counts.get(word, 0) + n
        batch = []
    return counts


def _as_from_sentences(proto: bytes, sample: int) -> bytes:
    """The model proto with the trainer settings that training on the sentences records
    (text input, `sample` sentences at most): the same bytes as that training's."""
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto.FromString(proto)
    model.trainer_spec.ClearField("input_format")
    model.trainer_spec.input_sentence_size = sample
    return model.SerializeToString()


def load_spm(model_proto: bytes) -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_proto=model_proto)


class Mapped:
    """A SentencePiece model whose pieces are looked up in a table of pieces (its own pieces,
    ids and normalisation are SentencePiece's; `encode` gives the table's ids)."""

    def __init__(self, sp: spm.SentencePieceProcessor, index: dict[str, int]) -> None:
        self.sp, self.index = sp, index
        size = sp.get_piece_size()
        self.to_table = np.array([index.get(sp.id_to_piece(i), UNK_ID) for i in range(size)])
        self.normalize, self.piece_to_id = sp.normalize, sp.piece_to_id
        self.unk_id, self.id_to_piece, self.get_piece_size = (
            sp.unk_id,
            sp.id_to_piece,
            sp.get_piece_size,
        )

    def encode(self, text: str | list[str], num_threads: int = 1) -> list[int] | list[list[int]]:
        """The table's ids of `text` (or of each text of a list)."""
        texts = [text] if isinstance(text, str) else text
        out = [
            self._ids(t, ids)
            for t, ids in zip(texts, self.sp.encode(texts, num_threads=num_threads))
        ]
        return out[0] if isinstance(text, str) else out

    def _ids(self, text: str, ids: list[int]) -> list[int]:
        if self.sp.unk_id() not in ids:
            return self.to_table[ids].tolist()
        # an unknown character's piece is its own text, which the table may hold
        return [self.index.get(p, UNK_ID) for p in self.sp.encode(text, out_type=str)]


class Vocabulary(Protocol):
    """The id table of a model (`get_piece_size()` pieces, `id_to_piece`, `piece_to_id`, which
    ids are special), the segmenters of its `source` and `target` text (each with
    `encode(text or texts)` giving table ids, and `normalize`), `decode` of output ids into
    target text, and `blob`, the bytes it is stored as. The methods keep SentencePiece's
    names: mtx's own vocabulary is its SentencePiece model."""

    blob: bytes
    source: spm.SentencePieceProcessor | Mapped
    target: spm.SentencePieceProcessor | Mapped
    origin: list[int]  # each id's in the model it was imported from (mtx's own: itself)
    decoder_start: str  # what model.decoder_start must be with it (mtx/tokens.py's SPECIALS)
    kind: str  # what it is, in words
    family: str  # "mtx", "marian" or "nllb": how languages are named (see `languages`)
    # NLLB's: {language code: its id}; a source starts with its language's code, the decoder
    # reads the target's after its start token. Empty for the others (mtx's and MarianMT's
    # multilingual models put a >>xx<< tag first in the source: corpora.py)
    languages: dict[str, int]
    models: tuple[bytes, bytes]  # the source and the target SentencePiece model protos

    def get_piece_size(self) -> int: ...

    def id_to_piece(self, i: int) -> str: ...

    def piece_to_id(self, piece: str) -> int: ...

    def is_control(self, i: int) -> bool: ...

    def is_unknown(self, i: int) -> bool: ...

    def decode(self, ids: list[int]) -> str: ...


class Joint:
    """mtx's own: one SentencePiece model for both sides, its ids the table's."""

    def __init__(self, blob: bytes) -> None:
        self.blob, self.models = blob, (blob, blob)
        self.sp = self.source = self.target = load_spm(blob)
        self.origin = list(range(self.sp.get_piece_size()))
        self.decoder_start, self.kind = "bos", "mtx's own SentencePiece model"
        self.family, self.languages = "mtx", {}

    def get_piece_size(self) -> int:
        return self.sp.get_piece_size()

    def id_to_piece(self, i: int) -> str:
        return self.sp.id_to_piece(i)

    def piece_to_id(self, piece: str) -> int:
        return self.sp.piece_to_id(piece)

    def is_control(self, i: int) -> bool:
        return self.sp.is_control(i)

    def is_unknown(self, i: int) -> bool:
        return self.sp.is_unknown(i)

    def decode(self, ids: list[int]) -> str:
        return self.sp.decode(ids)


TABLE, SOURCE, TARGET, FILES = "table.json", "source.spm", "target.spm", "files/"


FAMILIES = {  # family: (decoder_start, kind)
    "marian": ("pad", "an imported MarianMT model's"),  # no BOS: id 2 is a piece
    "nllb": ("eos", "an imported NLLB (M2M100) model's"),  # fairseq's: the decoder starts at EOS
}


class Paired:
    """An imported vocabulary: a source and a target SentencePiece model (the same one for
    NLLB) over one table of pieces."""

    def __init__(
        self,
        pieces: list[str],
        source: bytes,
        target: bytes,
        specials: list[int],
        origin: list[int],
        blob: bytes | None = None,
        family: str = "marian",
        languages: dict[str, int] | None = None,
        files: dict[str, bytes] | None = None,
    ) -> None:
        """`pieces` in our id order; `specials`: the ids decoding leaves out; `origin`: each
        id's in the imported model; `blob`: what they were read from (None: zip them);
        `family`: the model's (FAMILIES); `languages`: NLLB's language codes' ids; `files`:
        the imported tokenizer's other files (NLLB's tokenizer.json...), kept for the export."""
        self.pieces, self.specials, self.origin = pieces, set(specials), origin
        self.family, self.languages = family, dict(languages or {})
        self.decoder_start, self.kind = FAMILIES[family]
        self.models = (source, target)
        self.files = dict(files or {})
        self.index = {p: i for i, p in enumerate(pieces)}
        if len(self.index) != len(pieces):
            raise MtxError("the vocabulary holds a piece twice")
        self.source = Mapped(load_spm(source), self.index)
        self.target = Mapped(load_spm(target), self.index)
        table = {"pieces": pieces, "specials": specials, "origin": origin}
        if family != "marian":  # a MarianMT vocabulary's zip stays as it was
            table |= {"family": family, "languages": self.languages}
        stored = {TABLE: json.dumps(table).encode(), SOURCE: source, TARGET: target}
        stored |= {FILES + name: data for name, data in sorted(self.files.items())}
        self.blob = blob or _zip(stored)

    def get_piece_size(self) -> int:
        return len(self.pieces)

    def id_to_piece(self, i: int) -> str:
        return self.pieces[i]

    def piece_to_id(self, piece: str) -> int:
        return self.index.get(piece, UNK_ID)

    def is_control(self, i: int) -> bool:
        return i in self.specials and i != UNK_ID

    def is_unknown(self, i: int) -> bool:
        return i == UNK_ID

    def decode(self, ids: list[int]) -> str:
        """The target text of `ids`, special ids left out, as MarianTokenizer's decode with
        skip_special_tokens gives it: the target model's decoding, then every word boundary
        mark left a space (a piece the table has from the source model and the target model
        lacks is decoded as it is written, its ▁ kept; OPUS-MT's vocabularies are joint)."""
        pieces = [self.pieces[i] for i in ids if i not in self.specials]
        return self.target.sp.decode_pieces(pieces).replace("\u2581", " ").strip()


def check_decoder_start(v: Vocabulary, decoder_start: str) -> None:
    """Refuse a model whose decoder starts otherwise than its vocabulary wants."""
    if decoder_start != v.decoder_start:
        raise MtxError(
            f"model.decoder_start is {decoder_start}, but the vocabulary ({v.kind}) needs "
            f"{v.decoder_start}: set model.decoder_start={v.decoder_start}"
        )


def _zip(files: dict[str, bytes]) -> bytes:
    """The files in a zip, byte for byte the same for the same files (fixed dates, order)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
    return out.getvalue()


def load(blob: bytes) -> Vocabulary:
    """The vocabulary stored as `blob` (a SentencePiece model proto, or a `Paired` zip)."""
    if not blob.startswith(b"PK"):
        return Joint(blob)
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        table = json.loads(z.read(TABLE))
        return Paired(
            table["pieces"],
            z.read(SOURCE),
            z.read(TARGET),
            table["specials"],
            table["origin"],
            blob,
            table.get("family", "marian"),
            table.get("languages"),
            {n.removeprefix(FILES): z.read(n) for n in z.namelist() if n.startswith(FILES)},
        )
