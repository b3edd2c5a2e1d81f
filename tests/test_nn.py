"""habu.nn on the CPU: the layers are torch's modules (state dicts, outputs, gradients), the Habu
models they write compute what torch computes (float64 reference against torch in float64) and are
proven by habu.build, and torch.compile(fullgraph=True) traces them. Skipped without torch."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import habu.nn as hnn  # noqa: E402
from habu.compile import bind_shape  # noqa: E402
from habu.errors import HabuError, UsageError  # noqa: E402
from habu.spec.parser import parse_text  # noqa: E402
from habu.spec.reference import evaluate  # noqa: E402

F = torch.nn.functional


def _close(a, b, dtype):
    tol = {torch.float32: 1e-5, torch.bfloat16: 0.0, torch.float16: 0.0, torch.float64: 1e-12}[dtype]
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("eps", [None, 1e-5])
def test_rmsnorm_loads_torch_state_and_matches_it(dtype, eps):
    ref = torch.nn.RMSNorm(64, eps=eps, dtype=dtype)
    torch.nn.init.normal_(ref.weight)
    layer = hnn.RMSNorm(64, eps=eps, dtype=dtype)
    layer.load_state_dict(ref.state_dict())
    x = torch.randn(3, 5, 64, dtype=dtype, requires_grad=True)
    _close(layer(x), ref(x), dtype)
    g = torch.randn(3, 5, 64, dtype=dtype)
    (layer(x) * g).sum().backward()
    gx, gw = x.grad, layer.weight.grad
    x.grad = None
    (ref(x) * g).sum().backward()
    _close(gx, x.grad, dtype)
    _close(gw, ref.weight.grad, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_regression_default_eps_is_the_epsilon_torch_computes_with(dtype):
    # F.rms_norm(eps=None) adds the epsilon of its computing type (float32 for bf16/f16), not
    # finfo(x.dtype).eps: with bf16's 2^-7 the Habu model differed from torch by 1% on N(0,1) rows
    assert hnn.RMSNorm(8)._eps(dtype) == torch.finfo(torch.float32).eps
    x = torch.randn(4, 8, dtype=dtype) * 0.01
    _close(hnn.RMSNorm(8, dtype=dtype)(x), torch.nn.RMSNorm(8, dtype=dtype)(x), dtype)
    assert "1.1920928955078125e-07" in hnn.RMSNorm(8).habu_source(dtype)


def test_rmsnorm_without_weight_and_with_several_dimensions():
    x = torch.randn(4, 6, 8)
    _close(hnn.RMSNorm(8, elementwise_affine=False)(x), torch.nn.RMSNorm(8, elementwise_affine=False)(x), x.dtype)
    layer = hnn.RMSNorm((6, 8))  # normalises over two dimensions: torch's forward
    _close(layer(x), torch.nn.RMSNorm((6, 8))(x), x.dtype)


@pytest.mark.parametrize("activation", [None, "gelu", "gelu_tanh", "relu", "silu"])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_loads_torch_state_and_matches_it(activation, bias):
    ref = torch.nn.Linear(32, 24, bias=bias)
    layer = hnn.Linear(32, 24, bias=bias, activation=activation)
    layer.load_state_dict(ref.state_dict())
    assert set(layer.state_dict()) == ({"weight", "bias"} if bias else {"weight"})
    x = torch.randn(2, 7, 32, requires_grad=True)
    act = {None: lambda y: y, "gelu": F.gelu, "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"),
           "relu": F.relu, "silu": F.silu}[activation]
    want = act(ref(x))
    _close(layer(x), want, x.dtype)
    layer(x).sum().backward()
    gw = layer.weight.grad
    want.sum().backward()
    _close(gw, ref.weight.grad, x.dtype)


def test_ffn_matches_the_block_written_in_torch():
    layer = hnn.FFN(16, 40)
    assert set(layer.state_dict()) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
    x = torch.randn(5, 16)
    h = F.linear(F.gelu(F.linear(x, layer.fc1.weight, layer.fc1.bias)), layer.fc2.weight, layer.fc2.bias)
    _close(layer(x), F.rms_norm(h + x, (16,), eps=1e-6), x.dtype)


def test_bad_activation_is_a_usage_error():
    with pytest.raises(UsageError, match=r"activation 'tanh': Habu's layers have gelu, gelu_tanh, relu, silu"):
        hnn.Linear(4, 4, activation="tanh")


# ----------------------------------------------------------------------------- the Habu models they write


def _evaluate(source: str, model: str, rows: int, inputs: dict) -> np.ndarray:
    m = bind_shape(parse_text(source).model(model), {"R": rows})
    return evaluate(m, {k: v.detach().numpy() for k, v in inputs.items()})["Y"]


@pytest.mark.parametrize("eps", [1e-6, 1e-5, 0.0078125])
@pytest.mark.parametrize("weighted", [True, False])
def test_rmsnorm_source_computes_what_torch_computes(eps, weighted):
    # (declared f32: `habu check` refuses f64 outputs no kernel can store; the reference evaluates in float64)
    x, w = torch.randn(6, 16, dtype=torch.float64), torch.randn(16, dtype=torch.float64)
    source = hnn.rmsnorm_source(16, eps, weighted, "f32")
    assert ("RMSNORM-W" if weighted else "RMSNORM") in source
    assert ("-EPS" in source) == (eps != 1e-6)  # the prelude's word where its epsilon fits
    inputs = {"X": x, "W": w.reshape(1, 16)} if weighted else {"X": x}
    got = _evaluate(source, "NN-RMSNORM", 6, inputs)
    np.testing.assert_allclose(got, hnn.rms_norm_reference(x, w if weighted else None, eps).numpy(), rtol=1e-12)


@pytest.mark.parametrize("activation", ["", "gelu", "gelu_tanh", "relu", "silu"])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_source_computes_what_torch_computes(activation, bias):
    x, w, b = (torch.randn(6, 16, dtype=torch.float64), torch.randn(8, 16, dtype=torch.float64),
               torch.randn(8, dtype=torch.float64))
    inputs = {"X": x, "W": w, **({"B": b.reshape(1, 8)} if bias else {})}
    got = _evaluate(hnn.linear_source(16, 8, bias, activation, "f32"), "NN-LINEAR", 6, inputs)
    want = hnn.linear_reference(x, w, b if bias else None, activation).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_ffn_source_computes_what_torch_computes():
    d, h = 16, 24
    t = {k: torch.randn(*s, dtype=torch.float64) for k, s in
         {"X": (5, d), "W1": (h, d), "B1": (h,), "W2": (d, h), "B2": (d,)}.items()}
    inputs = {**t, "B1": t["B1"].reshape(1, h), "B2": t["B2"].reshape(1, d)}
    got = _evaluate(hnn.ffn_source(d, h, 1e-5, "gelu", "f32"), "NN-FFN", 5, inputs)
    want = hnn.ffn_reference(t["X"], t["W1"], t["B1"], t["W2"], t["B2"], 1e-5, "gelu").numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layer", [hnn.RMSNorm(512), hnn.Linear(256, 128, activation="gelu"), hnn.FFN(256, 512)],
                         ids=["rmsnorm", "linear-gelu", "ffn"])
def test_the_sources_have_proven_plans(layer, tmp_path):
    """What the first CUDA forward builds: here only proven and emitted (no GPU to compile for)."""
    import habu

    path = tmp_path / "layer.habu"
    path.write_text(layer.habu_source(torch.bfloat16))
    model, inputs = {hnn.RMSNorm: ("NN-RMSNORM", ["X", "W"]), hnn.Linear: ("NN-LINEAR", ["X", "W", "B"]),
                     hnn.FFN: ("NN-FFN", ["X", "W1", "B1", "W2", "B2"])}[type(layer)]
    built = habu.build(path, model, R=64, check=False)
    assert [d.name for d in built.model.inputs] == inputs  # the names the CUDA implementations pass
    assert built.model.extent("R").size == 64 and len(built.kernel_set) >= 1


def test_a_build_that_fails_warns_once_and_runs_torch(monkeypatch, tmp_path):
    import habu.api

    calls = []

    def no_plan(*args, **kwargs):
        calls.append(args)
        raise HabuError("no plan for this")

    monkeypatch.setattr(habu.api, "build", no_plan)
    monkeypatch.setattr(hnn, "_builds", {})
    monkeypatch.setattr(hnn, "source_dir", lambda: tmp_path)
    device = torch.device("cuda", 0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert hnn.built_for("1 EXTENT: #R\n", "NN-X", 8, device) is None
        assert hnn.built_for("1 EXTENT: #R\n", "NN-X", 8, device) is None
    assert len(calls) == 1
    assert [str(w.message) for w in seen if "habu.nn" in str(w.message)] == [
        f"habu.nn: no Habu kernel for NN-X at 8 rows ({calls[0][0]}): no plan for this; running torch instead"]


# ----------------------------------------------------------------------------- tracing


def test_torch_compile_fullgraph_traces_the_layers():
    model = torch.nn.Sequential(hnn.RMSNorm(32), hnn.Linear(32, 64, activation="gelu"), hnn.Linear(64, 32),
                                hnn.FFN(32, 48))
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=True)
    for rows in (3, 10):
        x = torch.randn(rows, 32)
        torch.testing.assert_close(compiled(x), model(x))
    assert len(graphs) == 1  # one graph, no recompile for another row count
    ops = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert [op for op in ops if op.startswith("habu_nn.")] == [
        "habu_nn.rms_norm.default", "habu_nn.linear.default", "habu_nn.linear.default", "habu_nn.ffn.default"]


def test_meta_tensors_give_shapes():
    model = torch.nn.Sequential(hnn.RMSNorm(32), hnn.FFN(32, 48), hnn.Linear(32, 8, bias=False)).to("meta")
    y = model(torch.empty(4, 9, 32, device="meta", dtype=torch.bfloat16))
    assert y.shape == (4, 9, 8) and y.device.type == "meta"
    with pytest.raises(UsageError, match=r"habu_nn.linear: expected the last dimension of x to be 32, got shape \(4, 9, 31\)"):
        hnn.Linear(32, 8).to("meta")(torch.empty(4, 9, 31, device="meta"))
