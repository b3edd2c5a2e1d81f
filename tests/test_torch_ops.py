"""habu.torch_ops on the CPU: the op's fake implementation (output shapes and dtypes, runtime extents
symbolic under torch.compile), tracing with fullgraph=True, and the CPU kernel (the float64 reference).
Skipped where torch is not installed (CI); the CUDA kernel is tested in tests/gpu/test_torch_ops.py."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

import habu  # noqa: E402
from habu.emit_cuda.arrays import ArgumentError  # noqa: E402
from habu.errors import HabuError, UsageError  # noqa: E402
from habu.spec.dtypes import DTYPES  # noqa: E402
from habu.spec.ir import Extent, Model, TensorDecl  # noqa: E402
from habu.torch_ops import as_op, output_shapes, sanitise, schema_of, unsized_outputs  # noqa: E402
from tests.conftest import ROOT  # noqa: E402

EX = ROOT / "examples"


@pytest.fixture(scope="module")
def rmsnorm():
    """RMSNORM-ROWS: 8 rows, #D a runtime extent (256..65536, a multiple of 256)."""
    return as_op(habu.build(EX / "rmsnorm.habu", "RMSNORM-ROWS", R=8))


@pytest.fixture(scope="module")
def ggemm():
    return as_op(habu.build(EX / "ggemm.habu", M=64, N=32, K=48))


def _fake(*shapes_and_dtypes):
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    with mode:
        return mode, [torch.empty(s, dtype=d) for s, d in shapes_and_dtypes]


def test_fake_implementation_takes_runtime_extents_from_the_inputs(rmsnorm):
    mode, (x,) = _fake(((8, 768), torch.bfloat16))
    with mode:
        y = rmsnorm(x)
    assert y.shape == (8, 768) and y.dtype == torch.bfloat16
    mode, (x,) = _fake(((8, 65536), torch.bfloat16))
    with mode:
        assert rmsnorm(x).shape == (8, 65536)


def test_fake_implementation_gives_each_output_its_declared_dtype(ggemm):
    mode, (a, ix, b) = _fake(((64, 48), torch.bfloat16), ((64,), torch.int64), ((32, 48), torch.bfloat16))
    with mode:
        o = ggemm(a, ix, b)
    assert o.shape == (64, 32) and o.dtype == torch.float32


def test_fake_implementation_refuses_shapes_and_dtypes_the_model_does_not_take(rmsnorm, ggemm):
    mode, (x, x16) = _fake(((8, 700), torch.bfloat16), ((8, 768), torch.float16))
    with mode, pytest.raises(ArgumentError, match=r"X: size 700 along #D is outside its declared range"):
        rmsnorm(x)
    with mode, pytest.raises(ArgumentError, match=r"X: expected torch.bfloat16, got torch.float16"):
        rmsnorm(x16)
    mode, (a, ix, b) = _fake(((64, 48), torch.bfloat16), ((64,), torch.float32), ((32, 48), torch.bfloat16))
    with mode, pytest.raises(ArgumentError, match=r"IX: expected torch.int32 \(or int16/int32/int64"):
        ggemm(a, ix, b)


def test_output_shapes_check_agreement_between_inputs():
    model = _two_input_model()
    assert output_shapes(model, [(4, 6), (6, 9)]) == [(4, 9)]
    with pytest.raises(ArgumentError, match=r"W: size 7 along #K, but #K = 6 from X$"):
        output_shapes(model, [(4, 6), (7, 9)])
    with pytest.raises(ArgumentError, match=r"X: size 5 along #M, but #M = 4$"):
        output_shapes(model, [(5, 6), (6, 9)])
    with pytest.raises(ArgumentError, match=r"W: expected 2 dimensions \( #K #N \), got shape \(6,\)$"):
        output_shapes(model, [(4, 6), (6,)])
    with pytest.raises(ArgumentError, match=r"takes 2 tensors \(X, W\), got 1"):
        output_shapes(model, [(4, 6)])


