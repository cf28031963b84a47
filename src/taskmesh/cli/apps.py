"""The Typer app every command group is made with: help that names what a flag takes, never a Python type.

Typer's help shows a parameter's Python type where no metavar is given (``--json <bool>``,
``ID <str>``), and for a flag, which takes no value, even with one. Here a flag shows nothing
after its name and an argument only its name; an option that takes a value shows the metavar
its declaration gives (``--limit N``), which every option of the command line declares (a test
reads every command's help).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

F = TypeVar("F", bound=Callable[..., Any])


class _Argument(TyperArgument):
    """An argument whose help shows its name (the metavar) and no type beside it."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return None


def _for_help(params: list[Any]) -> list[Any]:
    """``params`` made to show no type in help (idempotent: help and parsing call it many times)."""
    for param in params:
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""  # a flag takes no value: nothing to show after its name
        elif isinstance(param, TyperArgument) and not isinstance(param, _Argument):
            # Typer makes its parameters itself; the subclass changes their help alone, not how they parse.
            param.__class__ = _Argument
    return params


class Command(TyperCommand):
    """A command whose help shows metavars, not Python types."""

    def get_params(self, ctx: Any) -> list[Any]:
        """The command's parameters with ``--help``, as :func:`_for_help` shows them."""
        return _for_help(super().get_params(ctx))


class Group(TyperGroup):
    """A group of commands whose help shows metavars, not Python types."""

    def get_params(self, ctx: Any) -> list[Any]:
        """The group's parameters with ``--help``, as :func:`_for_help` shows them."""
        return _for_help(super().get_params(ctx))


class App(typer.Typer):
    """``typer.Typer`` whose group and commands are :class:`Group` and :class:`Command` unless told otherwise."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("cls", Group)
        super().__init__(**kwargs)

    def command(self, *args: Any, **kwargs: Any) -> Callable[[F], F]:
        """``typer.Typer.command`` with :class:`Command` as the default class."""
        kwargs.setdefault("cls", Command)
        decorate: Callable[[F], F] = super().command(*args, **kwargs)
        return decorate
