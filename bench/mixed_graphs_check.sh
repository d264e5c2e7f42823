#!/usr/bin/env bash
# Device call 1 of issue 14 (H100): tests/gpu with CUDA graphs for steps with prefill (Triton), then the
# offline nano-vllm workload with those graphs on and off (same machine, one after the other), and the
# offline engine on the serving shape. Also stages the first half of the FA4 wheels (carry .fa4/a) in
# /tmp/fa for call 2 (bench/flash_attn_check.sh) on the same warm machine.
# Usage, from the repo root of the device copy: bash .devtree/i14-speed/bench/mixed_graphs_check.sh OUT
set -uo pipefail
mkdir -p /tmp/fa && cp .fa4/a/* /tmp/fa/ 2>/dev/null; echo "staged $(ls /tmp/fa | wc -l) FA4 files"
source "$(dirname "$0")/device_env.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee "$work/device.txt"
echo "code: $BENCH_COMMIT" | tee -a "$work/device.txt"
(python3 -c "from bench.bench_model import build_bench_model; build_bench_model('$model')" > "$work/build.log" 2>&1 &)
timeout 230 python3 -m pytest -q -p no:cacheprovider tests/gpu -k "not flash" > "$work/pytest_gpu.log" 2>&1
grep -E "passed|failed|error" "$work/pytest_gpu.log" | tail -12 | cut -c1-300
for _ in $(seq 120); do [ -f $model/tokenizer.json ] && break; sleep 2; done; sleep 2
run() {  # label, extra flags
  timeout 170 python3 -m bench.throughput --model $model --peer none --max-seconds 60 --profile-steps 0 \
    --attention-backend triton --out "$work/throughput_$1.json" "${@:2}" > "$work/log_$1" 2>&1
  grep -v Warn "$work/log_$1" | grep -E "ours:|batch-1|compiles|share_of_ideal|with prefill|Error|error" | cut -c1-330
}
run nano_mixed_on
run nano_mixed_off --mixed-graphs off --batch1-tokens 0
run serve_mixed_on --workload serve --batch1-tokens 0
