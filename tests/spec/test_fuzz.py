"""Fuzzing the front end: 10,000+ mutations of real programs; each either parses or fails with
`FILE:LINE:COL: error: ...`, the line and a caret. No other exception, no traceback."""

from __future__ import annotations

import random
import time

import pytest

from habu.errors import HabuError, Source
from habu.spec.parser import parse_source
from habu.spec.report import describe_program
from tests.conftest import ERROR_HEAD, EXAMPLES, SEEDS

N_INPUTS = 10_000
SEED = 20261130
TIME_LIMIT_S = 240

CORPUS = [p.read_bytes() for p in [*EXAMPLES, *sorted(SEEDS.glob("*.habu"))]]
EXTRA_TOKENS = [
    "(", ")", ";", ":", "[", "]", "Σ", "·", "\\", "--", "|", "MODEL:", "TENSOR:", "ITENSOR:", "EXTENT:", "WORD:",
    "#M", "#Q", "999999999999999999999", "1e999", "-1", "0", "..", "?", "?%0", "1..0", "bf16", "i32", "DUP",
    "SWAP", "DROP", "g", "LOAD-V4", "x", "A@", "O!", "SUM-OVER", "exp(", "max", "sum", "(((", ")))", "=", "^",
    "²", "x[r i]", "ix<#M>", "r", "\x00", "\t", "\u2212", "é", "\U0001F600",
]


def mutate(data: bytes, rng: random.Random) -> bytes:
    text = data.decode("utf-8")
    for _ in range(rng.randint(1, 3)):
        tokens = text.split(" ")
        kind = rng.randrange(9)
        i = rng.randrange(len(tokens))
        if kind == 0 and len(tokens) > 1:
            del tokens[i]
        elif kind == 1:
            tokens.insert(i, tokens[i])
        elif kind == 2:
            j = rng.randrange(len(tokens))
            tokens[i], tokens[j] = tokens[j], tokens[i]
        elif kind == 3:
            tokens[i] = rng.choice(EXTRA_TOKENS)
        elif kind == 4:
            tokens.insert(i, rng.choice(EXTRA_TOKENS))
        elif kind == 5:
            text = text[: rng.randrange(len(text) + 1)]
            continue
        elif kind == 6 and text:
            k = rng.randrange(len(text))
            text = text[:k] + chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0x3000)])) + text[k + 1:]
            continue
        elif kind == 7:
            tokens[i] = tokens[i].upper() if rng.random() < 0.5 else tokens[i].lower()
        else:
            k = rng.randrange(len(text) + 1)
            text = text[:k] + "\n" + text[k:]
            continue
        text = " ".join(tokens)
    out = text.encode("utf-8")
    if rng.random() < 0.02:  # a stray byte that is not UTF-8
        k = rng.randrange(len(out) + 1)
        out = out[:k] + bytes([rng.choice([0x80, 0xC3, 0xFF, 0xFE])]) + out[k:]
    return out


def check_one(data: bytes) -> str:
    try:
        program = parse_source(Source.from_bytes("fuzz.habu", data))
    except HabuError as err:
        text = err.render()
        lines = text.split("\n")
        m = ERROR_HEAD.match(lines[0])
        assert m and m.group("path") == "fuzz.habu", text
        assert len(lines) >= 3 and lines[2].lstrip(" \t").startswith("^"), text
        assert "Traceback" not in text
        return "error"
    describe_program(program)  # every accepted program can be reported (and hashed)
    return "ok"


@pytest.mark.timeout(TIME_LIMIT_S + 60)
def test_fuzzed_programs_parse_or_fail_cleanly():
    rng = random.Random(SEED)
    start = time.monotonic()
    outcomes = {"ok": 0, "error": 0}
    for n in range(N_INPUTS):
        data = mutate(rng.choice(CORPUS), rng)
        try:
            outcomes[check_one(data)] += 1
        except AssertionError:
            raise
        except Exception as exc:  # a crash: show the input that caused it
            raise AssertionError(f"input {n} crashed the front end with {exc!r}:\n{data.decode('utf-8', 'replace')}") from exc
        assert time.monotonic() - start < TIME_LIMIT_S, f"fuzzing exceeded {TIME_LIMIT_S}s after {n} inputs"
    assert sum(outcomes.values()) == N_INPUTS
    # both outcomes are well represented: the mutations are neither all fatal nor all harmless
    assert outcomes["error"] > N_INPUTS // 4 and outcomes["ok"] > N_INPUTS // 20, outcomes


# ----------------------------------------------------------------------------- token soups (hypothesis)

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

VOCAB = [*EXTRA_TOKENS, "128", "4", "O[m", "n]", "A[m", "k]", "B[n", "Σ", "k", "GELU", "LINEAR", "RMSNORM", "MODEL:", "T", "( x -- y )", "( x w -- y )", "MATMUL", "\n", "4 EXTENT: #M", "TENSOR: A ( #M #M )", "TENSOR: O ( #M #M )", "ITENSOR: I ( #M #M )", "A[I[m] k]"]


@settings(max_examples=2000, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(VOCAB), min_size=0, max_size=40))
def test_token_soups_parse_or_fail_cleanly(tokens):
    check_one(" ".join(tokens).encode("utf-8"))
