"""A HardwareSpec from a spec file, so that `--hardware` takes a GPU the catalog lacks.

The file is YAML (or JSON) with datasheet figures in datasheet units:

    name: my-gpu
    peak_tflops: 312          # FP16/BF16 tensor, dense (no sparsity)
    vector_tflops: 19.5       # FP32 off the tensor cores
    memory_bandwidth_gbs: 2039
    memory_gib: 80
    interconnect_gbs: 300     # each way, between the GPUs of a tensor-parallel group
    pcie_gbs: 32              # each way, host to GPU
    num_sms: 108              # SMs (AMD: compute units)
    cta_cluster: 2            # optional, 1 if left out: 2 on Hopper and later (see `sim.hardware`)

The calibrated cost model times it with the fitted GPUs' efficiencies applied to these figures.
"""
from __future__ import annotations

from pathlib import Path

KEYS = {"peak_tflops": 1e12, "vector_tflops": 1e12, "memory_bandwidth_gbs": 1e9, "memory_gib": 1,
        "interconnect_gbs": 1e9, "pcie_gbs": 1e9, "num_sms": 1}
OPTIONAL = {"cta_cluster": 1}  # key -> its value when left out


def is_spec_path(name: str) -> bool:
    return Path(name).suffix.lower() in (".yaml", ".yml", ".json")


def read_hardware_file(path: str | Path):
    import yaml

    from .hardware import HardwareSpec

    p = Path(path)
    try:
        spec = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise FileNotFoundError(f"hardware spec {str(p)!r}: cannot read it: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"hardware spec {str(p)!r}: not valid YAML or JSON ({e})") from None
    if not isinstance(spec, dict):
        raise ValueError(f"hardware spec {str(p)!r}: expected a mapping with keys {['name', *KEYS]}")
    unknown = sorted(set(spec) - {"name", *KEYS, *OPTIONAL})
    missing = [k for k in KEYS if k not in spec]
    if unknown or missing:
        raise ValueError(f"hardware spec {str(p)!r}: unknown {unknown}, missing {missing}: expected keys "
                         f"{['name', *KEYS]} (optional: {list(OPTIONAL)})")
    bad = [k for k in KEYS if isinstance(spec[k], bool) or not isinstance(spec[k], (int, float)) or spec[k] <= 0]
    if bad or (spec["num_sms"] != int(spec["num_sms"])):
        raise ValueError(f"hardware spec {str(p)!r}: {', '.join(f'{k}={spec[k]!r}' for k in bad or ['num_sms'])}: "
                         "expected numbers > 0 (num_sms an integer)")
    cluster = spec.get("cta_cluster", OPTIONAL["cta_cluster"])
    if isinstance(cluster, bool) or not isinstance(cluster, int) or cluster < 1:
        raise ValueError(f"hardware spec {str(p)!r}: cta_cluster={cluster!r}: expected an integer >= 1")
    v = {k: spec[k] * unit for k, unit in KEYS.items()}
    return HardwareSpec(str(spec.get("name") or p.stem).lower(), v["peak_tflops"], v["vector_tflops"],
                        v["memory_bandwidth_gbs"], v["memory_gib"], v["interconnect_gbs"], v["pcie_gbs"],
                        num_sms=int(v["num_sms"]), cta_cluster=cluster)
