#!/usr/bin/env bash
# The first checks on a machine with NVIDIA GPUs, in under 10 minutes: exactness against the one-process
# reference on CUDA (fp32 with --tf32 off, then bf16 autocast and bf16-main, Megatron's bf16 weights with
# fp32 main weights and gradients, within their tolerance) for 1F1B, ZB-H1, DualPipeV,
# offload and recompute plans; a stream-race check of the overlapped F&B pairs and offload
# (TORCH_CUDA_SANITIZER=1, and gradients bitwise equal under CUDA_LAUNCH_BLOCKING=1); tokens/s with and
# without --report-out, and with --dtype bf16-main; time to the first step and peak host and device memory
# of a 1.7B GPT.
#
# With two GPUs or more the plans run on p = 2 ranks, one GPU each (NCCL). With one GPU, NCCL does not
# let two ranks of one communicator share it, so the plans run at p = 1: one rank holding every stage
# (DualPipeV's two, the recompute plan's two chunks), which exercises the streams, offload's copies,
# recomputation and bf16 but no NCCL message; the script says which it ran.
#
#   bash scripts/gpu_check.sh [--dry-run] [OUT_DIR]      # OUT_DIR defaults to gpu_check_out
#
# --dry-run lists the steps and their commands and checks that every schedule they name exists; it needs
# no GPU. Each step has a time limit; a failed step is reported and the others still run; the exit
# status is the number of failed steps (at most 100).
set -uo pipefail
cd "$(dirname "$0")/.."

dry=0
if [ "${1:-}" = "--dry-run" ]; then dry=1; shift; fi
out=${1:-gpu_check_out}
failed=0
number=0

if [ "$dry" = 1 ]; then
    gpus=2  # list the multi-GPU form
    options=$(mktemp)
    trap 'rm -f "$options"' EXIT
else
    mkdir -p "$out"
    gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
    if [ "$gpus" -lt 1 ]; then
        echo "error: no CUDA device visible to torch (use --dry-run to list the steps)" >&2
        exit 2
    fi
fi
p=$([ "$gpus" -ge 2 ] && echo 2 || echo 1)

# step LIMIT_S NAME COMMAND...: run COMMAND (or, with --dry-run, print it), its output in OUT_DIR/NAME.log
step() {
    local limit=$1 name=$2
    shift 2
    number=$((number + 1))
    echo "[$number] $name (at most ${limit}s): $*"
    if [ "$dry" = 1 ]; then
        # a run's runtime options (after the plan and --nproc P), parsed at the end as the ranks would
        [ "$1 $2" = "schedc run" ] && printf '%s\0' "${@:6}" >>"$options" && printf '\n' >>"$options"
        return 0
    fi
    local begin=$SECONDS
    if timeout "$limit" "$@" >"$out/$name.log" 2>&1; then
        echo "    ok in $((SECONDS - begin))s"
    else
        failed=$((failed + 1))
        echo "    FAILED in $((SECONDS - begin))s (exit $?): see $out/$name.log"
        tail -5 "$out/$name.log" | sed 's/^/    | /'
    fi
}

# The plans: schedule and its -D values at p ranks.
PLANS=("1f1b:-D m=4" "zb_h1:-D m=4" "dualpipev:-D m=4" "offload_1f1b:-D m=4" "interleaved_1f1b_recompute:-D v=2 -D m=4")
SMALL=(--layers 4 --hidden 256 --heads 4 --seq 128 --mb-size 2 --vocab 512 --synthetic --steps 1 --quiet --device cuda)
plan_of() { echo "$out/plans/${1}_p$p/plan.json"; }

