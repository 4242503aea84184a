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


@pytest.mark.parametrize("command, module", [
    ("serve", "paged.serve.server"),
    ("router", "paged.serve.router"),
    ("launch", "paged.serve.launch"),
    ("bench serve", "paged.serve.bench_serve"),
])
def test_every_option_has_help_and_shows_its_default(monkeypatch, command, module):
    """A newcomer's first `--help` explains every option (half of `paged serve`'s had no word),
    with its default as argparse shows one, and never shows an API key taken from the environment."""
    monkeypatch.setenv("PAGED_API_KEY", "sk-not-for-help")
    parser = importlib.import_module(module).build_parser()
    formatter = parser._get_formatter()
    for action in parser._actions:
        name = "/".join(action.option_strings) or action.dest
        assert action.help and action.help.strip(), f"paged {command}: {name} has no help"
        if action.default not in (None, "", argparse.SUPPRESS) and not isinstance(action.default, bool):
            shown = formatter._get_help_string(action)
            assert "(default" in shown, f"paged {command}: {name}'s help does not show its default {action.default!r}"
    text = re.sub(r"\s+", " ", parser.format_help())
    assert "sk-not-for-help" not in text and "(default: None)" not in text
    assert not re.search(r"\(default[^)]*\) \(default", text), f"paged {command}: a default shown twice"
    if command == "serve":  # the engine's options show the config's defaults, which argparse does not know
        assert "in number of tokens, a power of two (default: 16)" in text
