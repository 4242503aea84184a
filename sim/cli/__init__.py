"""Command line: `python -m sim run|demo|bench|fit|calibrate|breakdown|list|search`.

    python -m sim run --trace traces/azure_llm_2023_conv.csv --model llama-2-7b --hardware a100-80gb --json out.json
    python -m sim run --config experiment.yaml --replicas 4      # the command line overrides the file

A YAML config file (safe-loaded) holds the same options, named as the `dest` of each option:
SimConfig's field names (`enable_prefix_caching: false`) and the workload's (`trace`,
`num_requests`, `time_scale`, ...). One job per file: `options` (the parser), `yaml_config`
(the file), `workload_args` (the workload named), `commands` (what each subcommand does),
`outputs` (what a run writes).

Every usage error (a bad option, config file, trace or path) prints one line naming the value,
what was expected and where, and exits with status 2, as argparse does.
"""
from __future__ import annotations

import sys

from .. import breakdown, calibrate_cmd
from .commands import cmd_demo, cmd_fit, cmd_list, cmd_run
from .option_errors import named_as_option
from .options import build_parser
from .search_command import cmd_search
from .yaml_config import load_yaml

COMMANDS = {"run": cmd_run, "demo": cmd_demo, "fit": cmd_fit, "list": cmd_list, "calibrate": calibrate_cmd.run,
            "breakdown": breakdown.run, "search": cmd_search}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        from ..bench import main as bench_main

        return bench_main(argv[1:])
    parser, run = build_parser()
    args = parser.parse_args(argv)
    config = getattr(args, "config", None)
    try:
        if config:
            args = load_yaml(config, parser, run, argv)
        return COMMANDS[args.command](args)
    except (ValueError, OSError) as e:  # a bad value or path, named: a usage error, as argparse's
        if args.command in ("run", "search"):  # their SimConfig options are run's, named alike
            e = named_as_option(e, run, argv, config)
        print(f"error: {e}", file=sys.stderr)
        return 2
