"""The one error type a user sees. Engines raise these; the CLI prints one line and exits 2. And the one
escaping of control characters for what is shown on a terminal (:func:`printable`), and the one plural of what
messages count (:func:`plural`)."""

from __future__ import annotations

import re


class CachectlError(Exception):
    """An error a user can act on. ``str(err)`` is the one line the CLI prints."""

    exit_code = 2


class InputError(CachectlError):
    """Bad input data, located by file, line and field where they are known."""

    def __init__(self, message: str, *, source: str | None = None, line: int | None = None,
                 field: str | None = None) -> None:
        self.message = message
        self.source = source
        self.line = line
        self.field = field
        super().__init__(self._format())

    def locate(self, source: str, line: int | None) -> None:
        """Name ``source`` and ``line`` where this error names no file (its kind and field kept)."""
        if self.source is None:
            self.source, self.line = source, line
            self.args = (self._format(),)

    def rename_field(self, field: str | None) -> None:
        """Name ``field`` instead: the path as the user's file spells it, where a reader parsed a value wrapped."""
        self.field = field
        self.args = (self._format(),)

    def _format(self) -> str:
        where = ""
        if self.source is not None:
            where = self.source
            if self.line is not None:
                where += f":{self.line}"
            where += ": "
        field = f"field '{self.field}': " if self.field else ""
        return f"{where}{field}{self.message}"


class MalformedInput(InputError):
    """A value a line holds that cannot be read as what its field holds (a usage count that is not a number).
    What a log only lacks (timestamps, token counts, a priced model) a whole-log simulation notes and goes on
    without; a malformed value ends every command with exit 2, wherever it is first read."""


class UnrenderablePart(InputError):
    """A content part (image, audio, document or file) that a tokenizer cannot render to token IDs without the
    model's processor. ``report`` and ``fix`` leave such a line out of their analyses and say so; the commands
    that read one prompt stop on it."""


class TokenizerError(CachectlError):
    """A tokenizer that cannot be loaded or used for the asked purpose."""


class UsageError(CachectlError):
    """Options that do not fit together."""


class OutputError(CachectlError):
    """An output file that could not be written (disk full, I/O error, permission denied): nothing partial is
    left, and the message names the file."""


class Interrupted(CachectlError):
    """SIGINT or SIGTERM while an output was being written: the temporary file is gone, the target untouched.
    The exit code is the shell's for the signal (130, 143)."""

    def __init__(self, message: str, exit_code: int = 130) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# ------------------------------------------------------------------------------------ terminal safety

#: what a terminal would act on instead of showing: C0 controls (tab and newline are kept where the layout
#: needs them), DEL, C1 controls (CSI 0x9b among them), and the bidirectional overrides and isolates that
#: reorder what is shown ("Trojan Source")
#: besides the C0/C1 controls and the bidirectional marks and overrides (U+061C, U+200E/F, U+202A-E, U+2066-9), the
#: characters that print as nothing where a divergence may sit: the zero-width space U+200B, the word joiner and
#: invisible operators U+2060-4, the BOM U+FEFF, the soft hyphen U+00AD, U+180E (a prompt diverging there showed
#: blank tokens). The joiners U+200C/D stay: Persian, Indic scripts and emoji sequences are written with them.
_INVISIBLE = "\u00ad\u061c\u180e\u200b\u200e\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\u2028\u2029\ufeff"
_CONTROL = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_INVISIBLE}]")
_CONTROL_ALL = re.compile(f"[\x00-\x1f\x7f-\x9f{_INVISIBLE}]")


def _escape_char(m: re.Match) -> str:
    code = ord(m.group(0))
    return {9: "\\t", 10: "\\n", 13: "\\r"}.get(code) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(text: str, *, newlines: bool = True) -> str:
    """``text`` safe to show on a terminal: every control character that came from input (ESC, BEL, CSI and the
    other C0 and C1 controls, DEL, bidirectional overrides) written as a visible escape (``\\x1b``, ``\\x9b``,
    ``\\u202e``), the way ``repr`` writes them; tab and newline are kept unless ``newlines`` is false (one-line
    contexts). The one escaping of every text renderer and of error messages; JSON output does not use it (JSON
    escapes them itself)."""
    pattern = _CONTROL if newlines else _CONTROL_ALL
    if pattern.search(text) is None:
        return text
    return pattern.sub(_escape_char, text)


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``n`` and the noun, singular for one: ``1 conversation``, ``2 conversations``, ``1,024 tokens``, ``2 fixes``
    (``nouns`` when the plural is not the noun with an s). Counts carry thousands separators."""
    if n == 1:
        return f"1 {noun}"
    return f"{n:,} {nouns or (noun + 'es' if noun.endswith(('s', 'x', 'ch', 'sh')) else noun + 's')}"
