"""Accelerator specs the roofline cost model and the memory planner need.

Figures are the vendors' dense (no sparsity) datasheet numbers:
- A100-80GB SXM: NVIDIA A100 datasheet (2021): 312 TFLOP/s BF16/FP16 tensor, 19.5 TFLOP/s FP32,
  2,039 GB/s HBM2e, 80 GB, NVLink 600 GB/s (300 GB/s each way), PCIe Gen4 x16.
- H100 SXM5 80GB: NVIDIA H100 datasheet: 989 TFLOP/s BF16 dense (1,979 with sparsity),
  67 TFLOP/s FP32, 3.35 TB/s HBM3, NVLink 900 GB/s, PCIe Gen5 x16.
- H200 SXM 141GB: NVIDIA H200 datasheet: H100 compute, 4.8 TB/s HBM3e, 141 GB.
- RTX 4090: Ada whitepaper: 165 TFLOP/s FP16 tensor with FP32 accumulate (what PyTorch uses),
  82.6 TFLOP/s FP32, 1,008 GB/s GDDR6X, 24 GB, no NVLink (all-reduce goes over PCIe).
- L4: NVIDIA L4 datasheet: 121 TFLOP/s FP16 tensor dense, 30.3 TFLOP/s FP32, 300 GB/s, 24 GB, PCIe.
- A40: NVIDIA A40 datasheet: 149.7 TFLOP/s FP16 tensor dense (299.4 with sparsity), 37.4 TFLOP/s
  FP32, 696 GB/s GDDR6, 48 GB, NVLink bridge 112.5 GB/s (56 each way), PCIe Gen4; 84 SMs (GA102).
- L40S: NVIDIA L40S datasheet: 362 TFLOP/s FP16/BF16 tensor dense (733 with sparsity), 91.6 TFLOP/s
  FP32, 864 GB/s GDDR6, 48 GB, no NVLink, PCIe Gen4; 142 SMs (AD102).
- A10G (AWS G5): NVIDIA publishes no A10G datasheet; taken from the A10 datasheet (125 TFLOP/s FP16
  tensor dense, 31.2 TFLOP/s FP32, 600 GB/s GDDR6, 24 GB, PCIe Gen4) with the A10G's 80 SMs (GA102).
- B200 (HGX B200): NVIDIA HGX B200 datasheet: 2.25 PFLOP/s FP16/BF16 dense (4.5 with sparsity),
  8 TB/s HBM3e, 180 GB, NVLink 5 1.8 TB/s (900 GB/s each way), PCIe Gen5; 148 SMs; FP32 not
  published: 148 SMs x 128 lanes x 2 FLOP x ~2.1 GHz = ~80 TFLOP/s.
- MI300X: AMD Instinct MI300X datasheet: 1,307 TFLOP/s FP16 dense (2,615 with sparsity), 163.4
  TFLOP/s FP32 vector, 5.3 TB/s HBM3, 192 GB, 7 Infinity Fabric links of 128 GB/s (64 each way:
  448 GB/s each way to the other seven of an 8-GPU platform), PCIe Gen5; 304 compute units.
Thread block clusters (`cta_cluster`): GPUs of compute capability 9.0 and later (Hopper: H100, H200;
Blackwell: B200) launch a GEMM's CTAs as clusters, and CUTLASS's sm90 tile scheduler rounds the tile
grid up to a whole number of clusters along each mode (`get_tiled_cta_shape_mnl` in NVIDIA/cutlass,
include/cutlass/gemm/kernel/tile_scheduler_params.h). A cluster of 2 along the token rows is taken: the
two CTAs share (TMA-multicast) one tile of the weights (pairs along the weights' columns fit the H100's profiles
worse: the README's cost models). Earlier GPUs (Ampere, Ada) and AMD have none: 1.
Measured on the H100 only (`sim.calibrate`); the H200 and B200 follow the architecture, unchecked.
PCIe Gen4 x16 moves 32 GB/s each way in theory, Gen5 64 GB/s. The "GB" of GPU memory in
these datasheets are GiB (an A100-80GB reports 81,920 MiB).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .catalog import lookup
from .hardware_file import is_spec_path, read_hardware_file

GB = 10**9
TFLOP = 10**12


@dataclass(slots=True, frozen=True)
class HardwareSpec:
    name: str
    peak_flops: float  # FP16/BF16 tensor-core FLOP/s, dense
    vector_flops: float  # FP32 FLOP/s off the tensor cores (dequantization runs there)
    memory_bandwidth: float  # bytes/s
    memory_gib: float
    interconnect_bandwidth: float  # bytes/s each way between GPUs of one tensor-parallel group
    pcie_bandwidth: float  # bytes/s each way between host and GPU (swap)
    num_sms: int = field(kw_only=True)  # SMs (AMD: compute units): a GEMM's tiles run in waves of these
    cta_cluster: int = field(default=1, kw_only=True)  # row tiles launched as one cluster (see the module doc)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)


HARDWARE: dict[str, HardwareSpec] = {h.name: h for h in (
    HardwareSpec("a100-80gb", 312 * TFLOP, 19.5 * TFLOP, 2039 * GB, 80, 300 * GB, 32 * GB, num_sms=108),
    HardwareSpec("h100", 989 * TFLOP, 67 * TFLOP, 3350 * GB, 80, 450 * GB, 64 * GB, num_sms=132, cta_cluster=2),
    HardwareSpec("h200", 989 * TFLOP, 67 * TFLOP, 4800 * GB, 141, 450 * GB, 64 * GB, num_sms=132, cta_cluster=2),
    HardwareSpec("rtx-4090", 165 * TFLOP, 82.6 * TFLOP, 1008 * GB, 24, 32 * GB, 32 * GB, num_sms=128),
    HardwareSpec("l4", 121 * TFLOP, 30.3 * TFLOP, 300 * GB, 24, 32 * GB, 32 * GB, num_sms=58),
    HardwareSpec("a40", 149.7 * TFLOP, 37.4 * TFLOP, 696 * GB, 48, 56 * GB, 32 * GB, num_sms=84),
    HardwareSpec("l40s", 362 * TFLOP, 91.6 * TFLOP, 864 * GB, 48, 32 * GB, 32 * GB, num_sms=142),
    HardwareSpec("a10g", 125 * TFLOP, 31.2 * TFLOP, 600 * GB, 24, 32 * GB, 32 * GB, num_sms=80),
    HardwareSpec("b200", 2250 * TFLOP, 80 * TFLOP, 8000 * GB, 180, 900 * GB, 64 * GB, num_sms=148, cta_cluster=2),
    HardwareSpec("mi300x", 1307 * TFLOP, 163.4 * TFLOP, 5300 * GB, 192, 448 * GB, 64 * GB, num_sms=304),
)}

_ALIASES = {"a100": "a100-80gb", "a100-80g": "a100-80gb", "h100-80gb": "h100", "h100-sxm": "h100",
            "h200-141gb": "h200", "4090": "rtx-4090", "rtx4090": "rtx-4090", "b200-180gb": "b200",
            "mi300": "mi300x"}


def get_hardware(name: str | HardwareSpec) -> HardwareSpec:
    """A catalog GPU by name, or a spec file (`sim.hardware_file`)."""
    if isinstance(name, str) and name.lower() not in HARDWARE and is_spec_path(name):
        return read_hardware_file(name)
    return lookup("hardware", name, HARDWARE, _ALIASES)
