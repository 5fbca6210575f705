"""The one error type a user sees. Engines raise these; the CLI prints one line and exits 2."""

from __future__ import annotations


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

    def _format(self) -> str:
        where = ""
        if self.source is not None:
            where = self.source
            if self.line is not None:
                where += f":{self.line}"
            where += ": "
        field = f"field '{self.field}': " if self.field else ""
        return f"{where}{field}{self.message}"


class TokenizerError(CachectlError):
    """A tokenizer that cannot be loaded or used for the asked purpose."""


class UsageError(CachectlError):
    """Options that do not fit together."""
