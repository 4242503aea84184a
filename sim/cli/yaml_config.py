"""A YAML config file for `python -m sim run --config FILE`: the same options as the command line.

Each value is held to what the command line would accept for the same option, and the command
line overrides the file.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from paged.workloads.options import WORKLOAD_KEYS, shared_prefix_arg

from ..sim_config import SimConfig
from .options import OUTPUT_KEYS, weights


def load_yaml(path: str, parser: argparse.ArgumentParser, run: argparse.ArgumentParser,
               argv: list[str]) -> argparse.Namespace:
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            cfg = yaml.safe_load(f) or {}
    except OSError as e:
        raise ValueError(f"{path}: cannot read the config file: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None  # one line
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: expected a mapping of option names to values")
    known = set(SimConfig.field_names()) | set(WORKLOAD_KEYS) | set(OUTPUT_KEYS)
    unknown = sorted(set(cfg) - known)
    if unknown:
        import difflib  # here: only a misspelt key needs it (~3M instructions a start otherwise)

        near = [m for k in unknown for m in difflib.get_close_matches(k.replace("-", "_"), known, n=1)]
        hint = f" (did you mean {', '.join(near)}?)" if near else ""  # num-requests, as on the command line
        raise ValueError(f"{path}: unknown option(s) {unknown}{hint}; known are {sorted(known)}")
    run.set_defaults(**{k: _yaml_value(path, k, v, run) for k, v in cfg.items()})
    return parser.parse_args(argv)


def _yaml_value(path: str, key: str, value, run: argparse.ArgumentParser):
    """A config file's value, held to what the command line would accept for the same option:
    a switch takes true/false (the string "false" is not false), a typed option its type, and
    a file named by a relative path is found next to the config file."""
    action = next((a for a in run._actions if a.dest == key), None)
    if action is None:  # a SimConfig field without a command-line option: SimConfig checks it
        return value
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):
            raise ValueError(f"{path}: {key}={value!r}: expected true or false")
        return value
    if value is None:
        if action.default is not None:
            raise ValueError(f"{path}: {key}=null: expected a value (the default is {action.default!r})")
        return value
    if action.type in (weights, shared_prefix_arg) and isinstance(value, list):
        value = ",".join(str(x) for x in value)
    if action.type is int and isinstance(value, float):
        raise ValueError(f"{path}: {key}={value!r}: expected an integer")
    if action.type is not None and not (isinstance(action.type, type) and isinstance(value, action.type)):
        try:
            value = action.type(value)
        except (TypeError, ValueError, argparse.ArgumentTypeError) as e:
            expected = {weights: "three numbers A,B,C", shared_prefix_arg: "four integers GROUPS,PREFIX,SUFFIX,OUTPUT"
                        }.get(action.type)
            if expected is None and isinstance(e, argparse.ArgumentTypeError):  # the type's own "VALUE: expected ..."
                raise ValueError(f"{path}: {key}={e}") from None
            expected = expected or f"a value of type {action.type.__name__}"
            raise ValueError(f"{path}: {key}={value!r}: expected {expected}") from None
    if action.choices is not None and value not in action.choices:
        raise ValueError(f"{path}: {key}={value!r}: expected one of {list(action.choices)}")
    if key in ("trace", "cost_model") and isinstance(value, str) and value != "roofline":
        candidate = Path(path).parent / value
        if not Path(value).is_absolute() and candidate.exists():
            value = str(candidate)
    return value
