"""Looking a spec up by name in one of the simulator's catalogs (models, hardware, KV dtypes)."""
from __future__ import annotations


def lookup(kind: str, name, catalog: dict, aliases: dict[str, str] | None = None):
    """`catalog[name]`, case-insensitive and through `aliases`; a spec object passes through.
    An unknown name is an error that lists the known ones."""
    if not isinstance(name, str):
        return name
    key = name.lower()
    key = (aliases or {}).get(key, key)
    if key not in catalog:
        raise ValueError(f"unknown {kind} {name!r}: known are {sorted(catalog)}")
    return catalog[key]
