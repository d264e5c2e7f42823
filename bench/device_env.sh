# Sourced by the issue-14 device scripts (bench/*_check.sh): paths, provenance, and one archive back.
# $OUT brings back at most 8 files, so every log and JSON goes to $work and leaves as $out/results.tgz
# (made on exit, also when a stage fails); the scripts print their short tables to stdout.
out=${1:?usage: $0 OUT_DIR}
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH=$PWD:/tmp/site:/tmp/fasite:/tmp/fasite/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1
export BENCH_COMMIT="$(cat COMMIT 2>/dev/null || echo unknown)"
work=$(mktemp -d)
trap 'tar czf "$out/results.tgz" -C "$work" . 2>/dev/null' EXIT
model=/tmp/qwen3-0.6b-bench
