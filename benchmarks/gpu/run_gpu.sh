#!/usr/bin/env bash
# One call's worth of GPU truth (benchmarks/gpu/README.md): kernel parity and speed, `npu-port bench`, our sdpa
# strategy against diffusers' own processor, `infer --compare` on the tiny pipelines, the hopper-safe profile on a
# CUDA-written script whose xformers is missing. Run from the repository root on a CUDA machine:
#
#     bash benchmarks/gpu/run_gpu.sh OUTDIR                        # OUTDIR gets results.tgz
#     STEPS='bench|compare' bash benchmarks/gpu/run_gpu.sh OUTDIR  # only the steps whose names match (grep -E)
#
# Every step has its own time limit, so one hung step cannot eat the lease; a failed step is logged and the next runs.
# Wheels in .whl/ (diffusers and what it needs but the machine lacks) are installed into /tmp/site first if present.
set -u
out=$(realpath -m "${1:?usage: run_gpu.sh OUTDIR}")
repo=$PWD
res=/tmp/npu-port-gpu
rm -rf "$res" && mkdir -p "$res" "$out"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# npu-port itself installed (not put on PYTHONPATH): strategies/ ships as npu_port.strategies only when installed
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade \
    --target /tmp/site . $(ls $repo/.whl/*.whl 2>/dev/null) || exit 1
export PYTHONPATH=/tmp/site
# ... and every step runs outside the checkout, whose npu_port/ would shadow the installed one
mkdir -p /tmp/npu-port-gpu-cwd && cd /tmp/npu-port-gpu-cwd || exit 1
py=python3
cli="$py -m npu_port"

step() {  # step NAME SECONDS COMMAND...: run, log its status and wall time
    local name=$1 limit=$2
    shift 2
    if [ -n "${STEPS:-}" ] && ! grep -qE "$STEPS" <<<"$name"; then return; fi
    local t0=$SECONDS
    echo "=== $name (limit ${limit}s)"
    timeout "$limit" "$@" >"$res/$name.log" 2>&1
    local rc=$?
    tail -n 25 "$res/$name.log"
    echo "=== $name: rc=$rc in $((SECONDS - t0))s"
    echo "$name rc=$rc ${limit}s $((SECONDS - t0))s" >>"$res/steps.txt"
    tar czf "$out/results.tgz" --exclude=t2i_models -C "$res" .  # after every step: a lease cut short keeps the rest
}

step env 60 bash -c "nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv; uname -r;
  $py -c 'import sys, torch, diffusers, transformers; print(sys.version); print(\"torch\", torch.__version__, torch.version.cuda,
  torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).multi_processor_count); print(\"diffusers\",
  diffusers.__version__, \"transformers\", transformers.__version__)'"
step doctor 60 $cli doctor
step strategies 30 $cli strategies
step kernel_check 150 $py $repo/benchmarks/kernel_check.py --device cuda --dtypes float32,float16,bfloat16 --json "$res/kernel_check.json"
step bench_fp16 150 $cli bench --device cuda --dtype float16 --out "$res/bench_fp16" --no-plot
step bench_bf16 90 $cli bench --device cuda --dtype bfloat16 --shapes default --out "$res/bench_bf16" --no-plot
step dit_overhead_fp16 90 $py $repo/benchmarks/dit_strategy_overhead.py --device cuda --dtype float16 --rounds 30 --steps 10 --out "$res/dit_overhead_cuda_fp16.json"
step dit_overhead_fp32 90 $py $repo/benchmarks/dit_strategy_overhead.py --device cuda --dtype float32 --rounds 30 --steps 10 --out "$res/dit_overhead_cuda_fp32.json"
for model in tiny tiny-dit tiny-flux tiny-wan; do
    step "compare_$model" 90 $cli infer --model "$model" --device cuda --dtype float16 --compare vanilla,sdpa,chunked,auto --no-progress --output "$res/compare_$model/image.png"
done
step infer_hopper_safe 90 $cli infer --model tiny --device cuda --profile hopper-safe --no-progress --output "$res/hopper_safe/image.png"
# A CUDA-written project that asks for xformers (absent here): plain python fails, npu-port run with hopper-safe runs it
step build_tiny_t2i 90 $py -c "from npu_port.integrations.diffusers.tiny_text2image import build_tiny_text2image as b; b('$res/t2i_models')"
step plain_xformers_script 90 $py $repo/tests/fixtures/attribution_project/generate.py --models "$res/t2i_models"
step run_hopper_safe 120 $cli run --profile hopper-safe --report "$res/run_hopper_safe.json" $repo/tests/fixtures/attribution_project/generate.py --models "$res/t2i_models"
# npu-port diff on the GPU: where torch's fp16 kernel parts from the math kernel on the tiny DiT (infer --compare's
# 5e-2 above), and a float32 dump to compare with one written on a CPU (benchmarks/gpu/README.md)
for spec in "float16 sdpa" "float16 vanilla" "float32 vanilla"; do
    set -- $spec
    step "diff_dump_$1_$2" 90 $cli diff dump --model tiny-dit --device cuda --dtype "$1" --strategy "$2" --steps 10 \
        --sample 64 --no-progress -o "$res/cuda_$1_$2.d"
done
step diff_fp16 60 $cli diff "$res/cuda_float16_vanilla.d" "$res/cuda_float16_sdpa.d" --json
step sync_check 90 $py $repo/benchmarks/gpu/sync_check.py --out "$res/sync_check.json"

echo "--- steps"
cat "$res/steps.txt"
