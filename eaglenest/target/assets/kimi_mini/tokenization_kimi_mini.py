"""The tiktoken tokenizer of eaglenest's Kimi-K2.5 miniature, shipped as remote code like Kimi's.

The model folder holds `tiktoken.model` (one "base64(token bytes) rank" line per BPE token) and
this file; `tokenizer_config.json` names this class in `auto_map` and ships no `tokenizer.json`, so
transformers and vLLM can load it only by running this file (`trust_remote_code`), exactly the
path moonshotai/Kimi-K2.5's own tokenizer takes. Special tokens come from `added_tokens_decoder`
(ids after the BPE ranks); the base class splits them out of the text before BPE runs.

Tokens are handled as byte-level strings (one printable character per byte, the GPT-2
convention): a BPE token need not be valid UTF-8 on its own, and the slow-tokenizer API (token
strings <-> ids, vLLM's incremental detokenizer) needs a string for every id.
"""

from __future__ import annotations

import base64
import os
import shutil
from typing import ClassVar

import tiktoken
from transformers import PreTrainedTokenizer

# Kimi-style pre-tokenization: runs of CJK ideographs stand alone; other words split where the
# case changes, keeping an English contraction attached; digits in groups of at most three;
# runs of punctuation; line breaks; other whitespace. `&&` is a class intersection (supported
# by tiktoken's regex engine and by Oniguruma, which the `tokenizers` trainer uses).
_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
_CONTRACTION = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
_LEAD = r"[^\r\n\p{L}\p{N}]?"
PAT_STR = "|".join(
    [
        r"\p{Han}+",
        _LEAD + _UPPER + "*" + _LOWER + "+" + _CONTRACTION,
        _LEAD + _UPPER + "+" + _LOWER + "*" + _CONTRACTION,
        r"\p{N}{1,3}",
        r" ?[^\s\p{L}\p{N}]+[\r\n]*",
        r"\s*[\r\n]+",
        r"\s+(?!\S)",
        r"\s+",
    ]
)


def byte_alphabet() -> list[str]:
    """The printable character standing for each byte value (index = byte)."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    chars, spare = [], 0x100
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(spare))
            spare += 1
    return chars


def load_ranks(path) -> dict[bytes, int]:
    """Read a tiktoken BPE file: token bytes -> rank."""
    ranks = {}
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
    return ranks


class TikTokenTokenizer(PreTrainedTokenizer):
    """tiktoken BPE with Kimi's special tokens; never a fast tokenizer."""

    vocab_files_names: ClassVar[dict] = {"vocab_file": "tiktoken.model"}
    model_input_names: ClassVar[list] = ["input_ids", "attention_mask"]

    def __init__(
        self,
        vocab_file,
        bos_token="[BOS]",
        eos_token="[EOS]",
        unk_token="[UNK]",
        pad_token="[PAD]",
        clean_up_tokenization_spaces=False,
        **kwargs,
    ):
        # Set before the base class runs: its __init__ already asks for the vocabulary.
        self.vocab_file = vocab_file
        ranks = load_ranks(vocab_file)
        self._bpe = tiktoken.Encoding(
            name="kimi_mini", pat_str=PAT_STR, mergeable_ranks=ranks, special_tokens={}
        )
        alphabet = byte_alphabet()
        self._byte_of_char = {c: b for b, c in enumerate(alphabet)}
        self._id_of = {"".join(alphabet[b] for b in token): rank for token, rank in ranks.items()}
        self._token_of = {rank: token for token, rank in self._id_of.items()}
        super().__init__(
            bos_token=bos_token,
            eos_token=eos_token,
            unk_token=unk_token,
            pad_token=pad_token,
            clean_up_tokenization_spaces=clean_up_tokenization_spaces,
            **kwargs,
        )

    @property
    def vocab_size(self) -> int:
        return len(self._id_of)

    def get_vocab(self) -> dict[str, int]:
        return {**self._id_of, **self.added_tokens_encoder}

    def _tokenize(self, text, **kwargs) -> list[str]:
        return [self._token_of[i] for i in self._bpe.encode_ordinary(text)]

    def _convert_token_to_id(self, token: str) -> int:
        return self._id_of.get(token, self.unk_token_id)

    def _convert_id_to_token(self, index: int) -> str:
        return self._token_of.get(index, self.unk_token)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        data = bytearray()
        for token in tokens:
            if token in self._added_tokens_encoder:
                data += token.encode("utf-8")
            else:
                data += bytes(self._byte_of_char[c] for c in token)
        return data.decode("utf-8", errors="replace")

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None):
        prefix = f"{filename_prefix}-" if filename_prefix else ""
        name = prefix + self.vocab_files_names["vocab_file"]
        out = os.path.join(save_directory, name)
        if os.path.abspath(out) != os.path.abspath(self.vocab_file):
            shutil.copyfile(self.vocab_file, out)
        return (out,)
