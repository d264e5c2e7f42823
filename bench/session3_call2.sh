#!/usr/bin/env bash
# Device call: kernel tests, the offline run (breakdown, compiles), then the serving stage
# (the offline engine on the serving shape, and bench.serve against openai-serve).
# Usage: bash bench/session3_call2.sh OUT
set -uo pipefail
out=${1:?usage: session3_call2.sh OUT_DIR}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
model=${BENCH_MODEL:-/tmp/qwen3-0.6b-bench}
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$out/device.txt"
python3 -c "import httptools, uvloop, uvicorn; print('httptools', httptools.__version__, 'uvloop', uvloop.__version__, 'uvicorn', uvicorn.__version__)"
timeout 150 python3 -m pytest -p no:cacheprovider -q tests/gpu/test_kernels.py tests/gpu/test_sampling_kernel.py 2>&1 | tail -3
python3 -c "from bench.bench_model import build_bench_model; build_bench_model('$model')" > /dev/null 2>&1
timeout 200 python3 -m bench.throughput --model "$model" --peer none --batch1-tokens 0 --profile-steps 0 \
  --out "$out/throughput.json" 2>&1 | grep -v Warn | tail -12
timeout 150 python3 -m bench.throughput --model "$model" --workload serve --peer none --batch1-tokens 0 \
  --profile-steps 0 --max-seconds 90 --out "$out/throughput_serve.json" 2>&1 | grep -v Warn | tail -12
server_args="--model $model --dtype bfloat16 --max-model-len 4096 --max-num-seqs 256 --max-num-batched-tokens 8192"
timeout 200 python3 -m bench.serve --launch --label openai-serve --server-args "$server_args" \
  --levels 1,16,64,256,1 --num-requests 32,128,256,768,16 --max-seconds-per-level 60 \
  --server-log "$out/server_openai.log" --out "$out/serve_openai.json" 2>&1 | tail -12
