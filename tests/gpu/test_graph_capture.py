"""Calls without a host round trip on the GPU: GGEMM, RMSNorm and FFN-SKIP captured in a CUDA graph
(`torch.cuda.graph`) and replayed on new input values match eager calls; an out-of-range index is
masked (its rows read as zero, a scatter writes nothing outside Y: red zones around the tensors stay
as they were) and reported by habu.check_errors() with the host check's message."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

import habu  # noqa: E402
from habu.emit_cuda.arrays import ArgumentError  # noqa: E402
from habu.emit_cuda.device_errors import IndexValueError  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

EX = ROOT / "examples"
BF16 = torch.bfloat16
M, N, K = 256, 512, 512  # GGEMM
R, D = 64, 4096  # RMSNorm
B, DM, H = 64, 512, 1024  # FFN-SKIP


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def _randn(g: torch.Generator, *shape: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=g) * scale).to("cuda", BF16)


@pytest.fixture(scope="module")
def built():
    return {"ggemm": habu.build(EX / "ggemm.habu", M=M, N=N, K=K),
            "rms": habu.build(EX / "rmsnorm.habu", "RMSNORM-ROWS", R=R, D=D),
            "ffn": habu.build(EX / "ffn_skip.habu", B=B, D=DM, H=H)}


def _ggemm_inputs(seed: int, index_dtype=torch.int32) -> dict[str, torch.Tensor]:
    g = _gen(seed)
    return {"A": _randn(g, M, K), "B": _randn(g, N, K),
            "IX": torch.randint(0, M, (M,), generator=g).to("cuda", index_dtype)}


def _rms_inputs(seed: int) -> dict[str, torch.Tensor]:
    return {"X": _randn(_gen(seed), R, D)}


def _ffn_inputs(seed: int) -> dict[str, torch.Tensor]:
    g = _gen(seed)
    return {"X": _randn(g, B, DM), "W1": _randn(g, DM, H, scale=DM ** -0.5), "B1": _randn(g, 1, H, scale=0.1),
            "W2": _randn(g, H, DM, scale=H ** -0.5), "B2": _randn(g, 1, DM, scale=0.1)}


def _capture_replay(fn, make_inputs) -> None:
    """Warm up on a side stream, capture one call, put new values into the captured inputs, replay, and
    compare the graph's output with an eager call on those values."""
    static = make_inputs(1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(**static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fn(**static)
    for name, value in make_inputs(2).items():
        static[name].copy_(value)
    graph.replay()
    torch.cuda.synchronize()
    eager = fn(**static)
    torch.cuda.synchronize()
    assert torch.isfinite(captured).all()
    # the same kernels on the same values: equal up to the order of atomic adds (a replay that ran on
    # the capture-time values, or did not run, would be off by the whole output)
    assert _rel(captured, eager) <= 1e-3, _rel(captured, eager)
    graph.replay()  # a second replay gives the same result
    torch.cuda.synchronize()
    assert _rel(captured, eager) <= 1e-3
    habu.check_errors()


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


def test_ggemm_is_captured_and_replayed(built):
    _capture_replay(built["ggemm"], _ggemm_inputs)


def test_ggemm_with_an_int64_index_is_captured_and_replayed(built):
    _capture_replay(built["ggemm"], lambda seed: _ggemm_inputs(seed, torch.int64))


def test_rmsnorm_is_captured_and_replayed(built):
    _capture_replay(built["rms"], _rms_inputs)


def test_ffn_skip_is_captured_and_replayed(built):
    _capture_replay(built["ffn"], _ffn_inputs)


RED = 64  # red-zone rows on each side of a tensor


def test_an_out_of_range_gather_reads_zeros_and_is_reported(built):
    g = _gen(3)
    big = torch.full((M + 2 * RED, K), 1000.0, dtype=BF16, device="cuda")  # red zones of large values
    a = big[RED:RED + M]
    a.copy_(_randn(g, M, K))
    b = _randn(g, N, K)
    ix = torch.randint(0, M, (M,), generator=g).to("cuda", torch.int32)
    ix[5], ix[7] = M, -1  # one past the last row, and negative: both would read a red zone
    habu.check_errors()
    out = built["ggemm"](A=a, B=b, IX=ix)  # no synchronisation, no host copy
    with pytest.raises(IndexValueError, match=rf"IX: values must be in 0\.\.{M - 1} \(an index into #M\): "
                                              r"found (256 at IX\[5\]|-1 at IX\[7\])"):
        habu.check_errors()
    habu.check_errors()  # reported once
    assert (out[5] == 0).all() and (out[7] == 0).all()  # masked rows: zeros, not the red zone's products
    ok = torch.ones(M, dtype=torch.bool, device="cuda")
    ok[5] = ok[7] = False
    want = (a[ix.clamp(0, M - 1).long()].double() @ b.double().T)[ok]
    assert float((out[ok].double() - want).norm() / want.norm()) < 2e-2


def test_regression_an_int64_index_past_int32_is_saturated_not_wrapped_by_the_narrowing_launch(built):
    """torch's int64 index is narrowed by one launch of Habu's (habu.emit_cuda.narrow; torch's clamp and
    to cost ~30 µs of host time a call): 2^32 + 5 must stay out of range (reported), not wrap to row 5."""
    g = _gen(4)
    a, b = _randn(g, M, K), _randn(g, N, K)
    ix = torch.randint(0, M, (M,), generator=g).to("cuda", torch.int64)
    habu.check_errors()
    good = built["ggemm"](A=a, B=b, IX=ix)
    ix[9] = (1 << 32) + 5
    out = built["ggemm"](A=a, B=b, IX=ix)
    with pytest.raises(IndexValueError, match=r"IX: values must be in 0\.\.255 .*found 2147483647 at IX\[9\]"):
        habu.check_errors()
    assert (out[9] == 0).all()
    keep = torch.arange(M, device="cuda") != 9
    assert torch.equal(out[keep], good[keep])
    (call,) = [c for c in built["ggemm"]._calls.values() if c is not None and c.narrow_launches]
    assert [nl.tensor for nl in call.narrow_launches] == ["IX"] and not call.narrow


def test_an_out_of_range_scatter_writes_nothing_outside_y():
    rs, ts, ns = 64, 16, 64
    unpermute = habu.build(EX / "scatter_add.habu", "UNPERMUTE", R=rs, T=ts, N=ns)
    g = _gen(4)
    x = _randn(g, rs, ns)
    w = torch.randn(rs, generator=g).to("cuda")
    ix = torch.randint(0, ts, (rs,), generator=g).to("cuda", torch.int32)
    ix[3], ix[10] = ts, -1
    big = torch.full((ts + 2 * RED, ns), 7.0, device="cuda")  # Y inside red zones
    y = big[RED:RED + ts]
    y.copy_(torch.randn(ts, ns, generator=g).to("cuda"))
    y0, guard = y.clone(), big.clone()
    unpermute(X=x, W=w, IX=ix, Y=y)
    with pytest.raises(IndexValueError, match=r"IX: values must be in 0\.\.15 \(an index into #T\)"):
        habu.check_errors()
    assert torch.equal(big[:RED], guard[:RED]) and torch.equal(big[RED + ts:], guard[RED + ts:])
    valid = (ix >= 0) & (ix < ts)
    want = y0.double().index_add(0, ix[valid].long(), (w[:, None].double() * x.double())[valid])
    assert torch.allclose(y.double(), want, rtol=1e-4, atol=1e-3)


def test_host_mode_refuses_a_bad_index_before_launching():
    gg = habu.build(EX / "ggemm.habu", M=M, N=N, K=K, check=False, check_indices="host")
    inputs = _ggemm_inputs(5)
    inputs["IX"][9] = M
    with pytest.raises(ArgumentError, match=rf"IX: values must be in 0\.\.{M - 1} .* found {M} at IX\[9\]"):
        gg(**inputs)
    habu.check_errors()  # nothing ran, nothing to report


def test_a_call_from_a_fresh_thread_pushes_the_context_and_one_from_a_seen_thread_does_not(built):
    """The call plan skips cuCtxPushCurrent/PopCurrent on a thread once seen with the device's primary
    context current (two driver calls a call); a thread that never touched CUDA still gets it pushed."""
    import threading

    rms = built["rms"]
    x = _rms_inputs(5)["X"]
    want = rms(X=x)
    (call,) = [c for c in rms._calls.values() if c is not None]
    assert threading.get_ident() in call._threads
    got: list[torch.Tensor] = []
    worker = threading.Thread(target=lambda: got.append(rms(X=x)))
    worker.start()
    worker.join()
    torch.cuda.synchronize()
    assert torch.equal(got[0], want)
