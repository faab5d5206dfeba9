"""What ``ftlab``'s commands share: the parser's one-line usage errors, the help's defaults, and
the option types that check an option as the Python API checks the same argument."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

from ftlab.models import pipeline_args as check

if TYPE_CHECKING:
    import torch


class Parser(argparse.ArgumentParser):
    """argparse with a usage error on one line, ``ftlab: error: <message>``, exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"ftlab: error: {message} (see {self.prog} --help)\n")


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every option's default after its help, except a None default, which the help words."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


def option(convert: Callable[[str], object], what: str, rule: Callable[[object], object]):
    """An argparse ``type``: the text as ``what`` (through ``convert``), then through ``rule``,
    the check that the Python API applies to the same argument."""

    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        try:
            return rule(value)
        except (TypeError, ValueError) as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def at_least_one(flag: str) -> Callable[[int], int]:
    def rule(value: int) -> int:
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
        return value

    return rule


def device(text: str) -> str | torch.device:
    """``auto`` (resolved when the command runs) or a device the Python API accepts."""
    return text if text == "auto" else check.device(text)


def backend_set(text: str) -> str | dict[str, str]:
    """``NAME`` (every op) or ``OP=NAME[,OP=NAME...]`` (those ops; the others auto), checked as
    ``Pipeline.compare`` checks it."""
    value: str | dict[str, str] = text
    if "=" in text:
        pairs = [part.split("=", 1) for part in text.split(",")]
        if any(len(pair) != 2 for pair in pairs):
            raise ValueError(f"a backend set must be NAME or OP=NAME[,OP=NAME...], got {text!r}")
        value = dict(pairs)
    check.backend_map(value)
    return value


def add_device(p: argparse.ArgumentParser) -> None:
    """The ``--device`` option of the commands that load a model (``auto``: a GPU when torch
    sees one)."""
    p.add_argument(
        "--device",
        type=option(str, "a device", device),
        default="auto",
        help="cpu | cuda | cuda:N; auto: cuda when torch sees a GPU, else cpu",
    )
