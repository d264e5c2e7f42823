#!/usr/bin/env bash
# Device call 5 of issue 14 (H100, the warm machine of call 4): installs flash-attn-4 (carry .fa4/b; call 4
# staged .fa4/a), runs its kernel parity tests and the model parity tests for flash-attn and auto, then
# profiles steps of the offline engine on the serving shape (steps with prefill among them).
# Usage, from the repo root of the device copy: bash .devtree/i14-speed/bench/flash_attn_tests_check.sh OUT
set -uo pipefail
cp .fa4/b/* /tmp/fa/ && (cd /tmp/fa && cat part.aa part.ab > "$(cat wheelname)" && rm part.a?) \
  && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fasite /tmp/fa/*.whl 2>&1 | tail -2
source "$(dirname "$0")/device_env.sh"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_flash_attn.py \
  tests/gpu/test_parity_gpu.py -k "flash or auto" -rf > "$work/pytest_flash.log" 2>&1
echo "pytest exit $?"
grep -E "passed|failed|^FAILED|^ERROR" "$work/pytest_flash.log" | tail -12 | cut -c1-300
for _ in $(seq 60); do [ -f $model/tokenizer.json ] && break; sleep 2; done
timeout 150 python3 -m bench.throughput --model $model --workload serve --peer none --batch1-tokens 0 \
  --max-seconds 40 --profile-steps 8 --out "$work/throughput_serve_profile.json" > "$work/log_profile" 2>&1
grep -E "attention backend|ours:|share_of_ideal|with prefill" "$work/log_profile" | cut -c1-300
