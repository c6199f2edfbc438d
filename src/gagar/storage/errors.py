"""Errors raised by the artifact stores."""

from __future__ import annotations

__all__ = [
    "ChecksumMismatchError",
    "IncompleteCheckpointError",
    "ObjectNotFoundError",
    "StoreError",
    "StoreUnavailableError",
]


class StoreError(Exception):
    """Any failure of an artifact store."""


class StoreUnavailableError(StoreError):
    """The store could not be reached within the retry budget.

    Attributes:
        endpoint: the store's address (``http://host:port/bucket`` or a local root).
        operation: what was being done (``put_file``, ``get_bytes``, ...).
        key: the object key involved, if any.
        attempts: how many tries were made.
    """

    def __init__(self, endpoint: str, operation: str, key: str | None, attempts: int, cause: BaseException):
        self.endpoint, self.operation, self.key, self.attempts = endpoint, operation, key, attempts
        what = f"{operation}({key!r})" if key is not None else operation
        super().__init__(
            f"artifact store {endpoint} is unreachable: {what} failed after {attempts} attempt(s): "
            f"{type(cause).__name__}: {cause}"
        )


class ObjectNotFoundError(StoreError, FileNotFoundError):
    """No object exists under the requested key."""


class ChecksumMismatchError(StoreError):
    """An object's bytes do not match the sha256 its manifest recorded."""

    def __init__(self, key: str, expected: str, actual: str | None):
        self.key, self.expected, self.actual = key, expected, actual
        super().__init__(
            f"checksum mismatch for {key!r}: manifest says sha256 {expected}, store has {actual}"
        )


class IncompleteCheckpointError(StoreError):
    """A checkpoint directory has no completion manifest (never published, or publication failed)."""
