"""HIP's chunked gated delta rule prefill (``ftlab.hip.gated_delta_rule.gated_delta_rule(...,
variant="chunk")``, csrc/gated_delta_rule_chunk.hip): on a GPU against the exact recurrence within
the derived chunk-64 bound (ftlab.testing.gated_delta_tolerance), bf16 inputs at the models' shapes
and at awkward ones; its entry's checks; on the CPU, which inputs it refuses and what it hands the
kernels (the JIT module replaced by a recorder). The kernels' arithmetic is also held on the CPU by
tests/unit/test_gated_delta_rule_chunk_host.py."""

import pytest
import torch

import ftlab.testing as ft
from ftlab.backends import BackendUnavailable
from ftlab.hip import gated_delta_rule as hip_dn
from ftlab.testing.gated_delta_bounds import gated_delta_exact_and_tolerance


def _inputs(seed, b, t, hk, hv, dk, dv, *, with_state, decay=1.0, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, hk, dk, generator=gen).to(dtype)
    k = torch.randn(b, t, hk, dk, generator=gen).to(dtype)
    v = torch.randn(b, t, hv, dv, generator=gen).to(dtype)
    g = -decay * torch.nn.functional.softplus(torch.randn(b, t, hv, generator=gen))
    beta = torch.sigmoid(torch.randn(b, t, hv, generator=gen))
    state = torch.randn(b, hv, dk, dv, generator=gen) * 0.5 if with_state else None
    return q, k, v, g, beta, state


class _Recorder:
    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def entry(*args):
            self.calls.append(
                (
                    name,
                    [tuple(a.shape) for a in args if isinstance(a, torch.Tensor)],
                    [a for a in args if not isinstance(a, torch.Tensor)],
                )
            )

        return entry


@pytest.fixture
def calls(monkeypatch):
    rec = _Recorder()
    monkeypatch.setattr(hip_dn.jit, "module_for", lambda name, device: rec)
    monkeypatch.setattr(hip_dn.jit, "on_device", lambda device, launch: launch())
    return rec.calls


@pytest.mark.parametrize(
    "variant, want", [("chunk", "gated_delta_chunk"), ("scan", "gated_delta_scan")]
)
@pytest.mark.parametrize("precision, planes", [("fp32", 3), ("bf16", 1)])
def test_variant_picks_the_entry(calls, variant, want, precision, planes):
    q, k, v, g, beta, state = _inputs(0, 2, 130, 2, 12, 32, 24, with_state=True)
    hip_dn.gated_delta_rule(
        q, k, v, g, beta, state, 0.2, True, 64, variant=variant, precision=precision
    )
    assert [c[0] for c in calls] == [want]
    # q k v g beta state o, then ab, attn [B, Hv, NT, P, 64, 64] and sc [B, Hv, NT, 4, 64]
    if variant == "chunk":
        assert calls[0][1][-3:] == [
            (2, 12, 3, planes, 64, 64),
            (2, 12, 3, planes, 64, 64),
            (2, 12, 3, 4, 64),
        ]
        assert calls[0][2][-1] == planes  # the planes the kernels are built for


@pytest.mark.parametrize(
    "change, want",
    [
        ({}, "gated_delta_chunk"),
        ({"dtype": torch.float16}, "gated_delta_scan"),
        ({"dtype": torch.float32}, "gated_delta_scan"),
        ({"chunk_size": 32}, "gated_delta_scan"),
        ({"t": 1}, "gated_delta_chunk"),
    ],
)
def test_auto_takes_the_chunks_where_they_apply(calls, change, want):
    """The default variant (the planner's): the chunked form for bf16 with chunk_size 64, the scan
    for the rest."""
    q, k, v, g, beta, state = _inputs(
        0,
        1,
        change.get("t", 70),
        2,
        4,
        32,
        24,
        with_state=False,
        dtype=change.get("dtype", torch.bfloat16),
    )
    hip_dn.gated_delta_rule(q, k, v, g, beta, state, 0.2, True, change.get("chunk_size", 64))
    assert [c[0] for c in calls] == [want]


@pytest.mark.parametrize(
    "change, error, match",
    [
        (
            {"variant": "chunked"},
            ValueError,
            r"variant must be one of \['chunk', 'scan'\].*got 'chunked'",
        ),
        (
            {"precision": "tf32"},
            ValueError,
            r"precision must be one of \('fp32', 'bf16'\), got 'tf32'",
        ),
        (
            {"dtype": torch.float16},
            BackendUnavailable,
            r"'chunk' cannot serve.*not for float16 \(only bfloat16\)",
        ),
        ({"chunk_size": 32}, BackendUnavailable, r"chunk_size 32 \(it takes 64\)"),
        ({"dk": 129}, BackendUnavailable, r"Dk = 129 > 128"),
        ({"dv": 2**20}, BackendUnavailable, r"Hv \* Dv < 2\^25 .*got B=1, Hk=1, Hv=32, Dv=1048576"),
        ({"dv": 2**21 + 64, "hv": 1}, BackendUnavailable, r"ceil\(Dv / 32\) must be <= 65535"),
    ],
)
def test_refusals_name_themselves(calls, change, error, match):
    """A variant that cannot take the call is refused naming the limit (never swapped)."""
    dk, dv, hv = change.get("dk", 32), change.get("dv", 16), change.get("hv", 32)
    dtype = change.get("dtype", torch.bfloat16)
    # only the shapes and dtypes matter: expanded views, nothing the size of their shapes
    q, k = (torch.zeros((), dtype=dtype).expand(1, 3, 1, dk) for _ in range(2))
    v = torch.zeros((), dtype=dtype).expand(1, 3, hv, dv)
    g, beta = (torch.zeros(1, 3, hv) for _ in range(2))
    with pytest.raises(error, match=match):
        hip_dn.gated_delta_rule(
            q,
            k,
            v,
            g,
            beta,
            None,
            0.2,
            True,
            change.get("chunk_size", 64),
            variant=change.get("variant", "chunk"),
            precision=change.get("precision", "fp32"),
        )
    assert calls == []


