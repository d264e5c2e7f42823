#!/usr/bin/env bash
# Every GPU benchmark, one stage per device call (each well inside the 10-minute limit; every run is time-boxed, so
# a slow engine yields partial figures, not a killed call). From the repo root on the GPU machine:
#   bash bench/run_gpu.sh STAGE OUT_DIR [ARGS...]
# Stages (ARGS go to the stage's Python entry where it says so):
#   tests         tests/gpu: kernels, fused kernels, skinny GEMM, sampling kernel, GPU parity (ARGS: pytest's, e.g. -k);
#                 with FA4 installed it outgrows its 500 s: run it as two calls, -k 'not skinny' then -k skinny
#   decode-step   one decode step at batch 1 and 256, graphs on and off (ARGS: bench.decode_step_bench's,
#                 e.g. --variants default fused_elementwise=0 --profile)
#   offline       nano-vllm's workload: ours with the per-step breakdown and compile count, transformers on the
#                 first 64 requests, the ideal, batch-1 latency, a profile (ARGS: bench.throughput's, e.g. --peer none)
#   serve         the offline engine on the serving shape, openai-serve over HTTP at concurrency 1, 16, 64, 256 and
#                 1 again (after the load), then transformers serve
#   check         the offline engine on the serving shape and openai-serve at concurrency 1 and 256, no peers:
#                 the quick look after a change
#   ab-serve      openai-serve at concurrency 256 once per server-flag variant (ARGS, one quoted word each, e.g.
#                 --no-engine-process --engine-process), interleaved, twice each, beside the offline engine
#   serve-variants  openai-serve at concurrency 256 once per server-flag variant (ARGS as ab-serve's), in turn,
#                 no offline run: a quick look at what flags change at that load
#   burst         where a burst of prompts' time to first token goes: the offline engine on the serving shape and
#                 openai-serve at concurrency 256, both holding decodes 1000 ms, then openai-serve at its defaults
#                 (every request's timings: records_*.json)
#   serve-share   the offline engine on the serving shape, then openai-serve at concurrency 256, in turn, ROUNDS times
#                 (ARGS: ROUNDS, default 2): the server's share of the offline engine per round, each pair on one
#                 machine minutes apart (the share moved 96.96-103.3% between single runs)
#   ab-offline    the offline run on nano-vllm's workload (no peer) once per kernel variant (ARGS, e.g. default
#                 order_decode_rows=0: bench.throughput --kernels), each engine built with that KernelConfig
#   host-profile  cProfile of the engine's host time over the serving shape and over nano-vllm's workload
#   attention     the decode and prefill attention kernels (bench.attention_bench), then decode attention over
#                 unequal contexts per row order (bench.attention_mixed)
#   sampler       the sampling kernel against the torch path (bench.sampler_bench)
#   skinny-gemm   the skinny GEMM against cuBLAS (ARGS: bench.skinny_gemm_bench's, e.g. --sweep)
#   attention-backends  every attention backend that runs here (triton, flash-attn), per step phase, as graph
#                 replays and as eager calls (bench.attention_backends; flash-attn needs FA4_WHEELS, below)
#   ttft-starts   openai-serve at concurrency 1 on 5 fresh starts, no warm-up request (the first request counts),
#                 then the offline engine on the serving shape and openai-serve at concurrency 256 (ARGS: server flags)
#   sampling-cost offline tok/s with a JSON schema on every request and with penalties on every request, against
#                 neither, on the same shape (bench.sampling_cost; needs BENCH_TOKENIZER, a BPE tokenizer directory,
#                 and the xgrammar wheels)
#   prefix-heavy  multi-turn chats sharing a 2k-token system prompt against openai-serve with prefix caching on, then
#                 off (--no-enable-prefix-caching), at 1 and 128 chats in flight: hit rate, TTFT, tok/s
#                 (bench.prefix_serve; ARGS: its flags, e.g. --levels 1,64 --num-chats 8,192)
#   qwen3-8b      a random bf16 Qwen3-8B checkpoint (built in /tmp/qwen3-8b-bench), nano-vllm's workload and batch 1
#                 at a 1k context, each against that shape's ideal, KV cache and graphs at that size (ARGS:
#                 bench.throughput's)
# Environment: BENCH_MODEL, a checkpoint to use instead of the random Qwen3-0.6B (bench/bench_model.py);
# BENCH_TOKENIZER, the tokenizer directory of the sampling-cost stage;
# BENCH_COMMIT, the commit the tree is (the device's copy may have no .git; every result JSON records it);
# FA4_WHEELS, a folder holding the halves a/ and b/ of ../shared/device/fa4_wheels.sh's download (flash-attn-4, 107 MB):
# a call that carries one half stages it in /tmp/fa, and the call that brings the second installs both into
# /tmp/fasite (two consecutive calls to the same warm machine: one call carries at most 64 MiB); every stage then
# imports flash_attn.cute from there.
# The device tool brings back at most 8 files a call: a stage that writes more leaves them in one OUT_DIR/results.tgz
# (with device.txt and log beside it, unpacked), which `tar xzf results.tgz` unpacks here.
set -uo pipefail
stages="tests decode-step offline serve check ab-serve ab-offline host-profile attention sampler skinny-gemm"
stages="$stages attention-backends ttft-starts sampling-cost prefix-heavy qwen3-8b serve-share serve-variants burst"
usage="usage: run_gpu.sh ${stages// /|} OUT_DIR [ARGS...]"
stage=${1:?$usage}
out=${2:?$usage}
shift 2
if [[ " $stages " != *" $stage "* ]]; then
  echo "$usage" >&2
  exit 2
