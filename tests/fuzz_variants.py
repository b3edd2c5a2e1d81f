"""The variant fuzz, by hand (too long for CI): random models or products (tests/random_models.py), forward and
derived backward; the default plan and `--per` sampled variants of it (`enumerate_plans`) through the rules and
one finite-field trial, each under a deadline. One line per finding: WRONG (a plan that keeps to every rule and
computes something else), CRASH (an exception that is not a user-facing HabuError), MEMORY, SLOW (past the
deadline: abandoned, as the search would). Sessions 55–61 ran it over models 9560–19999 (after session 60's hoist
of loop invariants changed the derived backwards: 14600–14999 and 16700–17499, then with the nodes shared across
the gradients 16300–16699 and 17500–18199; session 61's `reuse_later_nodes` and epilogue pair loads: 18200–19999,
where 18703 and 18891 were WRONG, tests/spec/test_grad_hoist_invariants.py), products 200–1322, shared products
(one tensor as both operands) 0–699 and batched products 0–583; session 62's factored backwards (habu/spec/
grad_factor.py: 357 of models 0–2999 derive another backward, every one of 0–5999 passes the adjoint check)
over models 0–14499 (4 variants a model; 9750's forward SLOW at a 20 s deadline), where 520 was a CRASH (tests/plan/test_rows_in_other_rows.py) and 8322 WRONG: right plans
refused by the field check, also at 595bc51 (tests/prove/test_witness_blocks.py);
each WRONG, CRASH or MEMORY finding is a regression test. The SLOW ones, derived backwards of a max that
recomputed the max inside their sums (models 14672, 14893, 14935, 15548, 16307), run in seconds since session 60
hoisted loop invariants (tests/spec/test_grad_hoist_invariants.py); that change's new plans gave model 16771's
CRASH (tests/plan/test_rows_in_other_rows.py).

Session 63 added the plans of the model after a default's rewrites (`candidates`: the fuzz had never reached a
`split:`, `epilogue:` or `nest:` plan) and masked products (a condition on the output's indices in a contraction's
epilogue, `random_masked_product`); it ran masked products 0–78 and models 0–14999 that way (4 variants a model and
the first rewritten plan; 9750 SLOW as before), where masked 30 was WRONG: a right plan refused, the column family offered a sum under a
condition (tests/plan/test_column_reduction.py).

Session 64 added masked row reductions and softmaxes (`random_masked_rows`: row kernels compute conditions since
then) and ran rows 0–399, masked products 79–96 and models 0–9699 (0–1202 before habu/spec/grad_cover.py, the rest
after), no finding.

Session 67 ran the default plans of masked products 300–2413, models 7000–9999, masked rows 300–999
and products 300–899 (forward and backward, `habu compile`'s path, as tests/test_random_models.py's `_compile`) after
session 66's k windows (`skip_zero`): 313's backward was refused by the `k-window`
rule (a staged operand's name not looked up as the model's tensor) and 349's and 510's by the field check (a
column sum beside zero tiles combined per group of blocks), both right plans: tests/lower/test_k_bounds.py. This
tool's enumeration of a masked backward's plans (10^6 and more since `skip_zero` doubled each product's) is now cut
at CANDIDATES; it then ran masked products 0–299 with 6 variants each, no finding.

Session 68 ran the default plans (`habu compile`'s path, forward and backward) of batched products 0–1199, shared
products 300–699, products 900–1299, masked rows 1000–1399, models 10000– and a new generator, attention in any dims'
order (`random_attention`), and this tool over batched products 0–150 (6 variants each). The defaults of 46 batched
seeds in 0–299 broke their own rules (an operand's innermost index a batch axis: read by TMA as m-major, or in
vectors along it), and attention 12 and 52's (a batch axis of extent 1 staged; a skinny product over one was
transposed and split, refused by its proof): this tool does not look for a default refused by its own rules (only
tests/test_random_models.py's `_compile` does). Fixed, tests/lower/test_batched.py.

Session 72 ran the default plans (`_compile`'s path, forward and backward) of attention 7200–8290 (and 8400–8460
over a runtime #I and #J), masked products 7300–7700, layers 7140–7400, models, masked rows, batched and plain
products 7200–7280, batched products 7300–7500 over a runtime #S, #K, #M or #N and products 7300–7500 over a
runtime #M, #N or #K. Attention 7220, 7221 and 7227's backwards crashed the field check (an IndexError: two kernels
staged K in two layouts into one buffer `@K`; tests/lower/test_stage_names.py) and 7311's was refused, a right plan
(the check summed a windowed product's skipped terms at rows no earlier kernel had computed;
tests/lower/test_k_bounds.py).

Session 73 ran the default plans of attention 8500–9599, layers 7400–7699, masked rows 1400–1799, batched products
7500–7699 over a runtime #S, #K, #M or #N and products 7500–7750 over a runtime #M, #N or #K, and this tool over
attention 100–121 (4 variants each): no finding but SLOW general kernels for O (attention 100, 103, 105, …: one
general kernel recomputing the softmax's statistics for every key, O(J²·E) an element).

    PYTHONPATH=. python tests/fuzz_variants.py model 13000 13400 --per 8
    PYTHONPATH=. python tests/fuzz_variants.py shared 0 200 --per 8   # one tensor as both operands
    PYTHONPATH=. python tests/fuzz_variants.py batched 0 200 --per 8  # a batch over m's or n's extent
    PYTHONPATH=. python tests/fuzz_variants.py masked 0 200 --per 6   # a mask in the product's epilogue
    PYTHONPATH=. python tests/fuzz_variants.py rows 0 200 --per 6     # a mask in a row reduction or softmax
    PYTHONPATH=. python tests/fuzz_variants.py attention 0 100 --per 6  # attention in any dims' order, masks, GQA
    PYTHONPATH=. python tests/fuzz_variants.py layer 0 100 --per 6    # a small layer of several equations
"""

