"""Habu from torch on the GPU: three Habu ops (RMSNorm, a gathered GEMM, FFN-SKIP) in one module under
torch.compile(fullgraph=True), int64 index tensors, torch's current stream, and habu.nn's layers
against torch's own modules. Run through the device tool (torch 2.11 on the H200)."""

from __future__ import annotations

import warnings

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

import habu  # noqa: E402
import habu.nn as hnn  # noqa: E402
from habu.emit_cuda.arrays import ArgumentError  # noqa: E402
from habu.torch_ops import as_op  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

EX = ROOT / "examples"
F = torch.nn.functional
BF16 = torch.bfloat16
TOL = {torch.bfloat16: 2e-2, torch.float16: 5e-3, torch.float32: 1e-4}  # normwise, as habu.timing.harness
R, D, N, H = 256, 512, 512, 1024


def rel_error(got, want) -> float:
    want = want.double()
    return float((got.double() - want).norm() / want.norm())


def assert_close(got, want, dtype, what=""):
    assert got.shape == want.shape and got.dtype == dtype, (what, got.shape, got.dtype)
    assert torch.isfinite(got).all(), what
    err = rel_error(got, want)
    assert err <= TOL[dtype], f"{what}: relative error {err:.2e} > {TOL[dtype]:.0e}"


@pytest.fixture(scope="module")
def ops():
    rms = as_op(habu.build(EX / "rmsnorm.habu", "RMSNORM-ROWS", R=R))  # #D stays a runtime extent
    gg = as_op(habu.build(EX / "ggemm.habu", M=R, N=N, K=D))
    ffn = as_op(habu.build(EX / "ffn_skip.habu", B=R, D=N, H=H))
    return rms, gg, ffn


@pytest.fixture(scope="module")
def weights():
    g = torch.Generator(device="cpu").manual_seed(7)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to("cuda", BF16)

    return {"B": randn(N, D), "W1": randn(N, H, scale=N ** -0.5), "B1": randn(1, H, scale=0.1),
            "W2": randn(H, N, scale=H ** -0.5), "B2": randn(1, N, scale=0.1)}


class ThreeOps(torch.nn.Module):
    """y = FFN-SKIP(GGEMM(RMSNORM(x), ix, B) / √D): each stage one Habu op, a torch op between."""

    def __init__(self, ops, weights):
        super().__init__()
        self.rms, self.gg, self.ffn = ops
        self.w = weights

    def forward(self, x, ix):
        h = self.rms(x)
        o = self.gg(h, ix, self.w["B"])  # f32
        z = (o * D ** -0.5).to(BF16)
        return self.ffn(z, self.w["W1"], self.w["B1"], self.w["W2"], self.w["B2"])


def three_ops_reference(x, ix, w):
    """The same in float64 torch, from the same bf16 inputs."""
    d = {k: v.double() for k, v in w.items()}
    h = F.rms_norm(x.double(), (D,), eps=1e-6)
    z = (h[ix] @ d["B"].T) * D ** -0.5
    u = F.gelu(z @ d["W1"] + d["B1"]) @ d["W2"] + d["B2"]
    return F.rms_norm(u + z, (N,), eps=1e-6)


def test_three_habu_ops_under_torch_compile_fullgraph(ops, weights):
    module = ThreeOps(ops, weights)
    compiled = torch.compile(module, fullgraph=True)  # a graph break would raise
    x = torch.randn(R, D, device="cuda").to(BF16)
    ix = torch.randint(0, R, (R,), device="cuda")  # int64
    want = three_ops_reference(x, ix, weights)
    for _ in range(2):
        got = compiled(x, ix)
        torch.cuda.synchronize()
        assert_close(got, want, BF16, "compiled")
    assert_close(module(x, ix), want, BF16, "eager")
    assert rel_error(got, module(x, ix)) <= 1e-2  # the same kernels, only the cast between them fused


def test_int64_indices_are_narrowed_and_out_of_range_ones_reported(ops):
    _, gg, _ = ops
    a = torch.randn(R, D, device="cuda").to(BF16)
    b = torch.randn(N, D, device="cuda").to(BF16)
    ix = torch.randint(0, R, (R,), device="cuda")
    got = gg(a, ix, b)
    assert torch.equal(got, gg(a, ix.to(torch.int32), b))
    assert_close(got, a.double()[ix] @ b.double().T, torch.float32, "int64 IX")
    habu.check_errors()
    # 2^32 + 1 would wrap to 1 if narrowed by a cast: it saturates to the largest int32, still out of range
    for bad, shown in ((R, str(R)), (-1, "-1"), (2**32 + 1, str(2**31 - 1))):
        wrong = ix.clone()
        wrong[17] = bad
        out = gg(a, wrong, b)  # no host check: the kernel masks row 17 and records the value
        with pytest.raises(ArgumentError, match=rf"IX: values must be in 0\.\.{R - 1} \(an index into #M\): "
                                                rf"found {shown} at IX\[17\]"):
            habu.check_errors()
        assert (out[17] == 0).all()


