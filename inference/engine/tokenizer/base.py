"""What every tokenizer offers the engine: encode, decode and per-token bytes."""

from __future__ import annotations

from collections.abc import Sequence

from .vocab import (
    ATTR_BYTE,
    ATTR_CONTROL,
    ATTR_NORMAL,
    ATTR_UNKNOWN,
    ATTR_USER_DEFINED,
    SPECIAL_ATTRS,
    TokenizerError,
    Vocabulary,
)

_HIDDEN_ATTRS = ATTR_UNKNOWN | ATTR_CONTROL


class Tokenizer:
    """A GGUF vocabulary that tokenizes exactly like llama.cpp.

    Attributes:
        vocab_size: number of tokens.
        bos_id / eos_id: special ids (``None`` when the vocabulary has none).
        add_bos: whether llama.cpp prepends BOS to prompts of this model.
        eog_ids: ids that end generation, decided as llama.cpp decides them.
    """

    def __init__(self, vocab: Vocabulary):
        self._vocab = vocab
        self.vocab_size = vocab.size
        self.bos_id = vocab.bos_id
        self.eos_id = vocab.eos_id
        self.add_bos = vocab.add_bos
        self.eog_ids: frozenset[int] = vocab.eog_ids
        self._plain_pieces: list[bytes | None] = [None] * vocab.size

    def encode(
        self, text: str, add_bos: bool = False, parse_special: bool = True, plain_mark: str | None = None
    ) -> list[int]:
        """Token ids of ``text``, as ``llama_tokenize(text, add_special=add_bos, parse_special)``.

        With ``parse_special`` the texts of control tokens (``<|im_start|>``...) become those
        tokens; user-defined tokens are recognized either way, as in llama.cpp. ``plain_mark``
        is the character :meth:`mark_plain` inserted: it is dropped from the text, and the
        control-token texts it broke are tokenized as plain text.
        """
        ids: list[int] = []
        if add_bos:
            if self.bos_id is None:
                raise TokenizerError("add_bos requested but the vocabulary has no BOS token")
            ids.append(self.bos_id)
        after_special = True
        for fragment in self._vocab.partition(text, parse_special):
            if isinstance(fragment, int):
                ids.append(fragment)
                after_special = True
            else:
                if plain_mark is not None:
                    fragment = fragment.replace(plain_mark, "")
                    if not fragment:
                        continue
                ids.extend(self._encode_text(fragment, after_special))
                after_special = False
        return ids

    def mark_plain(self, text: str, mark: str) -> str:
        """``text`` with every control-token text in it broken by ``mark``, so that a prompt
        holding it, encoded with ``plain_mark=mark``, gets it as plain text: how text from a
        user is kept from forging a chat template's role markers. ``mark`` must be a
        character no token text contains (a Unicode noncharacter)."""
        return self._vocab.break_control_texts(text, mark)

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; control tokens appear as their text, so ``decode(encode(s)) == s``.

        Unlike llama.cpp's detokenize, no "clean up spaces" pass runs: it is lossy.
        """
        pieces: list[bytes] = []
        strip_prefix_space = self._vocab.add_space_prefix
        for token_id in ids:
            piece = self.token_bytes(token_id, special=True)
            attr = self._attr(token_id)
            if strip_prefix_space and attr & ATTR_NORMAL and piece.startswith(b" "):
                piece = piece[1:]
            # encode inserted one space at the start of text and after every special token
            strip_prefix_space = self._vocab.add_space_prefix and bool(attr & SPECIAL_ATTRS)
            pieces.append(piece)
        return b"".join(pieces).decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int, special: bool = False) -> bytes:
        """Raw bytes of one token, as llama.cpp's ``token_to_piece(token, special)``.

        With the default ``special=False`` control and unknown tokens give ``b""`` (they are
        not text the model "writes"); user-defined tokens give their text. A token may hold
        part of a UTF-8 sequence: join bytes of consecutive tokens before decoding.
        """
        attr = self._attr(token_id)
        if attr & _HIDDEN_ATTRS:
            return self._vocab.tokens[token_id].encode("utf-8") if special else b""
        piece = self._plain_pieces[token_id]
        if piece is None:
            piece = self._piece(token_id, attr)
            self._plain_pieces[token_id] = piece
        return piece

    def token_text(self, token_id: int) -> str:
        """The vocabulary string of a token (byte-level or ``▁``-escaped, as stored)."""
        self._attr(token_id)
        return self._vocab.tokens[token_id]

    def token_id(self, text: str) -> int | None:
        """The id of the token whose text is exactly ``text``, or None."""
        return self._vocab.token_to_id.get(text)

    def is_control(self, token_id: int) -> bool:
        """Whether llama.cpp treats the token as a control token."""
        return bool(self._attr(token_id) & ATTR_CONTROL)

    def _attr(self, token_id: int) -> int:
        if not 0 <= token_id < self.vocab_size:
            raise TokenizerError(f"token id {token_id} is outside the vocabulary (size {self.vocab_size})")
        return self._vocab.attrs[token_id]

    def _piece(self, token_id: int, attr: int) -> bytes:
        text = self._vocab.tokens[token_id]
        if attr & ATTR_USER_DEFINED:
            return text.encode("utf-8")
        if attr & ATTR_NORMAL:
            return self._normal_piece(text)
        if attr & ATTR_BYTE:
            return bytes([int(text[3:5], 16)])
        return b""  # unused / undefined tokens render as nothing in llama.cpp

    def _encode_text(self, text: str, after_special: bool) -> list[int]:
        raise NotImplementedError

    def _normal_piece(self, text: str) -> bytes:
        raise NotImplementedError
