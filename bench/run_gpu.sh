#!/usr/bin/env bash
# The GPU benchmarks, one stage a call, from the repository root: bash bench/run_gpu.sh STAGE OUT_DIR [ARGS...]
#   offline      nano-vllm's workload and batch 1, each against the ideal (ARGS: bench.throughput's)
#   serve        the offline engine on the serving shape (the reference for the server's share), then openai-serve
#                over HTTP at concurrency 1, 16, 64 and 256 (ARGS: server flags, e.g. --decode-hold-ms 1000)
#   chat         multi-turn chats sharing a 2k-token system prompt, prefix caching on, then off (bench.prefix_serve)
#   startup      openai-serve started twice on one fresh cache directory: seconds to /health and the attention
#                backends each start chose (the first measures, the second reads the choice; ARGS: server flags)
#   skinny-gemm  the skinny GEMM against cuBLAS, or the quantized GEMMs (ARGS: bench.kernels.skinny_gemm's, --weights)
#   fused-moe    the fused MoE kernels against their ideal per row count (ARGS: bench.kernels.fused_moe's; --sweep)
#   speculative  batch 1 with speculative decoding (n-gram, suffix) and without, on code editing, summarizing and
#                free chat (bench.default_model_speed; needs MODEL, a real model; ARGS: its flags)
#   speculative-serve  the serve stage's levels without, then with speculative decoding (needs MODEL; ARGS: the
#                --speculative-config JSON, default n-gram)
#   tests        tests/gpu (ARGS: pytest's)
# MODEL: a checkpoint directory to measure; else random weights of SHAPE (a name in bench/shapes.toml or a config.json;
# default qwen3-0.6b), its projections in QUANTIZATION's format where set (fp8, w4a16, gguf-q4_k_m), built once under
# /tmp/bench-models. LOAD_FORMAT=dummy: only config.json and the tokenizer are written, the engine draws the weights.
# BENCH_COMMIT names the commit where the tree has no .git.
set -euo pipefail
stage=${1:?usage: run_gpu.sh STAGE OUT_DIR [ARGS...]}
out=${2:?usage: run_gpu.sh STAGE OUT_DIR [ARGS...]}
shift 2
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
shape=${SHAPE:-qwen3-0.6b}
load_format=${LOAD_FORMAT:-auto}
config_only=$([ "$load_format" = dummy ] && echo --config-only || true)
built=/tmp/bench-models/$(basename "${shape%/config.json}")${QUANTIZATION:+-$QUANTIZATION}${config_only:+-config}
model=${MODEL:-$built}
[ -n "${MODEL:-}" ] || python3 -m bench.bench_model "$shape" "$model" $config_only ${QUANTIZATION:-} > /dev/null
server_args="--model $model --dtype bfloat16 --max-model-len 4096 --max-num-seqs 256 --max-num-batched-tokens 8192"
server_args="$server_args --load-format $load_format"

serve_levels() {  # LABEL SERVER_FLAGS NAME: openai-serve at concurrency 1, 16, 64 and 256, into NAME.json
  python3 -m bench.serve --launch --label "$1" --server-args "$server_args $2" --levels 1,16,64,256 \
    --num-requests 32,128,256,768 --max-seconds-per-level 60 --server-log "$out/$3.log" --out "$out/$3.json"
}

case "$stage" in
  offline)
    python3 -m bench.throughput --model "$model" --load-format "$load_format" --out "$out/throughput.json" "$@" ;;
  serve)
    python3 -m bench.throughput --model "$model" --load-format "$load_format" --workload serve --batch1-tokens 0 \
      --out "$out/throughput_serve.json"
    serve_levels "openai-serve${*:+ $*}" "$*" serve ;;
  chat)
    python3 -m bench.prefix_serve --launch --server-args "$server_args $*" --levels 1,128 --num-chats 8,384 \
      --max-seconds-per-level 60 --log-dir "$out" --out "$out/chat.json" ;;
  startup)
    python3 -m bench.startup_time --server-args "$server_args $*" --log-dir "$out" --out "$out/startup.json" ;;
  skinny-gemm)
    python3 -m bench.kernels.skinny_gemm --out "$out/skinny_gemm.json" "$@" ;;
  fused-moe)
    python3 -m bench.kernels.fused_moe --out "$out/fused_moe.json" "$@" ;;
  speculative)
    for prompts in code_edit summarize free_chat; do
      python3 -m bench.default_model_speed --model "${MODEL:?the speculative stages need MODEL}" --device cuda \
        --ours bfloat16 --speculative off,ngram,suffix --prompts $prompts --tokens 256 --repeats 3 \
        --out "$out/speculative_$prompts.json" "$@"
    done ;;
  speculative-serve)
    name="openai-serve $(basename "${MODEL:?the speculative stages need MODEL}")"
    spec=${1:-'{"method": "ngram", "num_speculative_tokens": 4}'}
    serve_levels "$name" "" serve
    serve_levels "$name, speculative" "--speculative-config '$spec'" serve_speculative ;;
  tests)
    # One process (pyproject's addopts ask pytest-xdist for two workers, which the GPU image lacks).
    python3 -m pytest -p no:cacheprovider -o addopts= -rfEs tests/gpu "$@" ;;
  *)
    echo "unknown stage $stage" >&2
    exit 2 ;;
esac
