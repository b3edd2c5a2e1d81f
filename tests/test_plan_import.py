"""`habu plans import` trusts nothing in the file: a schema first, then every plan proven again,
then one transaction; a malformed file is one `error:` line and exit status 1, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, replace

import pytest

from habu.db import Key, PlanDB, Record, Target, Versions
from habu.search.space import default_plan
from habu.spec.parser import load_program
from habu.target import TARGETS
from habu.version import __version__
from tests.conftest import ROOT

GGEMM = ROOT / "examples" / "ggemm.habu"


def habu_import(path, db, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "habu", "plans", "import", str(path), "--db", str(db), *extra],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


def ggemm_entry(sizes: dict[str, int], wide_offsets: bool = True, certificate: dict | None = None):
    """A key and a record for GGEMM's default plan at `sizes` (offsets forced to 32 bits when not
    `wide_offsets`), with a certificate that claims it (bound to it, and passed)."""
    model = load_program(GGEMM).models["GGEMM"].with_sizes(sizes)
    plan = default_plan(model, TARGETS["sm_90a"], sizes)
    if not wide_offsets:
        plan = replace(plan, kernels=tuple(replace(k, index_width=32) if hasattr(k, "index_width") else k
                                           for k in plan.kernels))
    key = Key(model.canonical_hash(), model.name, tuple((e.name, e.size) for e in model.extents),
              tuple((t.name, t.dtype.name if t.dtype else "f32") for t in (*model.inputs, *model.outputs)),
              Target("sm_90a", "NVIDIA H200", 132), Versions(__version__, "nvrtc 13.5", "580.00"))
    cert = {"passed": True, "prime": 2147483647, "trials": 1, "seeds": [1], "plan_key": plan.key,
            "model_hash": model.canonical_hash(), "habu_version": __version__} | (certificate or {})
    record = Record(0, plan.to_json(), "measured", median_us=100.0, p20_us=99.0, p80_us=101.0,
                    samples_us=[100.0], predicted_us=90.0, certificate=cert, provenance={})
    return key, [record]


def export_file(path, entries) -> None:
    path.write_text(json.dumps({"habu_plans": 1, "exported": 0.0, "entries": [
        {"key": asdict(k), "created": 0.0, "updated": 0.0, "records": [asdict(r) for r in records], "failures": []}
        for k, records in entries]}))


def nothing_in(db) -> bool:
    with PlanDB(db) as plans:
        return plans.entries() == []


def test_regression_import_of_a_ggemm_plan_with_32_bit_offsets_at_600000_rows_is_refused(tmp_path):
    """habu verify rejects this plan (A[IX[m], k] at m = 600000 needs 64-bit offsets); plans
    import stored it, and habu.load compiled it."""
    export = tmp_path / "team.json"
    export_file(export, [ggemm_entry({"M": 600000, "N": 512, "K": 4096}, wide_offsets=False)])
    db = tmp_path / "plans.sqlite"
    r = habu_import(export, db, "--source", str(GGEMM))
    assert r.returncode == 1, r.stdout
    first = r.stderr.splitlines()[0]
    assert first.startswith("habu: error:") and "rule int32-offsets in kernel" in first
    assert "Traceback" not in r.stderr
    assert nothing_in(db)


def test_an_import_with_a_certificate_of_another_plan_is_refused(tmp_path):
    export = tmp_path / "team.json"
    export_file(export, [ggemm_entry({"M": 512, "N": 512, "K": 256}, certificate={"plan_key": "0" * 16})])
    db = tmp_path / "plans.sqlite"
    r = habu_import(export, db, "--source", str(GGEMM))
    assert r.returncode == 1 and "certificate" in r.stderr and "proves nothing about this plan" in r.stderr
    assert nothing_in(db)


def test_an_import_whose_model_no_source_defines_is_refused(tmp_path):
    export = tmp_path / "team.json"
    export_file(export, [ggemm_entry({"M": 512, "N": 512, "K": 256})])
    db = tmp_path / "plans.sqlite"
    r = habu_import(export, db)
    assert r.returncode == 1 and "give the file with --source" in r.stderr
    r = habu_import(export, db, "--source", str(ROOT / "examples" / "rmsnorm.habu"))
    assert r.returncode == 1 and "no .habu file defines its model" in r.stderr
    assert nothing_in(db)
    r = habu_import(export, db, "--source", str(GGEMM))
    assert r.returncode == 0 and "imported 1" in r.stdout, r.stderr


def _valid() -> dict:
    key = {"model_hash": "a" * 64, "model": "G", "shape": [["M", 64]], "dtypes": [["A", "bf16"]],
           "target": {"arch": "sm_90a", "gpu": "NVIDIA H200", "sm_count": 132},
           "versions": {"habu": __version__, "nvrtc": "nvrtc 13.5", "driver": "580"}}
    record = asdict(Record(0, {"format": 1}, "measured", median_us=1.0))
    return {"habu_plans": 1, "exported": 0.0,
            "entries": [{"key": key, "created": 0.0, "updated": 0.0, "records": [record], "failures": []}]}


def _with(edit) -> bytes:
    data = _valid()
    edit(data)
    return json.dumps(data).encode()


def _record(data) -> dict:
    return data["entries"][0]["records"][0]


MALFORMED = {
    "only the format field": (b'{"habu_plans":1}', "'exported' is a required property"),
    "another format": (_with(lambda d: d.update(habu_plans=2)), "another format"),
    "a record without its status": (_with(lambda d: _record(d).pop("status")), "'status' is a required property"),
    "an extra field in an entry": (_with(lambda d: d["entries"][0].update(extra=1)), "entries[0]"),
    "an extra field at the top": (_with(lambda d: d.update(note="hi")), "Additional properties"),
    "not UTF-8": (b'{"habu_plans": 1, "note": "\xff\xfe\xfa"}', "is not UTF-8"),
    "UTF-16 with a BOM": (json.dumps(_valid()).encode("utf-16"), "byte-order mark"),
    "UTF-16 without a BOM": (json.dumps(_valid()).encode("utf-16-le"), "is not a Habu plan export"),
    "deeply nested JSON": (b"[" * 200_000 + b"]" * 200_000, "nested too deeply"),
    "a 5,000-digit number": (b'{"habu_plans": 1, "exported": ' + b"9" * 5000 + b', "entries": []}', "digits"),
    "an infinite number": (b'{"habu_plans": 1, "exported": 1e999, "entries": []}', "too large"),
    "NaN": (_with(lambda d: _record(d).update(median_us=float("nan"))), "not a JSON number"),
    '"plan": "x"': (_with(lambda d: _record(d).update(plan="x")), "records[0].plan: 'x' is not of type 'object'"),
    "median_us: -5": (_with(lambda d: _record(d).update(median_us=-5)), "median_us: -5 is less than the minimum of 0"),
    "a shape of the wrong form": (_with(lambda d: d["entries"][0]["key"].update(shape=[["M"]])), "key.shape[0]"),
    "a JSON list": (b"[]", "a JSON list, not an object"),
    "a directory": (None, "is a directory"),
}


@pytest.mark.parametrize("case", list(MALFORMED), ids=list(MALFORMED))
def test_a_malformed_export_is_one_error_line_and_nothing_is_imported(tmp_path, case):
    content, expected = MALFORMED[case]
    path = tmp_path / "export.json"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    db = tmp_path / "plans.sqlite"
    r = habu_import(path, db, "--source", str(GGEMM))
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("habu: error:") and expected in lines[0], r.stderr
    assert nothing_in(db)
