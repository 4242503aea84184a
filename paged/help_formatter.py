"""How every command line shows its options: each one's default after its help, as argparse's
`ArgumentDefaultsHelpFormatter` does, where there is one to show. Shared by `python -m sim` and
`paged serve | router | launch | bench serve`, so that a default reads the same everywhere."""
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
