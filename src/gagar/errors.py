"""User errors: what the ``gagar`` command prints as one line (exit code 2) instead of a traceback.

A user error is a mistake in what the user gave, not in GAGAR: a path that does not exist, a record
or a value that does not validate, a server that cannot be reached. :func:`user_message` decides,
for any exception, whether it is one and what line describes it; everything else is a bug and keeps
its traceback. ``GAGAR_DEBUG=1`` shows the traceback of user errors too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

__all__ = ["DEBUG_ENV", "UserError", "debug", "user_message"]

DEBUG_ENV = "GAGAR_DEBUG"
"""Set to 1 to see the traceback of every error, user errors included."""

_PACKAGE = Path(__file__).resolve().parent
_FILE_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError, FileExistsError)


class UserError(ValueError):
    """A mistake in what the user asked for, described in one line that names what was wrong."""


def debug() -> bool:
    """Whether ``GAGAR_DEBUG`` asks for tracebacks."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from or while handling, outermost first."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _raised_by_gagar(exc: BaseException) -> bool:
    """Whether the innermost frame of ``exc``'s traceback is GAGAR's own code (a deliberate raise)."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(_PACKAGE)


def _one_line(text: str) -> str:
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def _connection_types() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(errors whose message already says which server failed, errors of a failed connection)."""
    from gagar.storage.errors import StoreUnavailableError

    described: list[type[BaseException]] = [StoreUnavailableError]
    failed: list[type[BaseException]] = [ConnectionError, TimeoutError]
    try:
        from gagar.metrics import MetricsPushError

        described.append(MetricsPushError)
    except ImportError:  # the metrics extra is not installed: nothing can push
        pass
    try:
        from urllib3.exceptions import NewConnectionError

        failed.append(NewConnectionError)
    except ImportError:  # urllib3 comes with the kfp and kubernetes extras only
        pass
    return tuple(described), tuple(failed)


def _unreachable(exc: BaseException) -> str | None:
    """``cannot reach URL: reason`` when ``exc`` (or what caused it) is a failed connection."""
    from urllib.error import URLError

    described, failed = _connection_types()
    for link in _chain(exc):
        if isinstance(link, described):
            return _one_line(str(link))
        pool = getattr(link, "pool", None)
        if type(link).__name__ == "MaxRetryError" and pool is not None:  # urllib3's, the KFP client's
            reason = _reason(getattr(link, "reason", link))
            return f"cannot reach {pool.scheme}://{pool.host}:{pool.port}: {reason}"
        if isinstance(link, URLError):
            return f"cannot reach {getattr(link, 'url', None) or 'the server'}: {_reason(link.reason)}"
        if isinstance(link, failed):
            return f"cannot connect: {_reason(link)}"
    return None


def _reason(reason: BaseException | object) -> str:
    """What the system said (``Connection refused``, ``Name or service not known``), else the text."""
    if isinstance(reason, BaseException):
        for link in _chain(reason):
            if isinstance(link, OSError) and link.strerror:
                return str(link.strerror)
    return _one_line(str(reason))


def user_message(exc: BaseException) -> str | None:
    """The one line that describes user error ``exc``, or None when ``exc`` is a bug.

    User errors: :class:`UserError` and every ``ValueError`` GAGAR's own code raises (records,
    settings and values that do not validate, named by record and field); a missing, unreadable or
    misplaced file or directory; a server or store that cannot be reached.
    """
    from pydantic import ValidationError

    unreachable = _unreachable(exc)
    if unreachable is not None:
        return unreachable
    if isinstance(exc, _FILE_ERRORS):
        if exc.filename is not None and exc.strerror:
            return f"{exc.filename}: {exc.strerror}"
        return _one_line(str(exc))
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        where = f"{exc.title}: {field}" if field else exc.title
        return f"{where}: {first['msg'].removeprefix('Value error, ')}"
    if isinstance(exc, UserError) or (isinstance(exc, ValueError) and _raised_by_gagar(exc)):
        return _one_line(str(exc))
    return None