from __future__ import annotations

import argparse
import random
import time
import traceback
from dataclasses import replace
from itertools import islice

from habu.cli_grad import backward_program
from habu.errors import HabuError
from habu.plan.rewrite import apply_rewrites, default_rewrites
from habu.prove.deadline import DeadlinePassed, proof_deadline
from habu.prove.rules import failures, obligations
from habu.prove.verify import verify_plan
from habu.search.space import enumerate_plans, make_plan
from habu.spec.parser import parse_text
from habu.target import target_named
from tests.random_models import (
    random_attention,
    random_batched_product,
    random_layer,
    random_masked_product,
    random_masked_rows,
    random_model,
    random_product,
    random_shared_product,
)

CANDIDATES = 20_000  # the first variants of the rewritten model (a product's region alone has 10^5 or more)


def candidates(model, target) -> list:
    """The variants of the model as written, then (since session 63) those of the model after the rewrites a
    default plan takes (`split:T`, `epilogue:P`, `nest:T`, ...): before, the fuzz never reached a rewritten
    plan."""
    plans = list(islice(enumerate_plans(model, target, {}), CANDIDATES))  # (a backward's space: 10^6 and more)
    rewrites = default_rewrites(model)
    if rewrites:
        graph = apply_rewrites(model, rewrites)
        first = make_plan(model, target, (), {}, rewrites)  # (the model's name and hash, made once)
        plans += [replace(p, model=first.model, model_hash=first.model_hash, rewrites=rewrites)
                  for p in islice(enumerate_plans(graph, target, {}), CANDIDATES)]
    return plans


def fuzz_one(text: str, tag: str, per: int, seed: int, deadline_s: float, target) -> None:
    try:
        program = parse_text(text, "fuzz.habu")
    except HabuError:
        return
    for backward in (False, True):
        where = f"{tag} {'bwd' if backward else 'fwd'}"
        try:
            prog, name = backward_program(program, "FZ", None, "auto") if backward else (program, "FZ")
            model = prog.models[name]
            plans = candidates(model, target)
        except HabuError:
            continue
        except Exception as err:
            print(f"CRASH-ENUM {where}: {type(err).__name__}: {err}", flush=True)
            continue
        rng = random.Random(seed * 2 + backward)
        first_rewritten = next((i for i, p in enumerate(plans) if p.rewrites), 0)
        for i in dict.fromkeys([0, first_rewritten, *rng.sample(range(1, len(plans)), min(per, len(plans) - 1))]):
            plan = plans[i]
            try:
                if failures(obligations(model, plan)):
                    continue
                with proof_deadline(time.time() + deadline_s):
                    cert = verify_plan(model, plan, None, 1)
                if not cert.passed:
                    print(f"WRONG {where} plan {i}: {cert.failure} :: {plan.kernels}", flush=True)
            except DeadlinePassed:
                print(f"SLOW {where} plan {i}: {plan.kernels}", flush=True)
            except HabuError as err:
                first = str(err).splitlines()[0]
                if "computes something else" in first or "breaks rule" in first:
                    print(f"WRONG-ERR {where} plan {i}: {first}", flush=True)
            except MemoryError as err:
                print(f"MEMORY {where} plan {i}: {err}", flush=True)
            except Exception as err:
                print(f"CRASH {where} plan {i}: {type(err).__name__}: {err} :: {plan.kernels}", flush=True)
                traceback.print_exc(limit=3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=("model", "product", "shared", "batched", "masked", "rows", "attention", "layer"))
    ap.add_argument("first", type=int)
    ap.add_argument("end", type=int)
    ap.add_argument("--per", type=int, default=6, help="sampled variants a model, besides the default")
    ap.add_argument("--deadline", type=float, default=30.0, help="seconds a plan's field check may take")
    args = ap.parse_args()
    generate = {"model": random_model, "product": random_product, "shared": random_shared_product,
                "batched": random_batched_product, "masked": random_masked_product,
                "rows": random_masked_rows, "attention": random_attention, "layer": random_layer}[args.kind]
    target = target_named("sm_90a")
    for seed in range(args.first, args.end):
        fuzz_one(generate(seed), f"{args.kind} {seed}", args.per, seed, args.deadline, target)
        print(f"done {args.kind} {seed}", flush=True)


if __name__ == "__main__":
    main()
