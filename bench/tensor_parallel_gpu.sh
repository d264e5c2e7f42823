#!/usr/bin/env bash
# Issue 15's device check: tensor parallelism on two GPUs (nvidia-h200-x2), one call under 10 minutes.
# Usage, from the repo root on the GPU machine (the server's wheels from ../shared/device/wheels.sh on PYTHONPATH):
#   NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
#     bash bench/tensor_parallel_gpu.sh OUT_DIR [STAGES]
# STAGES, comma-separated, in this order by default: parity,e2e,allreduce,wire,bench (a stage cut short by the
# budget can be run alone in a second call)
#   parity     tests/gpu/test_tensor_parallel_gpu.py: float32 TP=2 = transformers (chunked prefill, prefix hits,
#              preemption); bf16 TP=2 vs TP=1 by the top-5 rule; TP=2 CUDA graphs on = off
#   bench      a random bf16 Qwen3-14B checkpoint; bench.throughput at TP=2, then TP=1 (nano-vllm workload,
#              batch-1 at a 1k context), each against its ideal (one rank's share at TP=2)
#   e2e        the streaming e2e tests against a TP=2 server on the GPUs; if any fails, the same at TP=1 (a control)
#   allreduce  NCCL all-reduce time per call at a decode step's sizes, eager and inside a CUDA graph
#   wire       the host cost of sending a step's batch to the workers (bench/batch_wire_cost.py)
# Every stage is time-boxed by what is left of TP_BUDGET_S (default 560 s). Stages write to a scratch folder;
# OUT_DIR gets four files (the device returns at most eight): summary.json (every stage's result, from
# bench/tensor_parallel_report.py), throughput_tp1.json and throughput_tp2.json (for bench/results), log.
set -uo pipefail
out=${1:?usage: tensor_parallel_gpu.sh OUT_DIR [STAGES]}
stages=,${2:-parity,e2e,allreduce,wire,bench},
budget=${TP_BUDGET_S:-560}
model=${TP_BENCH_MODEL:-/tmp/qwen3-14b-bench}
work=$(mktemp -d /tmp/tp-device-check.XXXX)
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
for name in NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS; do
  [ -n "${!name:-}" ] || { echo "$name must be set (see ../shared/device and KINDS.md)"; exit 2; }
done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$work/device.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version(), \
'transformers', transformers.__version__)" | tee -a "$work/device.txt"

boxed() {  # boxed CAP_S COMMAND...: runs COMMAND for at most CAP_S seconds or what is left of the budget
  local cap=$1; shift
  local left=$((budget - SECONDS))
  [ "$left" -gt 10 ] || { echo "skipped (budget spent): $*" | tee -a "$work/log"; return 124; }
  timeout -k 10 $((cap < left ? cap : left)) "$@" 2>&1 | tee -a "$work/log"
  return "${PIPESTATUS[0]}"
}
stage() { [[ $stages == *,$1,* ]]; }

if stage parity; then
  boxed 170 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_tensor_parallel_gpu.py --junitxml "$work/parity.xml"
fi
if stage e2e; then
  e2e=(tests/e2e/test_streaming.py tests/e2e/test_chat.py tests/e2e/test_completions.py tests/e2e/test_concurrency.py)
  if ! OPENAI_SERVE_E2E_DEVICE=cuda OPENAI_SERVE_E2E_TP=2 boxed 150 python3 -m pytest -q -p no:cacheprovider \
      "${e2e[@]}" --junitxml "$work/e2e_tp2.xml"; then
    OPENAI_SERVE_E2E_DEVICE=cuda OPENAI_SERVE_E2E_TP=1 boxed 90 python3 -m pytest -q -p no:cacheprovider \
      "${e2e[@]}" --junitxml "$work/e2e_tp1_control.xml"
  fi
fi
if stage allreduce; then
  boxed 60 python3 -m bench.allreduce_latency --ranks 2 --hidden 5120 --out "$work/allreduce.json"
fi
if stage wire; then
  boxed 30 python3 -m bench.batch_wire_cost --out "$work/batch_wire_cost.json"
fi
if stage bench; then
  boxed 150 python3 -c "from bench.bench_model import build_large_bench_model as b; b('$model', 'qwen3-14b')"
  for tp in 2 1; do
    boxed 170 python3 -m bench.throughput --model "$model" --tensor-parallel-size $tp --peer none --profile-steps 0 \
      --warmup short --max-seconds 60 --batch1-tokens 64 --out "$work/throughput_tp$tp.json"
  done
fi
echo "done in $SECONDS s" | tee -a "$work/log"
python3 -m bench.tensor_parallel_report "$work" "$out/summary.json"
cp "$work"/throughput_tp*.json "$work/log" "$out/" 2>/dev/null
ls -l "$out"