@pytest.mark.gpu
@pytest.mark.parametrize(
    "b, t, hk, hv, dk, dv, with_state, decay",
    [
        (1, 192, 16, 32, 128, 128, True, 1.0),  # Qwen3.6 / Qwen3-Next's linear-attention heads
        (1, 300, 2, 4, 128, 128, True, 1.0),
        (2, 200, 1, 6, 128, 40, True, 1.0),  # two prep blocks a key head; a partial column block
        (1, 333, 2, 2, 100, 37, False, 8.0),  # Dk < 128, odd Dv, fast decay, from zeros
        (3, 5, 1, 1, 16, 16, True, 0.01),  # fewer tokens than a tile
        (1, 64, 2, 4, 64, 64, True, 1.0),  # one whole chunk
    ],
)
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_hip_chunked_prefill_gpu(b, t, hk, hv, dk, dv, with_state, decay, precision):
    """Within the derived chunk-64 bound of the precision (fp32: three planes; bf16: each fp32
    operand rounded to bf16 once, the bound's bf16-operand terms added) and its accuracy check."""
    q, k, v, g, beta, state = _inputs(
        b * t + dk + dv, b, t, hk, hv, dk, dv, with_state=with_state, decay=decay
    )
    scale = dk**-0.5
    # the exact recurrence and its chunk-64 bound in one f64 pass on the CPU (the slow part)
    exact_o, exact_s, o_bound, s_bound = gated_delta_exact_and_tolerance(
        q, k, v, g, beta, state, scale, True, 64, operands=precision
    )
    dev = torch.device("cuda")
    args = [x.to(dev) for x in (q, k, v, g, beta)]
    start = None if state is None else state.to(dev)
    o, s = hip_dn.gated_delta_rule(
        *args, start, scale, True, 64, variant="chunk", precision=precision
    )
    err_o, err_s = (o.cpu().double() - exact_o).abs(), (s.cpu().double() - exact_s).abs()
    assert bool((err_o <= o_bound).all()), float((err_o / o_bound).max())
    assert bool((err_s <= s_bound).all()), float((err_s / s_bound).max())
    # the planes all there (three), or one plane's accuracy: not just within the bound
    (ft.assert_three_plane_accuracy if precision == "fp32" else ft.assert_one_plane_accuracy)(
        o, s, exact_o, exact_s
    )
    if state is not None:
        assert torch.equal(start.cpu(), state)  # the initial state is left as it was
    o2, s2 = hip_dn.gated_delta_rule(
        *args, start, scale, True, 64, variant="chunk", precision=precision
    )
    assert torch.equal(o2, o) and torch.equal(s2, s)  # the same bits again
    if precision == "bf16":  # one plane ran, not three
        _, s3 = hip_dn.gated_delta_rule(
            *args, start, scale, True, 64, variant="chunk", precision="fp32"
        )
        assert not torch.equal(s3, s)


@pytest.mark.gpu
def test_hip_chunk_entry_checks_gpu():
    """The entry's own checks, for a caller that skips the Python wrapper."""
    from ftlab import jit

    dev = torch.device("cuda")
    q, k, v, g, beta, state = (x.to(dev) for x in _inputs(2, 1, 70, 1, 2, 32, 16, with_state=True))
    o = torch.empty_like(v)
    ab = torch.empty(1, 2, 2, 3, 64, 64, device=dev, dtype=torch.bfloat16)
    sc = torch.empty(1, 2, 2, 4, 64, device=dev)
    module = jit.module_for("gated_delta_rule", dev)
    with pytest.raises(
        ValueError, match=r"ab must be \[B, Hv, NT, 3, 64, 64\] \(49152 elements\), got 24576"
    ):
        module.gated_delta_chunk(q, k, v, g, beta, state, o, ab[:, :, :1], ab, sc, 0.2, True, 3)
    with pytest.raises(ValueError, match=r"sc must be \[B, Hv, NT, 4, 64\]"):
        module.gated_delta_chunk(
            q, k, v, g, beta, state, o, ab, ab.clone(), ab.float(), 0.2, True, 3
        )
    with pytest.raises(TypeError, match="attn must be bfloat16"):
        module.gated_delta_chunk(q, k, v, g, beta, state, o, ab, ab.float(), sc, 0.2, True, 3)
    with pytest.raises(ValueError, match="attn must be 16-byte aligned"):
        shifted = torch.empty(ab.numel() + 8, device=dev, dtype=torch.bfloat16)[
            1 : ab.numel() + 1
        ].view(ab.shape)
        module.gated_delta_chunk(q, k, v, g, beta, state, o, ab, shifted, sc, 0.2, True, 3)
    with pytest.raises(
        ValueError, match=r"ab must be \[B, Hv, NT, 1, 64, 64\] \(16384 elements\), got 49152"
    ):
        module.gated_delta_chunk(q, k, v, g, beta, state, o, ab, ab.clone(), sc, 0.2, True, 1)
    with pytest.raises(ValueError, match="planes must be 1 or 3, got 2"):
        module.gated_delta_chunk(q, k, v, g, beta, state, o, ab, ab.clone(), sc, 0.2, True, 2)
    with pytest.raises(TypeError, match="bf16"):
        module.gated_delta_chunk(
            q.half(), k.half(), v.half(), g, beta, state, o.half(), ab, ab.clone(), sc, 0.2, True, 3
        )
