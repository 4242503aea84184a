"""`paged <command> --help` shows the command as the user typed it, not a module's file name
(`usage: bench.py`, `usage: __main__.py` left a newcomer guessing what to run)."""
import argparse
import importlib
import re

import pytest

from paged.__main__ import main


@pytest.mark.parametrize("argv, prog", [
    (["bench", "scheduler"], "paged bench scheduler"),
    (["bench", "engine"], "paged bench engine"),
    (["bench", "serve"], "paged bench serve"),
    (["serve"], "paged serve"),
    (["router"], "paged router"),
    (["launch"], "paged launch"),
    (["doctor"], "paged doctor"),
])
def test_help_names_the_command(capsys, argv, prog):
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {prog} ")


def _parsers(parser: argparse.ArgumentParser):
    """The parser and each subcommand's (one that hands its arguments on to another command's
    parser, as `python -m sim bench`, has no options of its own and is walked as that one)."""
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                if sub.add_help:
                    yield from _parsers(sub)


COMMANDS = [
    ("paged serve", "paged.serve.server"),
    ("paged router", "paged.serve.router"),
    ("paged launch", "paged.serve.launch"),
    ("paged bench serve", "paged.serve.bench_serve"),
    ("paged doctor", "paged.serve.doctor"),
    ("paged bench scheduler", "paged.bench"),
    ("paged bench engine", "paged.engine.bench"),
    ("python -m paged.engine", "paged.engine.__main__"),
    ("python -m paged.engine.kv_accuracy", "paged.engine.kv_accuracy"),
    ("python -m paged.engine.swap_profile", "paged.engine.swap_profile"),
    ("python -m paged.serve.bench_router", "paged.serve.bench_router"),
    ("python -m paged.serve.bench_http", "paged.serve.bench_http"),
    ("python -m sim", "sim.cli.options"),
    ("python -m sim bench", "sim.bench"),
]


@pytest.mark.parametrize("command, module", COMMANDS)
def test_every_option_has_help_and_shows_its_default(monkeypatch, command, module):
    """A newcomer's first `--help` explains every option (half of `paged serve`'s had no word),
    with its default as argparse shows one, and never shows an API key taken from the environment."""
    monkeypatch.setenv("PAGED_API_KEY", "sk-not-for-help")
    built = importlib.import_module(module).build_parser()
    top = built[0] if isinstance(built, tuple) else built  # sim's: (the parser, its `run` subparser)
    for parser in _parsers(top):
        formatter = parser._get_formatter()
        for action in parser._actions:
            name = f"{parser.prog}: {'/'.join(action.option_strings) or action.dest}"
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    assert choice.help and choice.help.strip(), f"{name} {choice.dest} has no help"
                continue
            assert action.help and action.help.strip(), f"{name} has no help"
            shown = formatter._get_help_string(action)
            if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
                assert "(default" not in shown, f"{name}: a switch shows its default (it is off)"
            elif action.default not in (None, "", argparse.SUPPRESS) and not isinstance(action.default, bool):
                assert "(default" in shown, f"{name}'s help does not show its default {action.default!r}"
        text = re.sub(r"\s+", " ", parser.format_help())
        assert "sk-not-for-help" not in text, f"{parser.prog}: shows $PAGED_API_KEY"
        assert "(default: None)" not in text, f"{parser.prog}: shows a default of None"
        assert "(default: [" not in text, f"{parser.prog}: shows a list's default as Python writes it, not as typed"
        assert not re.search(r"\(default[^)]*\) \(default", text), f"{parser.prog}: a default shown twice"
    if command == "paged serve":  # the engine's options show the config's defaults, which argparse does not know
        assert "in number of tokens, a power of two (default: 16)" in re.sub(r"\s+", " ", top.format_help())


@pytest.mark.parametrize("command, module", COMMANDS)
def test_a_usage_error_is_two_lines_not_every_option(capsys, command, module):
    """A misspelt option printed argparse's whole usage above the error (44 lines for `python -m sim
    run`), which buried the one line saying what was wrong: now the short usage and the error, in
    every parser and subcommand parser, exit status 2."""
    built = importlib.import_module(module).build_parser()
    for parser in _parsers(built[0] if isinstance(built, tuple) else built):
        with pytest.raises(SystemExit) as e:
            parser.parse_args(["--no-such-option"])
        assert e.value.code == 2
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 2, f"{parser.prog}: {len(lines)} lines"
        assert lines[0].startswith(f"usage: {parser.prog} [options]") and f"{parser.prog} --help" in lines[0]
        assert lines[1].startswith(f"{parser.prog}: error: ")  # the option, or a required one missing
