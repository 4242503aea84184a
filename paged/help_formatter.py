"""How every command line shows its options: each one's default after its help, as argparse's
`ArgumentDefaultsHelpFormatter` does, where there is one to show; and a usage error as two lines,
not the whole usage. Shared by `python -m sim` and `paged serve | router | launch | bench serve`,
so that a default and an error read the same everywhere."""
from __future__ import annotations

import argparse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's default after its help, except where there is none to show (None or "":
    the help says what happens then; a switch: it is off) or the help names it already."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, "") or isinstance(action.default, bool) or "(default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class RawDescriptionHelpFormatter(argparse.RawDescriptionHelpFormatter, HelpFormatter):
    """The same, for a command whose description or epilog is laid out by hand (examples)."""


class ArgumentParser(argparse.ArgumentParser):
    """An argparse parser whose usage error is the command's short usage and the error, two lines:
    argparse prints the full usage first, every option of `python -m sim run` (44 lines) above the
    one line that says what was wrong. `--help` still shows everything. Subcommands' parsers are
    of this class too (argparse makes them of their parent's)."""

    def error(self, message: str):
        positionals = [a for a in self._actions if not a.option_strings]
        formatter = self._get_formatter()
        formatter.add_usage(None, positionals, [], prefix="")
        short = formatter.format_help().strip()  # the program and its positional arguments
        if short.startswith(self.prog):
            short = f"{self.prog} [options]{short[len(self.prog):]}"
        self.exit(2, f"usage: {short}   ({self.prog} --help: every option)\n{self.prog}: error: {message}\n")
