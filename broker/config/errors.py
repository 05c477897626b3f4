"""The one error type of the configuration: a problem located at file, line and element."""

from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(Exception):
    """A configuration problem, located: ``file:line: <element>: message``.

    ``more`` holds further problems found in the same pass (schema validation reports them all)
    so that ``check-config`` can list everything at once; ``str()`` shows the first only.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        element: str | None = None,
        more: tuple[ConfigError, ...] = (),
    ) -> None:
        super().__init__(message)
        self.file = file
        self.line = line
        self.element = element
        self.message = message
        self.more = more

    def __str__(self) -> str:
        where = self.file or "<config>"
        if self.line:
            where = f"{where}:{self.line}"
        if self.element:
            return f"{where}: <{self.element}>: {self.message}"
        return f"{where}: {self.message}"

    def all(self) -> tuple[ConfigError, ...]:
        """This error followed by the others found in the same pass."""
        return (self, *self.more)
