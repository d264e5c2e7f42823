#!/usr/bin/env bash
# Issue 5's benchmarks on a GPU machine, one device call per stage (each well inside the 10-minute limit).
# Usage, from the repo root on the GPU machine:
#   bash bench/run_gpu.sh offline OUT_DIR   # nano-vllm workload: ours, transformers (subset), ideal, batch-1, profile
#   bash bench/run_gpu.sh serve OUT_DIR     # offline reference on the serving shape, then openai-serve and
#                                           # transformers serve over HTTP at concurrency 1, 16, 64, 256
#   bash bench/run_gpu.sh repeat OUT_DIR    # all but the peer again at one commit; c=1 after c=256; HF serve
#   bash bench/run_gpu.sh repeat-serve OUT_DIR  # the serve stage alone, with c=1 after c=256; HF serve
# Every run is time-boxed (--max-seconds and friends) so a slow engine yields partial figures, not a killed call.
set -uo pipefail
stage=${1:?usage: run_gpu.sh offline|serve|repeat|repeat-serve OUT_DIR}
out=${2:?usage: run_gpu.sh offline|serve|repeat|repeat-serve OUT_DIR}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
model=${BENCH_MODEL:-/tmp/qwen3-0.6b-bench}  # BENCH_MODEL: an existing checkpoint instead
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/device.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
  | tee -a "$out/device.txt"
python3 -c "from bench.bench_model import build_bench_model; build_bench_model('$model')"

transformers_serve() {
  # text prompts (its /v1/completions takes no token ids), no ignore_eos field (it rejects unknown fields):
  # EOS is turned off through its generation_config instead.
  local gen='{"do_sample": true, "temperature": 0.6, "top_k": 0, "top_p": 1.0, "eos_token_id": -1, "max_new_tokens": 128}'
  timeout "${HF_TIMEOUT:-280}" python3 -m bench.serve --label "transformers serve" --model "$model" \
    --launch-cmd "python3 -c 'from transformers.cli.transformers import app; app()' serve $model \
      --continuous-batching --host 127.0.0.1 --port {port}" \
    --levels 1,16,64,256 --num-requests 8,32,64,256 --max-seconds-per-level 40 --warmup-requests 2 \
    --prompt-format text --tokenizer "$model" --no-ignore-eos \
    --extra-body "$(python3 -c 'import json, sys; print(json.dumps({"generation_config": sys.argv[1]}))' "$gen")" \
    --server-log "$out/server_hf.log" --out "$out/serve_hf.json" 2>&1 | tee -a "$out/log"
}

server_args="--model $model --dtype bfloat16 --max-model-len 4096 --max-num-seqs 256 --max-num-batched-tokens 8192"
serve_stage() {  # the offline engine on the serving shape, then openai-serve at these levels, then the HF peer
  python3 -m bench.throughput --model "$model" --workload serve --peer none --batch1-tokens 0 --profile-steps 0 \
    --max-seconds 90 --out "$out/throughput_serve.json" 2>&1 | tee -a "$out/log"
  python3 -m bench.serve --launch --label openai-serve --server-args "$server_args" \
    --levels "$1" --num-requests "$2" --max-seconds-per-level 60 \
    --server-log "$out/server_openai.log" --out "$out/serve_openai.json" 2>&1 | tee -a "$out/log"
  HF_TIMEOUT=${3:-280} transformers_serve
}

if [ "$stage" = offline ]; then
  python3 -m bench.throughput --model "$model" --peer-requests 64 --peer-max-seconds 120 --peer-timeout 240 \
    --max-seconds 120 --out "$out/throughput.json" 2>&1 | tee -a "$out/log"
elif [ "$stage" = serve ]; then
  serve_stage 1,16,64,256 32,128,256,768
elif [ "$stage" = repeat-serve ]; then
  serve_stage 1,16,64,256,1 32,128,256,768,16 200
elif [ "$stage" = repeat ]; then
  # Everything but the peer again, at one commit: the offline run (batch-1 on the fresh engine and after load,
  # kernel-only profile), then the serve stage with a c=1 level after the c=256 load and HF serve time-boxed shorter.
  python3 -m bench.throughput --model "$model" --peer none --max-seconds 120 --out "$out/throughput_repeat.json" \
    2>&1 | tee -a "$out/log"
  serve_stage 1,16,64,256,1 32,128,256,768,16 200
fi
