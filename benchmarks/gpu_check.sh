#!/usr/bin/env bash
# The GPU figures in one run on a lent GPU machine (about 8 minutes on one H100/H200).
#
# What a GPU machine lacks is carried as wheels in .whl/ (msgspec; it has torch, numpy,
# pyarrow, scikit-learn and rich). Results go to $OUT (the device tool's folder) or to
# benchmarks/results/gpu_check/, and a summary table is printed at the end. Every step
# has its own time limit and the whole script a deadline, so what finished comes back
# even when a step runs long. Try it on a CPU first:
#
#     DEVICE=cpu QUICK=1 bash benchmarks/gpu_check.sh
#
# Steps, most important first: EPS of trainer/batched/floor (synthetic_ref 4/16/64 envs;
# digits 4/16), the launch counter on the device at 16 envs, the batched train step
# eager against a replayed CUDA graph and validation stacked against per env
# (cuda_graphs.py), synchronising CUDA calls
# per env-step (sync debug mode "warn"), AMP bf16/fp16 smoke runs, the CUDA-only tests,
# a torch.profiler summary of a few batched steps, digits 4/16 and digits_tiny 16.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DEVICE=${DEVICE:-cuda}
QUICK=${QUICK:-}
RESULTS=${OUT:-benchmarks/results/gpu_check}
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-540} ))
mkdir -p "$RESULTS"
if ! python3 -c "import msgspec" 2> /dev/null && compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="src:analysis${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
Q=${QUICK:+--quick}

step() {  # step NAME LIMIT_S COMMAND...: run it within its limit and the deadline
    local name=$1 limit=$2 left
    shift 2
    [[ " ${SKIP:-} " == *" $name "* ]] && return  # SKIP="eps_digits ...": steps to leave out
    left=$(( DEADLINE - $(date +%s) ))
    (( left < limit )) && limit=$left
    if (( limit < 10 )); then
        echo "$name skipped: no time left" | tee -a "$RESULTS/status.txt"
        return
    fi
    echo "== $name (limit ${limit}s)"
    local t0=$(date +%s)
    timeout "$limit" "$@" > "$RESULTS/$name.log" 2>&1
    local rc=$?
    echo "$name rc=$rc $(( $(date +%s) - t0 ))s" | tee -a "$RESULTS/status.txt"
    tail -n 30 "$RESULTS/$name.log"
}

step versions 30 python3 -c "import torch, platform; print(platform.python_version(), torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA')"
# A batched run that crashes must not cost the other variants' figures.
VARIANTS=trainer,batched,floor
step smoke_batched 60 python3 -m esper train --device "$DEVICE" --batch-envs --envs 4 --rounds 1 \
    --episode-length 2 --telemetry-level off --no-progress --task digits
grep -q "smoke_batched rc=0" "$RESULTS/status.txt" || VARIANTS=trainer,floor
step eps_synthetic_ref 260 python3 benchmarks/eps.py --device "$DEVICE" --tasks synthetic_ref \
    --n-envs 4,16,64 --variants "$VARIANTS" --repeats 2 --out "$RESULTS/eps_synthetic_ref" $Q
step launches 90 python3 benchmarks/launches.py --device "$DEVICE" --tasks synthetic_ref \
    --n-envs 16 --sites --out "$RESULTS" $Q
step cuda_graphs 120 python3 benchmarks/cuda_graphs.py --device "$DEVICE" --n-envs 16,64 \
    --out "$RESULTS" $Q
step cuda_checks 120 python3 benchmarks/cuda_checks.py syncs amp profile --device "$DEVICE" \
    --out "$RESULTS" $Q
step cuda_tests 90 python3 -m pytest -q -p no:cacheprovider tests/training/test_sync_guard.py \
    tests/training/test_ppo.py tests/training/test_buffer.py tests/policy/test_policy_network.py
step eps_digits 90 python3 benchmarks/eps.py --device "$DEVICE" --tasks digits --n-envs 4,16 \
    --variants "$VARIANTS" --repeats 2 --out "$RESULTS/eps_digits" $Q
# The CPU proxy of docs/batching.md (per-env Python and dispatch): does it track the GPU?
step eps_tiny 60 python3 benchmarks/eps.py --device "$DEVICE" --tasks digits_tiny --n-envs 16 \
    --variants "$VARIANTS" --repeats 1 --out "$RESULTS/eps_tiny" $Q
if [[ -d .base/src ]]; then  # a copy of an earlier tree: the same EPS measured by turns
    step eps_base 100 env PYTHONPATH=".base/src:.base/analysis${PYTHONPATH#src:analysis}" \
        python3 benchmarks/eps.py --device "$DEVICE" --tasks synthetic_ref --n-envs 16 \
        --variants "$VARIANTS" --repeats 2 --out "$RESULTS/eps_base" $Q
    step eps_new 100 python3 benchmarks/eps.py --device "$DEVICE" --tasks synthetic_ref \
        --n-envs 16 --variants "$VARIANTS" --repeats 2 --out "$RESULTS/eps_new" $Q
fi
python3 benchmarks/gpu_summary.py "$RESULTS"
