#!/bin/bash
# One device call: ftlab's one-row (M = 1) matvecs against llama.cpp's MUL_MAT at the same shapes
# and types, in the same run on the same GPU.
#   1. llama.cpp's source (.llama/, from ../shared/tools/llama-cpp/prepare) gets MUL_MAT perf cases
#      at the lm_head and decode projection shapes (benchmarks/llama_cpp_mul_mat_cases.py) and is
#      built in the background (5-9 minutes);
#   2. meanwhile benchmarks/time_quant_mv1.py times every hip variant and Triton per type and shape
#      (weights cycled past the L2, and one weight again and again: --resident), every output
#      checked within its int8 bound first;
#   3. then llama.cpp's test-backend-ops perf -o MUL_MAT at those shapes (one weight again and
#      again: its way of timing).
# Usage, from the repository root with ftlab importable: bash benchmarks/mv1_against_llama_cpp.sh OUT
# [TYPES]; writes OUT/time-quant-mv1.txt and OUT/llama-mul-mat.txt.
set -u
out=${1:?usage: mv1_against_llama_cpp.sh OUT [TYPES]}
types=${2:-Q4_K,Q6_K,Q5_K,Q4_0,Q8_0}
mkdir -p "$out"
if [ -f .llama/build.sh ]; then
  python benchmarks/llama_cpp_mul_mat_cases.py .llama/llama.cpp-src.tgz
  (setsid nohup bash .llama/build.sh > /tmp/llb.log 2>&1 < /dev/null &)
fi
echo "# tree: $(git log -1 --format='%h %s' 2>/dev/null | cut -c1-100)" > "$out/time-quant-mv1.txt"
python benchmarks/time_quant_mv1.py --types "$types" --shapes llama,lm,o_proj,qkv \
  --variants vec,fused,staged,sliced,sliced_q8,triton --resident >> "$out/time-quant-mv1.txt" 2>&1
if [ -f .llama/build.sh ]; then
  for _ in $(seq 1 120); do [ -f /tmp/llb.done ] && break; sleep 5; done
  bin=/tmp/llb/llama.cpp/build/bin/test-backend-ops
  if [ -x "$bin" ]; then
    lower=$(echo "$types" | tr '[:upper:]' '[:lower:]' | sed 's/_k/_K/g; s/,/|/g')
    "$bin" perf -o MUL_MAT -b CUDA0 -p "type_a=($lower),type_b=f32,m=(4096|151936|5120|2048),n=1,k=(14336|2048|4096)," \
      > "$out/llama-mul-mat.txt" 2>&1
  else
    echo "llama.cpp's build did not finish: $(tail -3 /tmp/llb.log)" > "$out/llama-mul-mat.txt"
  fi
fi