for entry in "${PLANS[@]}"; do
    name=${entry%%:*}
    if [ ! -f "schedc/schedules/$name.sched" ]; then
        echo "error: schedc/schedules/$name.sched is missing" >&2
        exit 2
    fi
    # shellcheck disable=SC2086
    step 60 "compile_$name" schedc compile "schedc/schedules/$name.sched" -D p=$p ${entry#*:} -o "$out/plans/${name}_p$p"
done
echo "    (p = $p: $([ "$p" = 2 ] && echo "two ranks on two GPUs over NCCL" || echo "one GPU: one rank holds every stage, no NCCL message"))"

# 1. Exactness: fp32 products in full fp32 (--tf32 off), then bf16 within --tolerance's default 1e-2: autocast,
#    and bf16-main, whose reference does the same arithmetic per microbatch (on CPU bit for bit at p = 2).
for entry in "${PLANS[@]}"; do
    name=${entry%%:*}
    step 60 "exact_fp32_$name" schedc run "$(plan_of "$name")" --nproc "$p" "${SMALL[@]}" --tf32 off --compare-to-reference
    step 60 "exact_bf16_$name" schedc run "$(plan_of "$name")" --nproc "$p" "${SMALL[@]}" --dtype bf16 --compare-to-reference
    step 60 "exact_bf16main_$name" schedc run "$(plan_of "$name")" --nproc "$p" "${SMALL[@]}" --dtype bf16-main \
        --compare-to-reference
done

# 2. Stream races: the overlapped pairs (DualPipeV) and offload under the CUDA sanitizer, then their
#    gradients with and without CUDA_LAUNCH_BLOCKING=1, bitwise.
for name in dualpipev offload_1f1b; do
    step 120 "sanitizer_$name" env TORCH_CUDA_SANITIZER=1 schedc run "$(plan_of "$name")" --nproc "$p" "${SMALL[@]}"
    step 60 "grads_async_$name" schedc run "$(plan_of "$name")" --nproc "$p" "${SMALL[@]}" --save-grads "$out/grads_async_$name"
    step 60 "grads_blocking_$name" env CUDA_LAUNCH_BLOCKING=1 schedc run "$(plan_of "$name")" --nproc "$p" "${SMALL[@]}" \
        --save-grads "$out/grads_blocking_$name"
    step 30 "bitwise_$name" python3 -c "import sys, torch
a, b = (torch.load(f'$out/grads_{k}_$name/grads.pt') for k in ('async', 'blocking'))
bad = [n for n in a if not torch.equal(a[n], b[n])]
sys.exit(f'gradients differ under CUDA_LAUNCH_BLOCKING=1: {bad[:5]}' if bad or a.keys() != b.keys() else 0)"
done

# 3. Tokens/s with and without --report-out (device events, no synchronize per instruction): 1F1B, a
#    350M GPT, 20 steps, the last 15 timed.
MEDIUM=(--layers 24 --hidden 1024 --heads 16 --seq 1024 --mb-size 4 --vocab 50304 --synthetic --steps 20 --quiet
        --device cuda --dtype bf16)
step 120 "tokens_plain" schedc run "$(plan_of 1f1b)" --nproc "$p" "${MEDIUM[@]}" --metrics-out "$out/tokens_plain.jsonl"
step 120 "tokens_report" schedc run "$(plan_of 1f1b)" --nproc "$p" "${MEDIUM[@]}" --metrics-out "$out/tokens_report.jsonl" \
    --report-out "$out/tokens_report.json"
step 120 "tokens_main" schedc run "$(plan_of 1f1b)" --nproc "$p" "${MEDIUM[@]}" --dtype bf16-main \
    --metrics-out "$out/tokens_main.jsonl"
step 10 "tokens_compare" python3 -c "import json, statistics
rate = lambda f: statistics.median(json.loads(l)['tokens_per_s'] for l in list(open(f))[5:])
plain, report, main = (rate(f'$out/tokens_{k}.jsonl') for k in ('plain', 'report', 'main'))
print(f'tokens/s {plain:,.0f} plain, {report:,.0f} with --report-out ({report / plain:.3f} of plain)')
print(f'tokens/s {main:,.0f} with --dtype bf16-main ({main / plain:.3f} of bf16 autocast)')"

# 4. A 1.7B GPT (30 layers, hidden 2048, vocab 50304: 12 h^2 + 13 h a layer, 1.51e9, and 0.21e9 in the
#    embeddings and head): time to the first step, peak host memory per rank (--report-out's
#    peak_rss_bytes) and the GPUs' peak memory (nvidia-smi, sampled every second).
LARGE=(--layers 30 --hidden 2048 --heads 16 --seq 2048 --mb-size 1 --vocab 50304 --synthetic --steps 2 --quiet
       --device cuda --dtype bf16 --optimizer adamw)
if [ "$dry" = 0 ]; then
    (while sleep 1; do nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits; done) \
        >"$out/gpu_memory.csv" 2>/dev/null &
    sampler=$!
fi
step 300 "large_first_step" schedc run "$(plan_of 1f1b)" --nproc "$p" "${LARGE[@]}" --metrics-out "$out/large.jsonl" \
    --report-out "$out/large_report.json"
if [ "$dry" = 0 ]; then
    kill "$sampler" 2>/dev/null
    step 10 "large_memory" python3 -c "import json
ranks = json.load(open('$out/large_report.json'))['memory']['ranks']
print('peak host memory by rank (GiB):', [round(r['peak_rss_bytes'] / 2 ** 30, 2) for r in ranks])
used = {}
for line in open('$out/gpu_memory.csv'):
    gpu, mib = line.split(',')
    used[gpu] = max(used.get(gpu, 0), int(mib))
print('peak device memory by GPU (GiB):', {g: round(m / 1024, 2) for g, m in used.items()})
print('first step (s):', json.loads(open('$out/large.jsonl').readline())['seconds'])"
else
    step 10 "large_memory" echo "peak host memory by rank, peak device memory by GPU, first step's seconds"
fi

if [ "$dry" = 1 ]; then
    python3 - "$options" <<'PY' || exit 2
import sys
from schedc.runtime.process.options import parse_options
runs = [line.split("\0")[:-1] for line in open(sys.argv[1]).read().split("\n") if line]
for args in runs:
    parse_options(["plan.json", *args])  # exits 2 naming an option the runtime would refuse
print(f"the runtime's options of {len(runs)} runs parse")
PY
fi
echo "$number steps, $failed failed$([ "$dry" = 1 ] && echo " (dry run: nothing was run)")"
exit $((failed > 100 ? 100 : failed))
