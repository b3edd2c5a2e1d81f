"""The epilogue's loads read one column pair at a time (habu/lower/epilogue_pairs.py) on the GPU: the exact check at
whole and partial tiles, a bf16 and an f32 pair, and a base address the pair's one load cannot use (two bytes past
an aligned one) refused before the launch."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU tests use torch to make device arrays")
if not torch.cuda.is_available():  # pragma: no cover - CPU machines
    pytest.skip("no CUDA device: GPU tests run on the device machine", allow_module_level=True)

from habu.bench.run import build  # noqa: E402
from habu.emit_cuda.arrays import ArgumentError  # noqa: E402
from habu.timing.exact import kept_types  # noqa: E402
from habu.timing.exact_gpu import ExactChecker  # noqa: E402
from tests.emit_cuda.test_epilogue_pairs import SOURCE  # noqa: E402

CASES = {"rows-whole": ("ROWS", 256, 256), "rows-partial": ("ROWS", 199, 264), "f32-partial": ("F32", 200, 136)}


def built(tmp_path, name: str, m: int, n: int):
    path = tmp_path / "pairs.habu"
    path.write_text(SOURCE)
    return build(str(path), name, {"M": m, "N": n})


@pytest.mark.parametrize("case", list(CASES))
def test_paired_epilogue_loads_pass_the_exact_check(tmp_path, case):
    name, m, n = CASES[case]
    b = built(tmp_path, name, m, n)
    assert any("habu::load_pair" in k.source for k in b.compiled.kernel_set.members[0][1].kernels)
    result = ExactChecker(b.model, b.sizes, seed=m + n).check(b.compiled, kept_types(b.plan))
    assert result.ok and result.applicable, result.reason()


def test_a_tensor_read_as_pairs_at_an_unaligned_address_is_refused_before_the_launch(tmp_path):
    """The pair's one load needs R's base 4-byte aligned: a view two bytes past an aligned start is refused with the
    reason, and its aligned copy gives the product plus R."""
    b = built(tmp_path, "ROWS", 199, 264)
    g = torch.Generator(device="cuda").manual_seed(7)
    a = torch.randn((199, 512), device="cuda", generator=g).to(torch.bfloat16)
    w = torch.randn((264, 512), device="cuda", generator=g).to(torch.bfloat16)
    storage = torch.randn(199 * 264 + 1, device="cuda", generator=g).to(torch.bfloat16)
    shifted = storage[1:].view(199, 264)  # two bytes past the allocation's start
    assert shifted.data_ptr() % 4 == 2
    with pytest.raises(ArgumentError, match=r"R: base address .* is not 4-byte aligned .*reads pairs"):
        b.compiled(A=a, B=w, R=shifted)
    got = b.compiled(A=a, B=w, R=shifted.clone())  # (one output: the tensor itself)
    ref = a.float() @ w.float().T + shifted.float()
    assert (got.float() - ref).abs().max().item() <= 0.02 * ref.abs().max().item()
