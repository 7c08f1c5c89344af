"""Every command, option and positional of the CLI says what it does (`tunefleet ... --help`)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from tunefleet.cli.app import build_parser

#: Actions argparse adds itself; their help is argparse's own.
EXEMPT = {"-h", "--help", "--version"}


def _name(action: argparse.Action) -> str:
    return "/".join(action.option_strings) if action.option_strings else action.dest


def missing_help(parser: argparse.ArgumentParser, path: str) -> Iterator[str]:
    """``"command path: option"`` for every action under ``parser`` without help, recursively."""
    for action in parser._actions:
        if EXEMPT & set(action.option_strings):
            continue
        if isinstance(action, argparse._SubParsersAction):
            # The sub-parsers action is the COMMAND slot; each of its commands needs a help line.
            documented = {a.dest: a.help for a in action._choices_actions}
            for name, child in action.choices.items():
                if not (documented.get(name) or "").strip():
                    yield f"{path}: {name} (command)"
                yield from missing_help(child, f"{path} {name}")
            continue
        if action.help == argparse.SUPPRESS:
            continue
        if not (action.help or "").strip():
            yield f"{path}: {_name(action)}"


def test_every_option_has_help() -> None:
    missing = list(missing_help(build_parser(), "tunefleet"))
    assert not missing, "options without help text:\n" + "\n".join(missing)


def test_the_walk_reaches_nested_commands() -> None:
    """The check above means something: it sees options two sub-parsers deep."""
    parser = argparse.ArgumentParser(prog="x")
    sub = parser.add_subparsers(dest="command")
    grp = sub.add_parser("shards", help="shards").add_subparsers(dest="sub")
    ls = grp.add_parser("list")
    ls.add_argument("--state")
    ls.add_argument("ids", nargs="*", help="   ")
    assert list(missing_help(parser, "x")) == ["x shards: list (command)", "x shards list: --state",
                                               "x shards list: ids"]
