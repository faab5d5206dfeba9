"""Hybrid MoE inside captured CUDA/HIP graphs (docs/OPS.md section 4), on a GPU: every graph
handshake replayed >= 500 times with changing inputs and CPU/GPU splits (0%, 50%, 100% of the routes
on the CPU) and changing residency, each replay equal to the eager handshake bit for bit and to the
all-experts reference within the derived bound; a forced probe failure falls back to eager with a
warning and correct output; a handshake made to fail mid-run raises instead of returning stale
data."""

import warnings

import pytest
import torch

import ftlab.testing as ft
from ftlab import ops
from ftlab.hybrid import HandshakeError, HybridDecodeExecutor
from ftlab.hybrid import executor as hx
from ftlab.testing.common import assert_within

pytestmark = pytest.mark.gpu

E, H, INTER, K, SLOTS = 16, 128, 64, 4, 8
REPLAYS = 510


def _banks(seed=0):
    gen = torch.Generator().manual_seed(seed)
    gu = torch.randn(E, 2 * INTER, H, generator=gen) * H**-0.5
    dn = torch.randn(E, H, INTER, generator=gen) * INTER**-0.5
    return ops.quantize_q4_0(gu), ops.quantize_q4_0(dn)


def _ids_for(split: int, resident: list[int], tokens: int, gen) -> torch.Tensor:
    """[T, K] distinct expert ids per token with `split` routes of K on the CPU (non-resident)."""
    others = [e for e in range(E) if e not in resident]
    rows = []
    for _ in range(tokens):
        on_cpu = [others[i] for i in torch.randperm(len(others), generator=gen)[:split].tolist()]
        on_gpu = [
            resident[i] for i in torch.randperm(len(resident), generator=gen)[: K - split].tolist()
        ]
        row = on_cpu + on_gpu
        rows.append([row[i] for i in torch.randperm(K, generator=gen).tolist()])
    ids = torch.tensor(rows, dtype=torch.int32)
    ids[torch.rand(ids.shape, generator=gen) < 0.05] = -1  # an empty slot now and then
    return ids


def _capture(ex, x, w, ids):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ex(x, w, ids)  # warm-up: kernels, the channel of this batch size
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = ex(x, w, ids)
    return graph, y


@pytest.mark.parametrize("handshake", ["host_func", "stream_memop"])
@pytest.mark.parametrize(
    "backend,dtype,tokens", [("triton", torch.float32, 3), ("hip", torch.bfloat16, 4)]
)
def test_graph_replays_equal_eager(handshake, backend, dtype, tokens):
    gu, dn = _banks()
    ex = HybridDecodeExecutor(gu, dn, SLOTS, "cuda", backend=backend, mechanism=handshake)
    assert ex.mechanism == handshake, ex.mechanism_reason
    gen = torch.Generator().manual_seed(7)
    ex.end_step(torch.arange(SLOTS).view(2, -1))
    x = torch.randn(tokens, H, generator=gen).to("cuda", dtype)
    w = torch.rand(tokens, K, generator=gen).cuda()
    ids = _ids_for(2, sorted(ex.policy.resident()), tokens, gen).cuda()
    graph, y = _capture(ex, x, w, ids)
    mismatches, checked, splits = 0, 0, {0: 0, 2: 0, 4: 0}
    for r in range(REPLAYS):
        if r and r % 50 == 0:  # move the residency between steps: some experts load, some leave
            ex.end_step(torch.randint(0, E, (2, K), generator=gen))
        split = (0, 2, 4)[r % 3]
        splits[split] += 1
        resident = sorted(ex.policy.resident())
        x.copy_(torch.randn(tokens, H, generator=gen))
        w.copy_(torch.rand(tokens, K, generator=gen))
        ids.copy_(_ids_for(split, resident, tokens, gen))
        graph.replay()
        torch.cuda.synchronize()
        ex.check()
        want = ex.eager(x, w, ids)
        if not torch.equal(y, want):
            mismatches += 1
        if r % 10 == 0:  # and the all-experts reference within the derived bound
            ref = ops.moe_experts(
                x.cpu(), gu, dn, w.cpu(), ids.cpu(), path="int8", backend="reference"
            )
            gpu_ids, _ = ex.split(ids)
            bound = ft.hybrid_tolerance(x.cpu(), gu, dn, w.cpu(), ids.cpu(), gpu_ids, "int8", ref)
            assert_within("hybrid replay", f"replay {r}", y.cpu(), ref, bound)
            checked += 1
    stats = ex.handshake.cpu.channels[(tokens, K)].stats()
    print(
        f"\n{handshake}/{backend}/{dtype}: {REPLAYS} replays, {mismatches} mismatches vs eager, "
        f"{checked} checked vs reference, splits {splits}, CPU jobs {stats['jobs']}, "
        f"hits {ex.policy.hits} misses {ex.policy.misses}"
    )
    assert mismatches == 0
    assert stats["stale_inputs"] == 0 and stats["cpu_failures"] == 0
    ex.close()


