"""Every element type the language names either compiles or is refused where it is declared or
written, with the supported list; `habu compile` never meets a type the emitter has no table row for."""

from __future__ import annotations

import pytest

from habu.emit_cuda.common import CTYPE, STORE
from habu.spec.dtypes import DTYPES, READABLE_DTYPES, WRITABLE_DTYPES, dtype_summary
from tests.conftest import assert_error_format, error_of, parse

HEAD = "128 EXTENT: #M\n"


def program(x: str, y: str, composition: bool = False) -> str:
    model = "MODEL: M ( X -- Y ) GELU ;\n" if composition else "MODEL: M Y[m] = X[m] + 1 ;\n"
    return HEAD + f"{x} TENSOR: X ( #M )\n{y} TENSOR: Y ( #M )\n" + model


def test_the_supported_lists_are_the_emitters_tables():
    assert set(READABLE_DTYPES) == set(CTYPE) and set(WRITABLE_DTYPES) == set(STORE)
    assert set(READABLE_DTYPES) <= set(DTYPES) and set(WRITABLE_DTYPES) <= set(READABLE_DTYPES)


@pytest.mark.parametrize("name", list(DTYPES))
def test_regression_every_input_dtype_compiles_or_is_refused_f8e4m3_gave_key_error(name):
    text = program(name, "f32")
    if name in CTYPE:
        assert parse(text).models["M"].inputs[0].dtype.name == name
        return
    err = error_of(text)
    assert err.message == f"tensor X cannot be {name}: no kernel reads or writes {name} yet"
    assert "tensors hold f64, f32, bf16, f16, i8, i16, i32, i64" in err.notes[0]
    assert_error_format(err)


@pytest.mark.parametrize("composition", [False, True])
@pytest.mark.parametrize("name", list(DTYPES))
def test_regression_every_output_dtype_compiles_or_is_refused_i8_to_i32_gave_key_error(name, composition):
    if name not in READABLE_DTYPES:
        return  # refused where it is declared (above)
    text = program("i8", name, composition)
    if name in STORE:
        assert parse(text).models["M"].outputs[0].dtype.name == name
        return
    err = error_of(text)
    assert err.message == f"Y is {name}, and kernels store only f32, bf16, f16: declare the output as one of those"
    assert_error_format(err)


def test_dtype_summary_names_every_supported_type():
    line = dtype_summary()
    assert all(d in line for d in READABLE_DTYPES) and "f8e4m3" not in line


def test_a_vector_input_does_not_decide_the_activation_type():
    from habu.spec.dtypes import activation_dtype
    from tests.conftest import parse

    mixed = parse("4 EXTENT: #R  8 EXTENT: #N\nbf16 TENSOR: X ( #R #N )  f32 TENSOR: P ( #R )  "
                  "f32 TENSOR: Y ( #R #N )\nMODEL: M  Y[r n] = X[r n] · P[r] ;\n").models["M"]
    assert activation_dtype(mixed.inputs) == "bf16"
    vectors = parse("8 EXTENT: #N\nbf16 TENSOR: x ( #N )  f32 TENSOR: y ( #N )  f32 TENSOR: d ( #N )\n"
                    "MODEL: V  d[n] = x[n] · y[n] ;\n").models["V"]
    assert activation_dtype(vectors.inputs) == "f32"  # vectors only: all of them decide, and they differ


def test_regression_an_in_place_f32_target_does_not_make_the_moe_activations_f32():
    """MoE's Y (f32, added into: an input and an output) made gate, up and act f32, so the down
    projection read an f32 A and the grouped kernel split each element into two bf16 parts (twice the
    tensor-core work: 6.3 of 9.3 ms on the H200 at Mixtral 4096 tokens)."""
    from habu.plan.storage import storage_dtypes
    from habu.spec.parser import load_program
    from tests.conftest import ROOT

    model = load_program(ROOT / "tests" / "data" / "moe_small.habu").models["MOE-FFN"]
    assert storage_dtypes(model) == {"gate": "bf16", "up": "bf16", "act": "bf16"}
