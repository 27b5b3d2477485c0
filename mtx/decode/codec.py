"""A model's text and ids, both ways (`Codec`): a source line encoded as the model reads it (a
target language's tag or an NLLB source code first, cut to what the model takes, EOS last),
what the decoder reads after its start token (an NLLB target code), a target text's ids, and
ids back to text. Read-only: a Translator's (translator.py), the scorer's (score.py) and the
server's own process's (serve/front.py, which counts source tokens with it). This module
imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mtx.decode.languages import Languages
from mtx.tokens import EOS_ID, encode_line


@dataclass(frozen=True)
class Codec:
    vocab: Any  # the vocabulary (data/vocab.py: SentencePiece, or a pair for an import)
    languages: Languages  # the language scheme (languages.py)
    max_positions: int  # the longest source the model takes, EOS included

    def encode(self, line: str, tgt_lang: str | None = None) -> list[int]:
        """A source line's ids, translating into `tgt_lang` (None: the model's one)."""
        prefix = self.languages.source_prefix(tgt_lang)
        return encode_line(self.vocab.source, line, self.max_positions, prefix)

    def length(self, line: str) -> int:
        """The ids of a source line whatever its target (a tag or a code is one piece): what
        the server's batches count before the target is known."""
        prefix = self.languages.any_prefix()
        return len(encode_line(self.vocab.source, line, self.max_positions, prefix))

    def start(self, tgt_lang: str | None = None) -> tuple[int, ...]:
        """What the decoder reads after its start token (request.py's Request.start): an NLLB
        model's target-language code; nothing for the others."""
        return self.languages.start(tgt_lang)

    def target(self, text: str) -> list[int]:
        """A target text's ids (whitespace normalised) and EOS."""
        return self.vocab.target.encode(" ".join(text.split())) + [EOS_ID]

    def detokenize(self, ids: list[int] | tuple[int, ...]) -> str:
        """Output ids as text, whitespace normalised (never a newline inside a line)."""
        return " ".join(self.vocab.decode(list(ids)).split())

    def piece(self, i: int) -> str:
        return self.vocab.id_to_piece(i)
