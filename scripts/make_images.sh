#!/usr/bin/env bash
# Regenerate the pictures of README.md and docs/ (docs/images/) with `schedc render`. Every picture but
# the last is deterministic; the last draws a 2-rank CPU run's measured times above the simulation, so
# it changes from run to run (--no-run leaves it as it is). Each picture must stay under 200 KB.
#
#   bash scripts/make_images.sh [--no-run] [OUT_DIR]      # OUT_DIR defaults to docs/images
set -euo pipefail
cd "$(dirname "$0")/.."

run=1
if [ "${1:-}" = "--no-run" ]; then run=0; shift; fi
out=${1:-docs/images}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

render() { schedc render "$@" >/dev/null; }

# The library at p=4, m=8 with unit costs (F=1, B=2).
render 1f1b -D p=4 -D m=8 -o "$out/1f1b_p4_m8.png"
render interleaved_1f1b -D p=4 -D v=2 -D m=8 -o "$out/interleaved_1f1b_p4_v2_m8.png"
render chimera -D p=4 -D m=8 -o "$out/chimera_p4_m8.png"
render zb_h1 -D p=4 -D m=8 -o "$out/zb_h1_p4_m8.png"
# V shapes: a chunk costs half a stage and holds half its activations (docs/benchmarks.md).
echo '{"F": 0.5, "I": 0.5, "W": 0.5, "memory": {"F": 0.5}}' > "$work/half.json"
echo '{"F": 0.5, "B": 1, "I": 0.5, "W": 0.5, "FB": 1.5}' > "$work/dualpipev.json"
render zbv -D p=4 -D m=8 --costs "$work/half.json" -o "$out/zbv_p4_m8.png"
render dualpipev -D p=4 -D m=8 --costs "$work/dualpipev.json" -o "$out/dualpipev_p4_m8.png"
# Overlapped F & B pairs drawn as one box (unit costs), and a deadlock's stuck ops (exit 1: it fails
# its checks, and is drawn anyway).
render dualpipev -D p=4 -D m=8 -o "$out/dualpipev_p4_m8_overlap.png"
set +e
schedc render tests/fixtures/broken/deadlock_sized.sched -o "$out/deadlock_sized.png" >/dev/null 2>&1
status=$?
set -e
if [ "$status" != 1 ]; then echo "the deadlock picture: exit $status, not 1" >&2; exit 1; fi

# PipeFisher's K-FAC work in Chimera's bubbles, BERT-Large's V100 profile at micro-batch 32.
render pipefisher -D p=4 -D m=8 --profile tests/data/bert-large_time_memory_v100.csv --microbatch-size 32 \
    -o "$out/pipefisher_p4_m8_bert_large.png"

# A step of the 39.1B GPT on DGX A100 nodes, in seconds, with the pipeline messages.
render interleaved_1f1b -D p=4 -D v=2 --model gpt-39.1b --cluster dgx-a100-80gb --tp 8 --dp 2 \
    --microbatch-size 2 --global-batch 32 --blocking-p2p --comms -o "$out/interleaved_1f1b_p4_v2_39b_a100.png"

# An order synthesized under a memory limit of 4 activations per device, latency 1.
schedc tune --synthesize -D p=4 -D m=8 --cost I=1 --cost W=1 --latency 1 --activation-limit 4 \
    -o "$work/synthesized.sched" >"$work/tune.log" 2>&1 || { cat "$work/tune.log" >&2; exit 1; }
render "$work/synthesized.sched" --latency 1 -o "$out/tune_synthesize_p4_m8.png"

# A 2-rank CPU run of 1F1B, its measured step drawn above the simulated one.
if [ "$run" = 1 ]; then
  schedc compile 1f1b -D p=2 -D m=4 -o "$work/1f1b" >/dev/null
  OMP_NUM_THREADS=1 schedc run "$work/1f1b/plan.json" --nproc 2 --steps 3 --trace-out "$work/trace.json" >/dev/null
  render 1f1b -D p=2 -D m=4 --measured "$work/trace.json" -o "$out/run_1f1b_p2_m4_measured.png"
fi

big=$(find "$out" -maxdepth 1 -name '*.png' -size +200k)
if [ -n "$big" ]; then echo "over 200 KB: $big" >&2; exit 1; fi
echo "wrote the pictures under $out"
