"""daemon.cli: every flag of every command explains itself in ``--help``."""
from __future__ import annotations

import argparse
import dataclasses

from rlinkd.daemon import cli
from rlinkd.daemon.config import SECTIONS


def _walk(parser: argparse.ArgumentParser, path: str):
    """(command path, action) for every action of ``parser`` and its subcommands; a
    subcommand itself appears as the pseudo-action carrying its one-line help."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield path, argparse.Action([], name, help=helps.get(name))
                yield from _walk(sub, f"{path} {name}")
        else:
            yield path, action


def _undocumented(parser: argparse.ArgumentParser) -> list[str]:
    missing = []
    for path, action in _walk(parser, parser.prog):
        if isinstance(action, argparse._HelpAction):
            continue
        if not (action.help or "").strip() or action.help == argparse.SUPPRESS:
            missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return missing


def test_every_flag_of_every_command_has_a_help_text():
    assert _undocumented(cli.build_parser()) == []


def test_the_walk_sees_subcommands_and_reports_a_flag_without_help():
    """The check above cannot pass vacuously: it reaches subcommand flags and names them."""
    parser = argparse.ArgumentParser(prog="p")
    sub = parser.add_subparsers(dest="verb")
    sub.add_parser("a", help="command a").add_argument("--bare")
    sub.add_parser("b").add_argument("--told", help="documented")
    assert _undocumented(parser) == ["p a --bare", "p b"]


def test_config_shorthand_flags_take_their_help_from_the_config_declaration():
    """One source of truth: `serve --port` says what `server.port` says in the config table."""
    docs = {f"{name}.{f.name}": f.metadata["doc"] for name, cls in SECTIONS.items()
            for f in dataclasses.fields(cls)}
    serve = next(a for a in cli.build_parser()._actions
                 if isinstance(a, argparse._SubParsersAction)).choices["serve"]
    by_dest = {a.dest: a for a in serve._actions}
    for attr, dotted in cli.SERVE_SHORTHANDS.items():
        assert docs[dotted].replace("%", "%%") in by_dest[attr].help, attr
        assert dotted in by_dest[attr].help, attr


def test_every_help_text_renders():
    """argparse %-formats help texts: a stray % would only fail when --help is asked for."""
    parser = cli.build_parser()
    parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.format_help()


def _defaults_not_shown(parser: argparse.ArgumentParser) -> list[str]:
    hidden = []
    for path, action in _walk(parser, parser.prog):
        default = action.default
        if default in (None, False, [], argparse.SUPPRESS) or isinstance(action, argparse._HelpAction):
            continue
        if "default" not in (action.help or ""):
            hidden.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return hidden


def test_every_flag_with_a_default_says_it():
    """`client --help` used to hide where it connects (tcp://127.0.0.1:5555)."""
    assert _defaults_not_shown(cli.build_parser()) == []


def test_rlinkd_checkpoint_waits_for_its_own_request(capsys):
    """The outcome of request 4 (the SIGUSR1 this invocation sent): not an older checkpoint,
    a newer one does (requests are answered in order), a failure of it is exit 73."""
    from rlinkd.daemon.cli import _checkpoint_outcome
    older = {"last_checkpoint": {"request_id": 3, "path": "/c/ckpt-3"}}
    assert _checkpoint_outcome(older, 0) is None and _checkpoint_outcome(older, 4) is None
    assert _checkpoint_outcome({"last_checkpoint": {"request_id": 5, "path": "/c/ckpt-5"}}, 4) == 0
    assert capsys.readouterr().out.strip() == "/c/ckpt-5"
    failed = {**older, "last_checkpoint_failure": {"request_id": 4, "error": "disk full"}}
    assert _checkpoint_outcome(failed, 4) == 73 and "disk full" in capsys.readouterr().err
    assert _checkpoint_outcome({**older, "state": "stopping"}, 0) == 5
