"""Add MUL_MAT perf cases at ftlab's one-row shapes to the llama.cpp source that
``../shared/tools/llama-cpp/prepare`` put in ``.llama/llama.cpp-src.tgz``, so that the device's
``test-backend-ops perf -o MUL_MAT`` times llama.cpp's matvec where ftlab's are timed
(``benchmarks/time_quant_mv1.py``): its perf list has 4096 x 14336 only. Added beside it, for
every weight type (one token, F32 activations, as the existing cases):

- the Qwen3 lm_head, 151936 rows of K = 2048;
- the Qwen3-30B-A3B decode projections: qkv 5120 x 2048 and o_proj 2048 x 4096.

Run once after ``prepare`` (idempotent; it rewrites the tarball in place), then build on the device
as usual (``.llama/build.sh``) and filter, e.g.
``test-backend-ops perf -o MUL_MAT -b CUDA0 -p 'type_a=q4_K,type_b=f32,m=151936,n=1,k=2048,'``.

    python benchmarks/llama_cpp_mul_mat_cases.py [.llama/llama.cpp-src.tgz]
"""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

MEMBER = "llama.cpp/tests/test-backend-ops.cpp"
ANCHOR = (
    "test_cases.emplace_back(new test_mul_mat(type_a, type_b, 4096, bs, 14336, {1,  1}, {1, 1}));"
)
MARK = "// ftlab: one-row shapes"
CASES = ((151936, 2048), (5120, 2048), (2048, 4096))  # (rows m, K)


def patched(source: str) -> str:
    """``source`` with the cases added after the 4096 x 14336 loop (unchanged if already there)."""
    if MARK in source:
        return source
    at = source.index(ANCHOR)
    # the end of the `for (int bs ...)` loop
    loop_end = source.index("\n    }\n", at) + len("\n    }\n")
    lines = [
        f"    {MARK}, beside llama.cpp's own (benchmarks/llama_cpp_mul_mat_cases.py)",
        "    for (ggml_type type_a : all_types) {",
    ]
    lines += [
        f"        test_cases.emplace_back(new test_mul_mat(type_a, GGML_TYPE_F32, {m}, 1, {k}, "
        f"{{1, 1}}, {{1, 1}}));"
        for m, k in CASES
    ]
    lines.append("    }")
    return source[:loop_end] + "\n".join(lines) + "\n" + source[loop_end:]


def main() -> None:
    path = Path(sys.argv[1] if len(sys.argv) > 1 else ".llama/llama.cpp-src.tgz")
    with tarfile.open(path, "r:gz") as tar:
        members = [(m, tar.extractfile(m).read() if m.isfile() else None) for m in tar.getmembers()]
    out = io.BytesIO()
    changed = False
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for member, data in members:
            if member.name == MEMBER:
                new = patched(data.decode()).encode()
                changed = new != data
                data = new
                member.size = len(data)
            tar.addfile(member, io.BytesIO(data) if data is not None else None)
    if changed:
        path.write_bytes(out.getvalue())
    print(f"{path}: {'cases added' if changed else 'already has the cases'} ({MEMBER})")


if __name__ == "__main__":
    main()
