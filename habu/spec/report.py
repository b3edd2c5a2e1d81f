"""What `habu check` prints: each model's extents, dataflow record and shape obligations."""

from __future__ import annotations

from habu.spec.equation import format_equation, format_index
from habu.spec.ir import Gather, IndexVar, Load, Model, TensorDecl, loads
from habu.spec.program import Program


def tensor_signature(t: TensorDecl) -> str:
    shape = " ".join(f"#{e}" for e in t.extents)
    if t.is_index:
        text = f"{t.name} ( {shape} -> #{t.range} ) {t.dtype}".replace("(  ->", "( ->")
        return text + " grouped" if t.grouped else text
    dtype = f" {t.dtype}" if t.dtype else ""
    return f"{t.name} ( {shape} ){dtype}".replace("(  )", "( )")


def access_note(ld: Load) -> str:
    notes = []
    for pos, ix in enumerate(ld.indices):
        if isinstance(ix, Gather):
            inner = " ".join(format_index(i) for i in ix.indices)
            notes.append(f"index {pos + 1} gathered through {ix.tensor}[{inner}]")
        elif not isinstance(ix, IndexVar):
            notes.append(f"index {pos + 1} fixed at {format_index(ix)} (broadcast)")
    return "; ".join(notes)


def dataflow_lines(model: Model) -> list[str]:
    lines: list[str] = []
    for eq in model.nodes:
        store = eq.store_indices
        target = f"{eq.target}[{' '.join(format_index(i) for i in store)}]" if store else eq.target
        seen: list[str] = []
        reads: list[str] = []
        for ld in loads(eq.rhs):
            text = f"{ld.tensor}[{' '.join(format_index(i) for i in ld.indices)}]" if ld.indices else ld.tensor
            if text in seen:
                continue
            seen.append(text)
            note = access_note(ld)
            reads.append(text + (f"   ({note})" if note else ""))
        pad = " " * (len(target) + 4)
        lines.append(f"{target} <- {reads[0] if reads else '(constants only)'}")
        lines.extend(pad + r for r in reads[1:])
    return lines


def describe_model(model: Model) -> str:
    out: list[str] = []
    form = "equation" if model.form == "equation" else "composition"
    out.append(f"MODEL {model.name}   ({form} form, canonical hash {model.canonical_hash()[:16]})")
    out.append("  extents      " + "   ".join(e.describe() for e in model.extents))
    out.append("  reads        " + "   ".join(tensor_signature(t) for t in model.inputs))
    out.append("  writes       " + "   ".join(tensor_signature(t) for t in model.outputs))
    if model.words:
        out.append("  words        " + " ".join(model.words))
    out.append("  equations")
    for eq in model.nodes:
        out.append("    " + format_equation(eq))
    out.append("  dataflow")
    for line in dataflow_lines(model):
        out.append("    " + line)
    out.append("  obligations")
    if model.obligations:
        for ob in model.obligations:
            out.append("    " + ob.text)
    else:
        out.append("    none")
    return "\n".join(out)


def describe_program(program: Program) -> str:
    out: list[str] = []
    if program.tensors:
        out.append("tensors and their words")
        for name, dt in program.tensors.items():
            words = [program.words[w] for w in (name + "@", name + "!") if w in program.words]
            effects = "   ".join(f"{w.name} {w.effect_text()}" for w in words)
            out.append(f"  {tensor_signature(dt.decl):<32} {effects}")
        out.append("")
    for m in program.models.values():
        out.append(describe_model(m))
        out.append("")
    if not program.models:
        out.append("no models: add one with MODEL:")
    return "\n".join(out).rstrip() + "\n"
