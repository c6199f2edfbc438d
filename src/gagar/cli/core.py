"""What every ``gagar`` command shares: user errors as one line with exit code 2, help texts shown as written.

:class:`GagarGroup` is the class of the root command and of every command group: whatever a
command raises passes through the ``invoke`` of its group, where :func:`gagar.errors.user_message`
tells a user error (printed as ``gagar <command>: error: <what was wrong>``, exit code 2) from a
bug (its traceback, as before). ``GAGAR_DEBUG=1`` keeps the traceback of user errors too.
"""

from __future__ import annotations

from typing import Any

import typer
from rich.markup import escape
from typer.core import TyperGroup
from typer.models import ParameterInfo

from gagar.errors import debug, user_message

__all__ = ["USER_ERROR_EXIT", "GagarGroup", "escape_help"]

USER_ERROR_EXIT = 2
"""Exit code of a user error (click's own for usage errors)."""


class GagarGroup(TyperGroup):
    """A command group that turns its commands' user errors into one line and exit code 2."""

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort):
            raise
        except typer.TyperException as exc:  # click's usage errors and BadParameter, raised by a command
            if debug():
                raise
            usage = getattr(exc, "ctx", None)
            hint = f" (see '{usage.command_path} --help')" if usage is not None else ""
            _fail(f"{_where(ctx)}: error: {_one_line(exc.format_message())}{hint}", exc.exit_code)
        except Exception as exc:
            message = None if debug() else user_message(exc)
            if message is None:
                raise
            _fail(f"{_where(ctx)}: error: {message}", USER_ERROR_EXIT)


def _where(ctx: typer.Context) -> str:
    """``gagar sandbox run``: the command that failed (an inner group catches its own commands' errors)."""
    return " ".join(part for part in (ctx.command_path, ctx.invoked_subcommand) if part)


def _one_line(text: str) -> str:
    return "; ".join(part.strip() for part in text.splitlines() if part.strip())


def _fail(line: str, code: int) -> None:
    typer.echo(line, err=True)
    raise typer.Exit(code)


_ESCAPED = "_gagar_escaped"
"""Attribute marking a help text already escaped (options shared by several commands are visited once)."""


def escape_help(app: typer.Typer) -> None:
    """Escape Rich markup in every option and argument help of ``app`` and its groups, so that
    ``[env: GAGAR_POLICY]`` and ``[default: cores]`` show as written instead of vanishing as tags.
    Calling it again changes nothing."""

    def visit(typer_app: typer.Typer) -> None:
        for command in typer_app.registered_commands:
            _escape_params(command.callback)
        if typer_app.registered_callback is not None:
            _escape_params(typer_app.registered_callback.callback)
        for group in typer_app.registered_groups:
            if group.typer_instance is not None:
                visit(group.typer_instance)

    visit(app)


def _escape_params(callback: Any) -> None:
    import inspect

    if callback is None:
        return
    for parameter in inspect.signature(callback).parameters.values():
        info = parameter.default
        if isinstance(info, ParameterInfo) and info.help and not getattr(info, _ESCAPED, False):
            info.help = escape(info.help)
            setattr(info, _ESCAPED, True)
