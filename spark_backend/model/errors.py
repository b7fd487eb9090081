"""The domain's exceptions. Every message is one sentence a user can act on."""

from __future__ import annotations


class InspectorError(Exception):
    """Base: an error whose message is shown to the user as it is."""


class BadInput(InspectorError, ValueError):
    """An argument, option or file that is not acceptable; says what is accepted.

    ``field`` names the input at fault (``start``, ``end``, ``heartbeat_ms``, ``stream``,
    ``project``...), so a form can show the message next to it.
    """

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class SourceError(InspectorError):
    """The source refused or failed (unknown database, credentials, retention...)."""


class PullFailed(InspectorError):
    """A pull that could not finish; what was read is kept and marked incomplete."""

    def __init__(self, message: str, partition: str | None = None):
        super().__init__(message)
        self.partition = partition


class CacheError(InspectorError):
    """The DuckDB cache file cannot be used (locked, not a cache, unknown stream)."""