@pytest.mark.parametrize("handshake", ["host_func", "stream_memop"])
@pytest.mark.parametrize("backend", ["triton", "hip"])
def test_q4_k_m_layer_replays_equal_eager(handshake, backend):
    """A Q4_K_M layer (Q4_K gate/up, Q6_K down; H = I = 256) split between the GPU's K-quant
    kernels and the CPU's, replayed with changing inputs, splits and residency: equal to eager
    bit for bit, and to the all-experts reference within the derived bound."""
    h = inter = 256
    gu = ft.random_quant_bank(1, "Q4_K", E, 2 * inter, h, magnitude=4 * h**-0.5)
    dn = ft.random_quant_bank(2, "Q6_K", E, h, inter, magnitude=4 * inter**-0.5)
    ex = HybridDecodeExecutor(gu, dn, SLOTS, "cuda", backend=backend, mechanism=handshake)
    gen = torch.Generator().manual_seed(8)
    ex.end_step(torch.arange(SLOTS).view(2, -1))
    x = torch.randn(2, h, generator=gen).to("cuda", torch.bfloat16)
    w = torch.rand(2, K, generator=gen).cuda()
    ids = _ids_for(2, sorted(ex.policy.resident()), 2, gen).cuda()
    graph, y = _capture(ex, x, w, ids)
    for r in range(60):
        if r and r % 20 == 0:
            ex.end_step(torch.randint(0, E, (2, K), generator=gen))
        x.copy_(torch.randn(2, h, generator=gen))
        w.copy_(torch.rand(2, K, generator=gen))
        ids.copy_(_ids_for((0, 2, 4)[r % 3], sorted(ex.policy.resident()), 2, gen))
        graph.replay()
        torch.cuda.synchronize()
        ex.check()
        assert torch.equal(y, ex.eager(x, w, ids)), f"replay {r} differs from eager"
        if r % 10 == 0:
            ref = ops.moe_experts(
                x.cpu(), gu, dn, w.cpu(), ids.cpu(), path="int8", backend="reference"
            )
            bound = ft.hybrid_tolerance(
                x.cpu(), gu, dn, w.cpu(), ids.cpu(), ex.split(ids)[0], "int8", ref
            )
            assert_within("hybrid Q4_K_M replay", f"replay {r}", y.cpu(), ref, bound)
    ex.close()


@pytest.mark.parametrize("handshake", ["host_func", "stream_memop"])
def test_failing_handshake_raises_not_stale(handshake):
    gu, dn = _banks(1)
    ex = HybridDecodeExecutor(gu, dn, SLOTS, "cuda", mechanism=handshake)
    ex.end_step(torch.arange(SLOTS).view(2, -1))
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, H, generator=gen).cuda()
    w = torch.rand(2, K, generator=gen).cuda()
    ids = _ids_for(2, sorted(ex.policy.resident()), 2, gen).cuda()
    graph, y = _capture(ex, x, w, ids)
    for step in range(12):
        x.copy_(torch.randn(2, H, generator=gen))
        if step == 7:  # the CPU worker leaves its output words of the last step in place
            ex.handshake.cpu.inject_fault("stale")
        graph.replay()
        torch.cuda.synchronize()
        if step == 7:
            assert torch.isnan(y).all(), "a stale CPU answer must not be returned"
            with pytest.raises(HandshakeError, match="another step"):
                ex.check()
        else:
            ex.check()
            assert torch.equal(y, ex.eager(x, w, ids))
    # an unchecked stale read (the broken handshake the check exists for) returns wrong data
    x.copy_(torch.randn(2, H, generator=gen))
    ex.handshake.cpu.inject_fault("stale_unchecked")
    graph.replay()
    torch.cuda.synchronize()
    assert not torch.isnan(y).any() and not torch.equal(y, ex.eager(x, w, ids))
    ex.handshake.cpu.inject_fault("none")
    ex.close()


def test_forced_probe_failure_falls_back_to_eager(monkeypatch):
    monkeypatch.setenv(hx.ENV_PROBE_FAIL, "all")
    hx.reset_probes()
    gu, dn = _banks(2)
    with pytest.warns(RuntimeWarning, match="no graph handshake passed"):
        ex = HybridDecodeExecutor(gu, dn, SLOTS, "cuda")
    assert ex.mechanism == "eager" and not ex.capturable
    assert [n for n, ok, _ in ex.probe_results] == list(hx.PROBE_ORDER)
    assert all(not ok and "forced" in why for _, ok, why in ex.probe_results)
    gen = torch.Generator().manual_seed(5)
    ex.end_step(torch.arange(SLOTS).view(2, -1))
    x = torch.randn(3, H, generator=gen)
    w = torch.rand(3, K, generator=gen)
    ids = _ids_for(2, sorted(ex.policy.resident()), 3, gen)
    got = ex(x.cuda(), w.cuda(), ids.cuda()).cpu()
    ref = ops.moe_experts(x, gu, dn, w, ids, path="int8", backend="reference")
    bound = ft.hybrid_tolerance(x, gu, dn, w, ids, ex.split(ids)[0], "int8", ref)
    assert_within("hybrid eager fallback", "step", got, ref, bound)
    xd, wd, idsd = x.cuda(), w.cuda(), ids.cuda()
    with pytest.raises(RuntimeError, match="graph capture"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            ex(xd, wd, idsd)


def test_probe_picks_a_handshake_and_env_forces_one(monkeypatch):
    gu, dn = _banks(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ex = HybridDecodeExecutor(gu, dn, SLOTS, "cuda")
    print(f"\nprobe: {ex.probe_results} -> {ex.mechanism} ({ex.mechanism_reason})")
    assert ex.mechanism == hx.PROBE_ORDER[0] and ex.capturable
    assert ex.probe_results[0][1]
    ex.close()
    for name in ("host_func", "stream_memop", "eager"):
        monkeypatch.setenv(hx.ENV_MECHANISM, name)
        ex = HybridDecodeExecutor(gu, dn, SLOTS, "cuda")
        assert ex.mechanism == name and "forced" in ex.mechanism_reason
        ex.close()
