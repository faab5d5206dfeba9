#!/usr/bin/env bash
# A Qwen3-30B-A3B-shaped GGUF in Q4_K_M (the type most downloaded files have), made from random
# weights: ftlab writes it as Q8_0 (benchmarks/write_random_qwen3moe.py, on the GPU), llama.cpp's
# llama-quantize requantizes it to Q4_K_M with its own type mix (Q6_K output, attn_v and
# ffn_down_exps of the use_more_bits layers; see tests/data/llama_cpp/README.md).
#
#   benchmarks/make_kquant_model.sh [OUT_DIR] [FTYPE]
#
# OUT_DIR: default /tmp/kquant (needs ~52 GB free: Q8_0 32.5 GB + Q4_K_M 18.6 GB; set
# KEEP_SOURCE=0 to delete the Q8_0 file afterwards). FTYPE: any llama-quantize type, default
# Q4_K_M. LLAMA_BIN: the directory of llama-quantize, default /tmp/llb/llama.cpp/build/bin.
# PYTHON: default python. Extra arguments of the writer via WRITER_ARGS (e.g. "--layers 2
# --experts 8" for a quick check of the recipe on a CPU).
#
# The file has no vocabulary (tokenizer model "none"): ftlab reads it with
# ftlab.models.loader.load_gguf (Pipeline.load needs a tokenizer). To time it, ftlab's model bench
# (prefill 512 tokens, decode batch 1 and 8, graph and eager, beside the bound of the file's own
# tensor sizes; the notes count the tensors of each type) with llama-bench on the same file in
# the same run (its pp512 and tg128 as rows of backend llama.cpp; it runs -ngl 99 -fa 1 -r 3):
#   ftlab bench model --gguf OUT_DIR/qwen3moe-30b-a3b-random-q4_k_m.gguf --llama-bench $LLAMA_BIN/llama-bench
# (add --device cpu --prefill 32 for a smoke run without a GPU), or llama-bench alone:
#   $LLAMA_BIN/llama-bench -m OUT_DIR/qwen3moe-30b-a3b-random-q4_k_m.gguf -ngl 99 -fa 1
# Checked on a CPU with WRITER_ARGS="--layers 2 --experts 4" (475 MB Q4_K_M, 1 min).
#
# The fast alternative, without llama.cpp: the writer packs the Q4_K_M file directly, in
# llama-quantize's Q4_K_M type mix (the same tensors' types and bytes per tensor, the same
# Gaussian draws; simpler min/max scales than llama-quantize's search, so slightly larger
# quantization error), with no Q8_0 file in between:
#   python benchmarks/write_random_qwen3moe.py OUT_DIR/qwen3moe-30b-a3b-random-q4_k_m.gguf --type Q4_K_M
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${1:-/tmp/kquant}
FTYPE=${2:-Q4_K_M}
LLAMA_BIN=${LLAMA_BIN:-/tmp/llb/llama.cpp/build/bin}
PYTHON=${PYTHON:-python}
QUANTIZE="$LLAMA_BIN/llama-quantize"
[ -x "$QUANTIZE" ] || { echo "no llama-quantize at $QUANTIZE (set LLAMA_BIN)" >&2; exit 1; }
mkdir -p "$OUT_DIR"
SRC="$OUT_DIR/qwen3moe-30b-a3b-random-q8_0.gguf"
DST="$OUT_DIR/qwen3moe-30b-a3b-random-$(echo "$FTYPE" | tr 'A-Z' 'a-z').gguf"
[ -f "$SRC" ] || PYTHONPATH="$PWD" "$PYTHON" benchmarks/write_random_qwen3moe.py "$SRC" --type Q8_0 ${WRITER_ARGS:-}
# --allow-requantize: the source is Q8_0 (a BF16 source would need 61 GB of disk beside the output)
"$QUANTIZE" --allow-requantize "$SRC" "$DST" "$FTYPE" "$(nproc)"
[ "${KEEP_SOURCE:-1}" = 1 ] || rm -f "$SRC"
ls -l "$DST"
