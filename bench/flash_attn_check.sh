#!/usr/bin/env bash
# Device call 2 of issue 14 (H100, the warm machine of call 1): installs flash-attn-4 from the two halves
# of its wheels (carry .fa4/b; call 1 staged .fa4/a in /tmp/fa) and the server's wheels (carry .whl),
# then tests/gpu for the flash-attn backend (kernel parity and model parity), the per-phase attention
# comparison (bench/attention_backends.py) and the offline nano-vllm workload with `auto` (which logs
# what it measured and picked per phase).
# Usage, from the repo root of the device copy: bash .devtree/i14-speed/bench/flash_attn_check.sh OUT
set -uo pipefail
cp .fa4/b/* /tmp/fa/ && (cd /tmp/fa && cat part.aa part.ab > "$(cat wheelname)" && rm part.a?) \
  && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fasite /tmp/fa/*.whl 2>&1 | tail -2
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | tail -2
source "$(dirname "$0")/device_env.sh"
python3 -c "import flash_attn.cute.interface; print('fa4 imports')" 2>&1 | tail -1
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_flash_attn.py \
  tests/gpu/test_parity_gpu.py -k "flash or auto" > "$work/pytest_flash.log" 2>&1
grep -E "passed|failed|error|Error" "$work/pytest_flash.log" | tail -12 | cut -c1-300
timeout 150 python3 -m bench.attention_backends --commit "$BENCH_COMMIT" \
  --out "$work/attention_backends.json" > "$work/log_attention" 2>&1
grep "^|" "$work/log_attention" || tail -5 "$work/log_attention"
timeout 170 python3 -m bench.throughput --model $model --peer none --max-seconds 60 --profile-steps 6 \
  --attention-backend auto --out "$work/throughput_nano_auto.json" > "$work/log_auto" 2>&1
grep -v Warn "$work/log_auto" | grep -E "attention backend|ours:|batch-1|compiles|share_of_ideal|with prefill|Error" | cut -c1-330
