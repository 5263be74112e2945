#!/usr/bin/env bash
# The GPU figures in one run on a lent GPU machine (about 9 minutes on one H100/H200).
#
# What a GPU machine lacks is carried as wheels in .whl/ (msgspec; it has torch, numpy,
# pyarrow, scikit-learn and rich), and an earlier tree to compare with in .base/ (its
# src, analysis and benchmarks: `git archive REF src analysis benchmarks | tar -x -C
# .base`). Results go to $OUT (the device tool's folder) or to
# benchmarks/results/gpu_check/, and a summary table is printed at the end. Every step
# has its own time limit and the whole script a deadline, so what finished comes back
# even when a step runs long. Try it on a CPU first:
#
#     DEVICE=cpu QUICK=1 bash benchmarks/gpu_check.sh
#
# Steps, most important first: EPS of trainer/batched/floor (synthetic_ref 4/16/64 envs,
# 20-step episodes, variants by turns, phase times), the same at 16 envs with the .base
# tree and this one by turns, the batched train step and the stacked validation eager
# against replayed CUDA graphs (cuda_graphs.py), a torch.profiler summary of batched
# steps (GPU busy share, launches, copies, top host functions) and synchronising CUDA
# calls per env-step, the CUDA-only tests and the sync guard.
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
SITE=${PYTHONPATH:+:$PYTHONPATH}
export PYTHONPATH="src:analysis$SITE"
export PYTHONUNBUFFERED=1
Q=${QUICK:+--quick}
EPISODE=${QUICK:+2}
EPISODE=${EPISODE:-20}

step() {  # step NAME LIMIT_S COMMAND...: run it within its limit and the deadline
    local name=$1 limit=$2 left
    shift 2
    [[ " ${SKIP:-} " == *" $name "* ]] && return  # SKIP="eps_base ...": steps to leave out
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

step versions 30 python3 -c "import torch, platform, subprocess; print(platform.python_version(), torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA'); print(subprocess.run(['nvidia-smi', '--query-gpu=driver_version', '--format=csv,noheader'], capture_output=True, text=True).stdout if torch.cuda.is_available() else '')"
VARIANTS=trainer,batched,floor
step smoke_batched 60 python3 -m esper train --device "$DEVICE" --batch-envs --envs 4 --rounds 1 \
    --episode-length 2 --telemetry-level off --no-progress --task digits
grep -q "smoke_batched rc=0" "$RESULTS/status.txt" || VARIANTS=trainer,floor
step eps_synthetic_ref 270 python3 benchmarks/eps.py --device "$DEVICE" --tasks synthetic_ref \
    --n-envs 4,16,64 --episode-length "$EPISODE" --variants "$VARIANTS" --repeats 2 \
    --out "$RESULTS/eps_synthetic_ref" $Q
if [[ -d .base/src ]]; then  # an earlier tree: the same batched workload, trees by turns
    for turn in 1 2; do
        step "eps_base_$turn" 45 env PYTHONPATH=".base/src:.base/analysis$SITE" \
            python3 .base/benchmarks/eps.py --device "$DEVICE" --tasks synthetic_ref \
            --n-envs 16 --episode-length "$EPISODE" --variants batched --repeats 1 \
            --out "$RESULTS/eps_base_$turn" $Q
        step "eps_new_$turn" 45 python3 benchmarks/eps.py --device "$DEVICE" \
            --tasks synthetic_ref --n-envs 16 --episode-length "$EPISODE" --variants batched \
            --repeats 1 --out "$RESULTS/eps_new_$turn" $Q
    done
fi
step cuda_graphs 100 python3 benchmarks/cuda_graphs.py --device "$DEVICE" --n-envs 16,64 \
    --layouts host,mixed,late --out "$RESULTS" $Q
step cuda_checks 90 python3 benchmarks/cuda_checks.py syncs profile --device "$DEVICE" \
    --out "$RESULTS" $Q
step cuda_tests 90 python3 -m pytest -q -p no:cacheprovider tests/training/test_sync_guard.py \
    tests/training/test_ppo.py tests/training/test_buffer.py tests/policy/test_policy_network.py
python3 benchmarks/gpu_summary.py "$RESULTS"