def _two_input_model(out_extents=("M", "N")) -> Model:
    f32 = DTYPES["f32"]
    extents = (Extent("M", 4), Extent("K", None), Extent("N", None), Extent("Z", None))
    return Model("TWO-IN", "equation", extents, (TensorDecl("X", ("M", "K"), f32), TensorDecl("W", ("K", "N"), f32)),
                 (TensorDecl("Y", out_extents, f32),), (), ())


def test_an_output_whose_size_no_input_has_is_refused():
    model = _two_input_model(("M", "Z"))
    assert unsized_outputs(model) == ["Y's #Z"]
    with pytest.raises(UsageError, match=r"no input has the size of Y's #Z"):
        as_op(SimpleNamespace(model=model))


def test_schema_and_names():
    assert sanitise("FFN-SKIP") == "ffn_skip" and sanitise("2X") == "m_2x"
    assert schema_of(_two_input_model()) == "(Tensor x, Tensor w) -> Tensor"


def test_torch_compile_fullgraph_traces_one_graph_for_every_runtime_size(rmsnorm):
    from torch._dynamo.testing import CompileCounter

    class Block(torch.nn.Module):
        def forward(self, x):
            return rmsnorm(x * 2.0) + 1.0

    counter = CompileCounter()
    block = torch.compile(Block(), backend=counter, fullgraph=True, dynamic=True)
    for d in (256, 768, 1024):
        x = torch.randn(8, d, dtype=torch.bfloat16)
        torch.testing.assert_close(block(x), Block()(x))
    assert counter.frame_count == 1  # no graph break (fullgraph) and no recompile for a new #D


def test_cpu_kernel_is_the_float64_reference(rmsnorm, ggemm):
    x = torch.randn(8, 512, dtype=torch.bfloat16)
    want = torch.nn.functional.rms_norm(x.double(), (512,), eps=1e-6).to(torch.bfloat16)
    assert torch.equal(rmsnorm(x), want)  # one rounding of the float64 value
    a, b = torch.randn(64, 48, dtype=torch.bfloat16), torch.randn(32, 48, dtype=torch.bfloat16)
    ix = torch.randint(0, 64, (64,))  # int64, torch's default
    o = ggemm(a, ix, b)
    torch.testing.assert_close(o, (a[ix].double() @ b.double().T).float())
    assert torch.equal(ggemm(A=a, B=b, IX=ix), o)
    ix[5] = 64
    with pytest.raises(HabuError, match=r"IX\[5\] = 64 is outside #M"):
        ggemm(a, ix, b)


def test_ops_are_registered_once_per_compiled_model(ggemm):
    # habu::ggemm, or habu::ggemm_2... where this process registered a GGEMM before (the GPU tests)
    assert re.fullmatch(r"habu::ggemm(_\d+)?", ggemm.qualname)
    assert ggemm.inputs == ("A", "IX", "B") and ggemm.outputs == ("O",)
    assert as_op(ggemm.compiled) is ggemm
    name = ggemm.qualname.removeprefix("habu::")
    assert getattr(torch.ops.habu, name).default is not None
    again = as_op(habu.build(EX / "ggemm.habu", M=64, N=32, K=16))  # another shape: another op
    assert re.fullmatch(r"habu::ggemm_\d+", again.qualname) and again.qualname != ggemm.qualname
    with pytest.raises(UsageError, match="already registered"):
        as_op(habu.build(EX / "ggemm.habu", M=64, N=32, K=16), name=name)


def test_call_by_name_errors(ggemm):
    a, b, ix = torch.zeros(64, 48, dtype=torch.bfloat16), torch.zeros(32, 48, dtype=torch.bfloat16), torch.zeros(64)
    with pytest.raises(ArgumentError, match=r"missing IX \(inputs: A, IX, B\)"):
        ggemm(A=a, B=b)
    with pytest.raises(ArgumentError, match=r"C: not an input"):
        ggemm(A=a, B=b, IX=ix, C=a)
