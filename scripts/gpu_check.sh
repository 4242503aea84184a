#!/usr/bin/env bash
# Issue 4's GPU checks as one run: the kernel property tests on CUDA (every KV format: float,
# int8, fp8, int4 -- they are parametrized by device), the quantized formats' error report on
# CUDA (fails if an output leaves its derived bound), then the benchmark.
#
#   scripts/gpu_check.sh        # on a machine with a CUDA GPU; at most 585 s of steps
#
# Logs go to $OUT when it is set (the device tool's output folder), else to out/gpu_check/.
# PYTHON picks the interpreter (default python3, the one holding torch and triton on the lent
# H200 machines; the repo needs no install, it runs from its root). Each step has a time limit
# so the whole script fits in one 10-minute device call.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
LOGS="${OUT:-out/gpu_check}"
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$LOGS/gpu.txt"
"$PYTHON" -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__,
    'cuda available:', torch.cuda.is_available())" 2>&1 | tee -a "$LOGS/gpu.txt"

# The CUDA cases only (-k cuda: the tests parametrized by device): the CPU cases already run in
# `make test`, and they lean on the Triton interpreter, whose internals differ in the Triton the
# GPU machine brings. test_compile, which compiles for a GPU without one, is not needed here.
KERNELS_TEST_DEVICES=cuda HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}" timeout 300 \
    "$PYTHON" -m pytest tests/kernels -q -k cuda --maxfail=5 --ignore=tests/kernels/test_compile.py \
    2>&1 | tee "$LOGS/pytest_cuda.log"
tests_status=${PIPESTATUS[0]}

timeout 30 "$PYTHON" -m kernels.quant_report --device cuda 2>&1 | tee "$LOGS/quant_report.log"
quant_status=${PIPESTATUS[0]}

timeout 180 "$PYTHON" -m kernels.bench --csv "$LOGS/bench.csv" 2>&1 | tee "$LOGS/bench.log"
bench_status=${PIPESTATUS[0]}

# The quantized caches' kernels, fewer shapes (fp8 needs sm_89+: an H100/H200, not an A100).
timeout 75 "$PYTHON" -m kernels.bench --quick --kv-cache-dtype int8,fp8,int4 --csv "$LOGS/bench_quantized.csv" \
    2>&1 | tee "$LOGS/bench_quantized.log"
quantized_bench_status=${PIPESTATUS[0]}

echo "pytest exit $tests_status, quant_report exit $quant_status, bench exit $bench_status," \
    "quantized bench exit $quantized_bench_status" | tee "$LOGS/summary.txt"
[ "$tests_status" -eq 0 ] && [ "$quant_status" -eq 0 ] && [ "$bench_status" -eq 0 ] && [ "$quantized_bench_status" -eq 0 ]
