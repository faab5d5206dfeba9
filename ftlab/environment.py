"""What this machine offers ftlab (``ftlab env``, the head of ``ftlab demo``)."""

from __future__ import annotations

import os


def report() -> str:
    """What ftlab can use on this machine: the platform, torch, triton, the HIP and CPU JITs,
    clang-19 for the gfx compile checks (``ftlab env``)."""
    import torch

    from ftlab import jit
    from ftlab import platform as ftplatform

    plat = ftplatform.current()
    lines = [f"platform : {plat.describe()}"]
    if plat.info:
        lines.append(f"           LDS {plat.info.lds_bytes // 1024} KiB per workgroup")
    build = ftplatform.torch_build()
    lines.append(f"torch    : {torch.__version__} ({build or 'CPU build'})")
    try:
        import triton

        mode = (
            " (CPU interpreter: TRITON_INTERPRET=1)"
            if os.environ.get("TRITON_INTERPRET") == "1"
            else ""
        )
        lines.append(f"triton   : {triton.__version__}{mode}")
    except ImportError:
        lines.append("triton   : not installed")
    why = jit.gpu_unavailable_reason(plat) if plat.is_gpu else None
    if plat.is_gpu:
        lines.append(f"HIP JIT  : {'available' if why is None else 'unavailable: ' + why}")
    else:
        tc = []
        for kind in ("cuda", "rocm"):
            try:
                tc.append(f"{kind}: {jit.find_gpu_toolchain(kind).compiler}")
            except jit.ToolchainError as e:
                tc.append(f"{kind}: {e}")
        lines.append("HIP JIT  : no GPU to run on (" + "; ".join(tc) + ")")
    from ftlab import compile_check

    lines.append(f"clang-19 : {compile_check.clang() or 'not found (gfx compile checks skipped)'}")
    cpu_why = jit.cpu_unavailable_reason()
    lines.append(f"CPU JIT  : {'available' if cpu_why is None else 'unavailable: ' + cpu_why}")
    return "\n".join(lines)
