"""`paged <command> --help` shows the command as the user typed it, not a module's file name
(`usage: bench.py`, `usage: __main__.py` left a newcomer guessing what to run)."""
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