def test_int64_indices_on_the_prepared_path_are_reconverted_every_call(ops):
    _, gg, _ = ops
    model = gg.compiled
    a = torch.randn(R, D, device="cuda").to(BF16)
    b = torch.randn(N, D, device="cuda").to(BF16)
    out = torch.empty(R, N, device="cuda")
    ix = torch.randint(0, R, (R,), device="cuda")
    for _ in range(3):  # the same arrays: the second and third calls reuse the packed launch
        model(A=a, B=b, IX=ix, O=out)
        torch.cuda.synchronize()
        assert_close(out, a.double()[ix] @ b.double().T, torch.float32, "prepared")
        ix.copy_(torch.randint(0, R, (R,), device="cuda"))
    ix[3] = 2**31  # not an int32 at all: saturated to 2^31 - 1, masked and reported
    model(A=a, B=b, IX=ix, O=out)
    with pytest.raises(ArgumentError, match=r"IX: values must be in .* found 2147483647 at IX\[3\]"):
        habu.check_errors()


def test_op_runs_on_torchs_current_stream(ops):
    rms, _, _ = ops
    x = torch.randn(R, 1024, device="cuda").to(BF16)
    want = rms(x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # the input below is written only after this, on the side stream
        late = x * 1
        got = rms(late)
    side.synchronize()
    assert torch.equal(got, want)


# ----------------------------------------------------------------------------- habu.nn


@pytest.fixture
def no_fallback():
    """Fail on habu.nn's warning that it ran torch because Habu had no kernel."""
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="habu.nn: no Habu kernel")
        yield


def _habu_built(text_part: str) -> bool:
    return any(text_part in key[0] and built is not None for key, built in hnn._builds.items())


@pytest.mark.parametrize("dtype", [BF16, torch.float32])
def test_nn_rmsnorm_matches_torch(no_fallback, dtype):
    ref = torch.nn.RMSNorm(D, device="cuda", dtype=dtype)
    torch.nn.init.normal_(ref.weight)
    layer = hnn.RMSNorm(D, device="cuda", dtype=dtype)
    layer.load_state_dict(ref.state_dict())
    x = torch.randn(4, 64, D, device="cuda", dtype=dtype)
    with torch.no_grad():
        assert_close(layer(x), ref(x).double(), dtype, "RMSNorm")
    assert _habu_built("MODEL: NN-RMSNORM ( x w -- y ) RMSNORM-W-EPS")


@pytest.mark.parametrize("activation,bias", [(None, True), ("gelu", True), ("gelu", False)])
def test_nn_linear_matches_torch(no_fallback, activation, bias):
    ref = torch.nn.Linear(D, 768, bias=bias, device="cuda", dtype=BF16)
    layer = hnn.Linear(D, 768, bias=bias, activation=activation, device="cuda", dtype=BF16)
    layer.load_state_dict(ref.state_dict())
    x = torch.randn(4, 64, D, device="cuda", dtype=BF16)
    with torch.no_grad():
        want = F.linear(x.double(), ref.weight.double(), None if ref.bias is None else ref.bias.double())
        assert_close(layer(x), F.gelu(want) if activation else want, BF16, f"Linear {activation}")
    assert _habu_built(f"{D} EXTENT: #I\n768 EXTENT: #O")


def test_nn_ffn_matches_torch_and_compiles(no_fallback):
    layer = hnn.FFN(D, H, device="cuda", dtype=BF16)
    x = torch.randn(R, D, device="cuda", dtype=BF16)
    with torch.no_grad():
        want = hnn.ffn_reference(*(t.double() for t in (x, layer.fc1.weight, layer.fc1.bias, layer.fc2.weight,
                                                        layer.fc2.bias)), 1e-6, "gelu")
        assert_close(layer(x), want, BF16, "FFN")
        model = torch.nn.Sequential(hnn.RMSNorm(D, eps=1e-6), layer).to("cuda", BF16)
        compiled = torch.compile(model, fullgraph=True)
        assert_close(compiled(x), model(x).double(), BF16, "compiled RMSNorm + FFN")
    assert _habu_built("MODEL: NN-FFN")


def test_nn_backward_on_cuda_matches_torch(no_fallback):
    ref = torch.nn.RMSNorm(D, device="cuda", dtype=torch.float32)
    layer = hnn.RMSNorm(D, device="cuda", dtype=torch.float32)
    x = torch.randn(R, D, device="cuda", requires_grad=True)
    g = torch.randn(R, D, device="cuda")  # not y itself: d/dx Σ y² of a normalisation is ~0, all rounding
    (layer(x) * g).sum().backward()
    gx, gw = x.grad, layer.weight.grad
    x.grad = None
    (ref(x) * g).sum().backward()
    assert_close(gx, x.grad.double(), torch.float32, "dx")
    assert_close(gw, ref.weight.grad.double(), torch.float32, "dw")