fi
mkdir -p "$out"
fa4_site=/tmp/fasite
if [ -n "${FA4_WHEELS:-}" ]; then
  mkdir -p /tmp/fa && cp "$FA4_WHEELS"/*/* /tmp/fa/ 2>/dev/null
  if [ -f /tmp/fa/part.aa ] && [ -f /tmp/fa/part.ab ]; then
    (cd /tmp/fa && cat part.aa part.ab > "$(cat wheelname)" && rm part.a?) \
      && python3 -m pip install -q --no-index --no-deps --no-compile --target $fa4_site /tmp/fa/*.whl
  fi
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ -d $fa4_site ]; then  # --target skips the .pth file that puts cutlass on the path
  # Imported through a path with a site-packages directory in it: quack takes only installed code as fixed when it
  # fingerprints its epilogues, and refuses to compile otherwise (gpu/kernels/gated_gemm.py).
  mkdir -p /tmp/fa4link && ln -sfn $fa4_site /tmp/fa4link/site-packages
  export PYTHONPATH=$PYTHONPATH:/tmp/fa4link/site-packages:/tmp/fa4link/site-packages/nvidia_cutlass_dsl/dsl_packages
fi
model=${BENCH_MODEL:-/tmp/qwen3-0.6b-bench}
log="$out/log"

{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  echo "commit ${BENCH_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}, stage $stage $*"
} | tee "$out/device.txt"

run() {  # SECONDS NAME COMMAND...: time-boxed, its output in the log and on the console
  local limit=$1 name=$2
  shift 2
  echo "== $name" | tee -a "$log"
  timeout "$limit" "$@" 2>&1 | grep --line-buffered -v "Warn" | tee -a "$log"
}

build_model() {
  python3 -c "from bench.bench_model import build_bench_model; build_bench_model('$model')" > /dev/null 2>&1
}

offline_serve_shape() {  # [SUFFIX [FLAGS]]: the reference for the server's share: the engine alone on bench.serve's shape
  # shellcheck disable=SC2086  # FLAGS: bench.throughput's, word-split on purpose
  run 150 "offline-serve-shape${1:-}" python3 -m bench.throughput --model "$model" --workload serve --peer none \
    --batch1-tokens 0 --profile-steps 0 --max-seconds 90 --out "$out/throughput_serve${1:-}.json" ${2:-}
}

server_args="--model $model --dtype bfloat16 --max-model-len 4096 --max-num-seqs 256 --max-num-batched-tokens 8192"
openai_serve() {  # NAME LEVELS REQUESTS [SERVER FLAGS]
  run 200 "$1" python3 -m bench.serve --launch --label "openai-serve${4:+ $4}" --server-args "$server_args ${4:-}" \
    --levels "$2" --num-requests "$3" --max-seconds-per-level 60 --server-log "$out/server_$1.log" \
    --records-out "$out/records_$1.json" --out "$out/serve_$1.json"
}

serve_each_variant() {  # SUFFIX FLAGS...: openai-serve at concurrency 256 once per server-flag variant, in turn
  local suffix=$1 variant=0 flags
  shift
  for flags in "$@"; do
    variant=$((variant + 1))
    openai_serve "variant$variant$suffix" 256 768 "$flags"
  done
}

transformers_serve() {
  # Text prompts (its /v1/completions takes no token ids), no ignore_eos field (it rejects unknown fields):
  # EOS is turned off through its generation_config instead.
  local gen='{"do_sample": true, "temperature": 0.6, "top_k": 0, "top_p": 1.0, "eos_token_id": -1, "max_new_tokens": 128}'
  run 200 transformers-serve python3 -m bench.serve --label "transformers serve" --model "$model" \
    --launch-cmd "python3 -c 'from transformers.cli.transformers import app; app()' serve $model \
      --continuous-batching --host 127.0.0.1 --port {port}" \
    --levels 1,16,64,256 --num-requests 8,32,64,256 --max-seconds-per-level 40 --warmup-requests 2 \
    --prompt-format text --tokenizer "$model" --no-ignore-eos \
    --extra-body "$(python3 -c 'import json, sys; print(json.dumps({"generation_config": sys.argv[1]}))' "$gen")" \
    --server-log "$out/server_hf.log" --out "$out/serve_hf.json"
}

case "$stage" in
  tests)
    run 500 tests python3 -m pytest -p no:cacheprovider -rfEs tests/gpu "$@" ;;  # pyproject adds -q; ARGS: pytest's
  decode-step)
    run 500 decode-step python3 -m bench.decode_step_bench --model-dir "$model" --out "$out/decode_step.json" "$@" ;;
  offline)
    build_model
    run 500 offline python3 -m bench.throughput --model "$model" --peer-requests 64 --peer-max-seconds 120 \
      --peer-timeout 240 --max-seconds 120 --out "$out/throughput.json" "$@" ;;
  serve)
    build_model
    offline_serve_shape
    openai_serve openai 1,16,64,256,1 32,128,256,768,16
    transformers_serve ;;
  check)
    build_model
    offline_serve_shape
    openai_serve openai 1,256 16,768 ;;
  ab-serve)
    build_model
    offline_serve_shape
    for round in 1 2; do
      serve_each_variant "_round$round" "$@"
    done ;;
  serve-variants)
    build_model
    serve_each_variant "" "$@" ;;
  burst)
    build_model
    offline_serve_shape _hold "--decode-hold-ms 1000"
    openai_serve c256_hold 256 768 "--decode-hold-ms 1000"
    openai_serve c256 256 768 ;;
  serve-share)
    build_model
    for round in $(seq 1 "${1:-2}"); do
      offline_serve_shape "_r$round"
      openai_serve "c256_r$round" 256 768
    done ;;
  ab-offline)
    build_model
    for variant in "$@"; do
      run 250 "offline $variant" python3 -m bench.throughput --model "$model" --peer none --batch1-tokens 0 \
        --profile-steps 0 --max-seconds 120 --kernels "$variant" --out "$out/throughput_${variant//[=+]/-}.json"
    done ;;
  host-profile)
    build_model
    run 200 host-profile-serve python3 -m bench.host_profile --model "$model" --workload serve \
      --out "$out/host_profile_serve.json"
    run 200 host-profile-nano-vllm python3 -m bench.host_profile --model "$model" \
      --out "$out/host_profile_nano_vllm.json" ;;
  attention)
    run 300 attention python3 -m bench.attention_bench --out "$out/attention.json"
    run 150 attention-mixed python3 -m bench.attention_mixed --out "$out/attention_mixed.json" ;;
  sampler)
    run 300 sampler python3 -m bench.sampler_bench --out "$out/sampler.json" ;;
  sampling-cost)
    build_model
    run 500 sampling-cost python3 -m bench.sampling_cost --tokenizer "${BENCH_TOKENIZER:?set BENCH_TOKENIZER}" \
      --out "$out/sampling_cost.json" "$@" ;;
  prefix-heavy)
    build_model
    run 470 prefix-heavy python3 -m bench.prefix_serve --launch --server-args "$server_args" --levels 1,128 \
      --num-chats 8,384 --max-seconds-per-level 60 --log-dir "$out" --out "$out/prefix_heavy.json" "$@" ;;
  qwen3-8b)
    large=/tmp/qwen3-8b-bench
    run 150 build-qwen3-8b python3 -c "from bench.bench_model import build_large_bench_model as b; b('$large', 'qwen3-8b')"
    run 320 qwen3-8b python3 -m bench.throughput --model "$large" --peer none --profile-steps 0 --warmup short \
      --max-seconds 90 --out "$out/throughput_qwen3_8b.json" "$@" ;;
  skinny-gemm)
    run 500 skinny-gemm python3 -m bench.skinny_gemm_bench --out "$out/skinny_gemm.json" "$@" ;;
  attention-backends)
    run 200 attention-backends python3 -m bench.attention_backends --out "$out/attention_backends.json" ;;
  ttft-starts)
    build_model
    for start in 1 2 3 4 5; do
      # 240 s: on a fresh machine the first start compiles every kernel (Triton, quack, FA4); at 34a395b it was
      # still capturing decode graphs when a 90 s box cut it off, where starts with the caches full took 54-63 s.
      run 240 "ttft-start$start" python3 -m bench.serve --launch --label openai-serve \
        --server-args "$server_args $*" --levels 1 --num-requests 16 --warmup-requests 0 \
        --server-log "$out/server_ttft$start.log" --out "$out/serve_ttft$start.json"
    done
    offline_serve_shape
    openai_serve c256 256 768 "$*" ;;
esac
status=$?

# More files than the device returns in one call: all of them in one archive, device.txt and the log beside it.
if [ "$(find "$out" -maxdepth 1 -type f | wc -l)" -gt 8 ]; then
  archive=$(mktemp --suffix=.tgz)
  tar czf "$archive" -C "$out" . && find "$out" -mindepth 1 -maxdepth 1 ! -name device.txt ! -name log -exec rm -rf {} + \
    && mv "$archive" "$out/results.tgz"
fi
exit $status
