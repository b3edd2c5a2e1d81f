"""The budgeted search: generate, prune by rules, verify over GF(p), order by the cost model, compile,
golden-check and time, keep the best — anytime.

Each fusion region is a separate kernel launch, so the regions are tuned one at a time, in the order of their
predicted share of the run time, each with its share of the budget. Within a region, candidates go cheapest-first by
the cost model; each passes the z3 rules, the finite-field check, then (with a GPU) the golden check in the timing
worker, before its time counts. Every new best plan is written to the database at once: Ctrl-C, the end of the
budget or a kill leaves the best verified plan so far saved. Without a GPU, candidates are ranked by the cost model
("unmeasured"), and one that would replace the best is compiled first: ptxas's spills or serialized wgmma refuse it.
"""
from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from habu.db import Key, PlanDB, Record, provenance
from habu.lower import ContractionLowering, lower_plan
from habu.lower.contraction import with_kernel
from habu.paths import family_kernel
from habu.plan.limits import check_nesting
from habu.plan.partitions import partitions
from habu.plan.patterns import Region
from habu.plan.plan import ContractionKernel, Kernel, Plan
from habu.plan.rewrite import apply_rewrites, rewrite_sets
from habu.search.budget import Budget, Scored, SearchResult, Stats, predicted_better
from habu.search.cost import KernelCost, kernel_cost, roofline_seconds, tie_break
from habu.search.interrupt import latched_interrupts, raise_if_interrupted
from habu.search.lanes import lane_certificate, lane_twins
from habu.search.pool import Executor, ExecutorLostInterrupt, InlineExecutor, Pending, lost_cause
from habu.search.prune import QuickPruner
from habu.search.seed import search_seed
from habu.search.space import concrete_sizes, default_kernels, make_plan, region_space, relower
from habu.search.tasks import Job, compiles_here
from habu.spec.ir import Model
from habu.target import Target

IN_FLIGHT = 3  # batches being proven at once under a time budget (the one being timed included)

@dataclass
class _Sent:
    """A batch whose proofs are running: the candidates, their plans, which were sent (the rest failed the cheap
    rules here) and the executor's handle."""

    batch: list
    plans: list[Plan]
    where: list[int]
    pending: Pending | None


class Search:
    def __init__(self, path: str, model: Model, target: Target, sizes: dict[str, int], db: PlanDB,
                 budget: Budget, timer=None, top_k: int = 5, seed: int = 0,
                 progress: Callable[[Stats], None] | None = None, executor: Executor | None = None,
                 ranges: tuple[tuple[str, int, int], ...] = ()):
        """`ranges`: a size bucket's (habu/plan/buckets.py): its extents stay runtime extents in every plan
        (proven for lo..hi, the plan's `ranges`), `sizes` giving the size they are costed and timed at."""
        check_nesting(model)  # before any plan: what the backend cannot build is refused, not crashed on
        self.path, self.model, self.target, self.db = path, model, target, db
        self.executor: Executor = executor or InlineExecutor()
        self.sequence = 0  # candidates sent to be proven: each gets seed + its number
        self.taken = self.survived = 0  # candidates batched, and those proven (to size the batches)
        self.sizes = concrete_sizes(model, sizes)
        self.ranges = tuple(ranges)
        # the model is bound to one shape: every extent is fixed, but for a size bucket's extents
        self.fixed = {k: v for k, v in self.sizes.items() if k not in {r[0] for r in self.ranges}}
        self.pruner = QuickPruner(model, self.fixed)
        self.rewrites: tuple[str, ...] = ()  # the rewrites of the chosen kernel graph
        self.graph = model  # the model after them: what the kernels compute
        self.budget, self.timer, self.top_k, self.seed = budget, timer, top_k, seed
        # no GPU to time a plan: a candidate that would become the best is compiled to read ptxas's report
        self.clean_compiles = timer is None and compiles_here(target.name)
        self.trying_default = True  # the first plan, sent before any other
        self.progress = progress or (lambda s: None)
        self.stats = Stats()
        self.timeline: list[dict] = []
        self.gpu = timer.info if timer is not None else None
        self.key = self._key()
        self.job = Job.of(path, model, self.fixed, target.name)
        self.measured: dict[str, dict] = {}  # plan key -> its measurement (never time a plan twice)
        self.certificates: dict[str, dict] = {}  # plan key -> certificate, for the plans verified in this run
        self.stored_best: Plan | None = None  # the best plan _store last wrote
        self.lost: str | None = None  # the executor's or timer's machines are gone: nothing more is sent there
        # when a proof still running is abandoned: the end of a time budget (time.time() seconds,
        # which worker processes and Ray tasks on other machines read alike); None: never
        self.deadline: float | None = None if budget.seconds is None else time.time() + budget.seconds

    def _plan(self, kernels: tuple[Kernel, ...], rewrites: tuple[str, ...] = ()) -> Plan:
        """A candidate of this search: its shape the fixed extents, its ranges the bucket's."""
        plan = make_plan(self.model, self.target, tuple(kernels), self.fixed, rewrites)
        return replace(plan, ranges=self.ranges) if self.ranges else plan

    # -- keys
    def _key(self) -> Key:
        from habu.search.keys import database_key
        from habu.spec.grad_program import direction

        return database_key(self.model, self.sizes, self.target, self.gpu, direction=direction(self.model),
                            ranges=self.ranges)

    # -- budget
    def _left(self) -> bool:
        raise_if_interrupted()
        if self.budget.seconds is not None and self.stats.elapsed >= self.budget.seconds:
            return False
        verified = self.stats.verified + self.stats.pruned_field
        return not (self.budget.trials is not None and verified >= self.budget.trials)

    # -- candidates, a batch at a time
    def _batch_size(self) -> int:
        """How many candidates go out at once: enough to keep every worker busy, never more than
        the trials budget has left (so every executor checks exactly the same candidates)."""
        n = max(1, self.executor.parallelism)
        if self.timer is not None and self.executor.concurrent and self.budget.trials is None:
            # most fail the rules in the workers: enough that ~4 proven plans a GPU come back a batch (GPUs never idle)
            gpus = max(1, int(getattr(self.timer, "width", 1)))
            survive = (self.survived + 1) / (self.taken + 1)
            n = max(n, min(16 * n, math.ceil(4 * gpus / survive)))
        if self.budget.trials is not None:
            n = min(n, self.budget.trials - self.stats.verified - self.stats.pruned_field)
        return max(1, n)

    def _try_batch(self, batch: list[tuple[tuple[Kernel, ...], int, Scored]]) -> list[bool]:
        """Prove a batch of candidates (in the executor: in parallel, perhaps on other machines)
        and, with a GPU, time the proven ones (in parallel on the timer's GPUs). The results are
        applied in the batch's order, whichever finished first. True for each candidate kept."""
        return self._receive(self._send(batch))

    def _send(self, batch: list[tuple[tuple[Kernel, ...], int, Scored]]) -> _Sent:
        """Apply the cheap rules here and send the rest to be proven (not waiting for them)."""
        began = time.monotonic()
        plans = [self._plan(kernels, sc.rewrites) for kernels, _, sc in batch]
        self.taken += len(batch)
        compile_kernels = self.timer is not None and self.executor.parallelism > 1
        items, where = [], []
        for j, (plan, (_, region, _)) in enumerate(zip(plans, batch, strict=True)):
            only = None if region < 0 else {region}  # the other kernels were proven already
            if self.pruner.reject(plan, only) is not None:
                self.stats.pruned_rules += 1
                continue
            clean_only = self._clean_only(region, batch[j][2])
            self.sequence += 1
            items.append((plan.to_json(), self.seed + self.sequence, None if only is None else tuple(only),
                          compile_kernels, self.deadline, clean_only))
            where.append(j)
        sent = _Sent(batch, plans, where, self.executor.submit(self.job, items) if items else None)
        self.stats.add("driver send", time.monotonic() - began)
        return sent

    def _receive(self, sent: _Sent) -> list[bool]:
        """Wait for a sent batch's proofs, time the proven plans, and keep the results."""
        kept, to_time = self._proven(sent)
        began = time.monotonic()
        measured = self._measure([(sent.plans[j].to_json(), c) for j, c in to_time])
        self.stats.add("driver waits for GPUs", time.monotonic() - began if to_time else None)
        for (j, _), m in zip(to_time, measured, strict=True):
            kept[j] = self._timed(sent.plans[j], sent.batch[j][1], sent.batch[j][2], m)
        return kept

    def _proven(self, sent: _Sent) -> tuple[list[bool], list[tuple[int, list | None]]]:
        """Wait for a sent batch's proofs and record them: which candidates are kept as they are
        (no GPU), and which (with their cubins) are to be timed."""
        batch, plans, where = sent.batch, sent.plans, sent.where
        kept = [False] * len(batch)
        began = time.monotonic()
        results = sent.pending.result() if sent.pending is not None else []
        raise_if_interrupted()  # nothing proven after a Ctrl-C is kept
        self.stats.add("driver waits for proofs", time.monotonic() - began)
        to_time: list[tuple[int, list | None]] = []
        for j, res in zip(where, results, strict=True):
            plan, (_, _, scored) = plans[j], batch[j]
            status = res["status"]
            for step, seconds in (res.get("seconds") or {}).items():
                self.stats.add(f"proof {step}", seconds)
            if "field_shared" in res:
                self.stats.field_shared += bool(res["field_shared"])
                self.stats.field_checks += not res["field_shared"]
            if status == "rules":
                self.stats.pruned_rules += 1
                continue
            if status == "slow":  # proven, and slow by ptxas's report: not stored in place of the best
                self.stats.refused_slow += 1
                self.stats.last_slow = res["reason"]
                continue
            if status == "abandoned":  # the budget ended during its proof: neither kept nor a failure
                self.stats.abandoned += 1
                continue
            if status == "field":
                self.stats.pruned_field += 1
                self.db.record_failure(self.key, plan.to_json(), res["reason"])
                continue
            if status == "lost":
                self.stats.failed += 1
                self.db.record_failure(self.key, plan.to_json(), res["reason"])
                continue
            self.stats.verified += 1
            self.survived += 1
            if self.stats.first_verified_s is None:
                self.stats.first_verified_s = self.stats.elapsed
            scored.certificate = res.get("certificate")
            if status == "compile":
                self.stats.failed += 1
                self.db.record_failure(self.key, plan.to_json(), res["reason"])
                continue
            if scored.certificate is not None:  # proven: the only plans _store writes
                self.certificates[plan.key] = scored.certificate
            if self.timer is None:
                kept[j] = True
                continue
            to_time.append((j, res.get("cubins")))
        return kept, to_time

    def _timed(self, plan: Plan, region: int, scored: Scored, m) -> bool:
        """Record a plan's measurement; True when it counts (golden-checked and timed)."""
        self.stats.compiled += 1
        for step, seconds in (m.seconds or {}).items():
            self.stats.add(f"gpu {step}", seconds)
        if not m.ok:
            self.stats.failed += 1
            self.db.record_failure(self.key, plan.to_json(), m.reason)
            return False
        self.stats.timed += 1
        scored.measured_us = m.median_us
        scored.measurement = {"median_us": m.median_us, "p20_us": m.p20_us, "p80_us": m.p80_us,
                              "samples_us": m.samples_us, "golden": m.golden}
        self.measured[plan.key] = scored.measurement
        costs = [kernel_cost(lw, self.sizes, self.target) for lw in lower_plan(self.model, plan)]
        self.timeline.append({"t": round(self.stats.elapsed, 3), "region": region, "kernel": scored.kernel,
                              "plan": plan.to_json(), "predicted_us": scored.predicted_s * 1e6,
                              "median_us": m.median_us, "p20_us": m.p20_us, "p80_us": m.p80_us,
                              "flops": sum(c.flops for c in costs), "bytes": sum(c.bytes for c in costs)})
        return True

    def _measure(self, plans: list[tuple[dict, list | None]]) -> list:
        """Time plans on the timer's GPUs (all at once when it has several), in order."""
        if not plans:
            return []
        if hasattr(self.timer, "measure_many"):
            return self.timer.measure_many(plans)
        return [self.timer.measure(p) if c is None else self.timer.measure(p, cubins=c) for p, c in plans]

    def _try(self, kernels: tuple[Kernel, ...], region: int, scored: Scored) -> bool:
        """One candidate (the default plan)."""
        return self._try_batch([(kernels, region, scored)])[0]

    # -- the whole search
    def run(self) -> SearchResult:
        seed = search_seed(self.model, self.target, self.sizes)  # habu compile's plan: never start below it
        self.rewrites, self.graph, regions, best = seed.rewrites, seed.graph, seed.regions, list(seed.kernels)
        base_costs = self._costs(best)
        self.stats.roofline_us = roofline_seconds(base_costs, self.target) * 1e6
        self.stats.best_predicted_us = sum(c.seconds for c in base_costs) * 1e6
        ranked: list[list[Scored]] = [[] for _ in regions]
        self.best_score: list[float] = [c.seconds for c in base_costs]
        self.best_tie: dict[int, tuple[float, ...]] = {}  # without a GPU: region i's best's finer terms
        interrupted = False
        with latched_interrupts():  # a Ctrl-C a finalizer swallows is raised again (habu/search/interrupt.py)
            try:
                self._time_baseline()
                # the default plan first: a verified answer as early as possible
                first = Scored(best[0], sum(c.seconds for c in base_costs), rewrites=self.rewrites)
                kept = self._try(tuple(best), -1, first)
                self.trying_default = False
                if kept:
                    if first.measured_us is not None:
                        self.best_score = [first.measured_us] * len(regions)
                    self._save(best, ranked)
                # then the other partitions into kernels (the fusion choice), at their default schedules
                chosen = self._choose_partition(regions, best, first)
                if chosen is not None:
                    (self.rewrites, regions), best, score = chosen
                    self.graph = apply_rewrites(self.model, self.rewrites)
                    ranked = [[] for _ in regions]
                    base_costs = self._costs(best)
                    self.best_score = [score] * len(regions) if self.timer is not None else \
                        [c.seconds for c in base_costs]
                    self._save(best, ranked)
                order = sorted(range(len(regions)), key=lambda i: -base_costs[i].seconds)
                total = sum(c.seconds for c in base_costs) or 1.0
                for i in order:
                    if not self._left():
                        break
                    share = base_costs[i].seconds / total
                    deadline = None
                    if self.budget.seconds is not None:
                        deadline = time.monotonic() + share * max(0.0, self.budget.seconds - self.stats.elapsed)
                    self._tune_region(i, regions[i], best, ranked, deadline)
            except KeyboardInterrupt:  # Ctrl-C: keep what was verified, and say so (the CLI exits 130)
                interrupted = True
            except ExecutorLostInterrupt as gone:  # the cluster watch found the cluster gone mid-costing
                self.lost = gone.message
            except Exception as exc:  # the cluster is gone (perhaps wrapped by Ray): keep what was verified, say why
                gone = lost_cause(exc)
                if gone is None:
                    raise
                self.lost = gone.message
            finally:
                if self.lost is None:  # a lost cluster's actors and tasks cannot be closed (nor waited for)
                    if self.timer is not None:
                        self.timer.close()
                    self.executor.close()
        records = self._save(best, ranked)
        return SearchResult(self.stored_best, records, self.stats, self.key, self.timer is not None, self.timeline,
                            interrupted, self.lost)

    def _time_baseline(self) -> None:
        """Time what an expert would call instead (when the model has one), in this run."""
        if self.timer is None or not hasattr(self.timer, "baseline"):
            return
        found = self.timer.baseline()
        if found is None:
            self.stats.baseline_failure = "the timing worker did not answer"
        elif found[1].ok:
            self.stats.baseline, self.stats.baseline_us = found[0], found[1].median_us
        elif found[1].reason:
            self.stats.baseline_failure = f"{found[0]}: {found[1].reason}"

    def _baseline_note(self) -> dict:
        if self.stats.baseline_us is None:
            return {}
        return {"baseline": self.stats.baseline, "baseline_us": self.stats.baseline_us}

    def _costs(self, kernels: list[Kernel], rewrites: tuple[str, ...] | None = None) -> list[KernelCost]:
        rewrites = self.rewrites if rewrites is None else rewrites
        plan = self._plan(tuple(kernels), rewrites)
        return [kernel_cost(lw, self.sizes, self.target) for lw in lower_plan(self.model, plan)]

    def _choose_partition(self, regions: tuple[Region, ...], best: list[Kernel], first: Scored
                          ) -> tuple[tuple[tuple[str, ...], tuple[Region, ...]], list[Kernel], float] | None:
        """Try the other fusion partitions (cheapest predicted first), each at its default schedule:
        measured with a GPU, else by the cost model, where only a predicted gain is proven. A
        partition must pass the rules and the finite-field check like any candidate. At most a
        fifth of a time budget goes here. Returns the better partition, or None to keep the greedy one."""
        graphs = {rw: apply_rewrites(self.model, rw) for rw in rewrite_sets(self.model)}
        others = [(rw, p) for rw, graph in graphs.items() for p in partitions(graph)]
        deadline = None if self.budget.seconds is None else time.monotonic() + self.budget.seconds / 5
        current = first.measured_us if self.timer is not None else first.predicted_s
        if current is None:
            current = float("inf")
        candidates = []
        for rw, p in others:
            try:
                defaults = list(default_kernels(graphs[rw], self.target, self.sizes, p))
            except Exception:  # a partition no kernel family lowers: not a candidate
                continue
            # and the partition with the fused attention kernel where it takes a region (not a default yet)
            fused = [family_kernel(graphs[rw], r, "attention", self.target, self.sizes) or k
                     for r, k in zip(p, defaults, strict=True)]
            options = [defaults, fused] if fused != defaults else [defaults]
            if not rw and p == regions:
                options = options[1:]  # the current partition at its defaults: the plan tried first
            for kernels in options:
                try:
                    predicted = sum(c.seconds for c in self._costs(kernels, rw))
                except Exception:
                    continue
                self.stats.generated += 1
                candidates.append((predicted, (rw, p), kernels))
        candidates.sort(key=lambda c: c[0])
        if self.timer is None:  # ranked by the cost model: only a predicted gain is worth proving
            candidates = [c for c in candidates if c[0] < current]
        chosen = None
        self.stats.region = "fusion partitions"
        while candidates and self._left() and (deadline is None or time.monotonic() <= deadline):
            n = self._batch_size()
            batch, candidates = candidates[:n], candidates[n:]
            scored = [Scored(kernels[0], predicted, rewrites=rw) for predicted, (rw, _), kernels in batch]
            self.stats.partitions += len(batch)
            kept = self._try_batch([(tuple(k), -1, sc) for (_, _, k), sc in zip(batch, scored, strict=True)])
            for (predicted, p, kernels), sc, ok in zip(batch, scored, kept, strict=True):
                score = sc.measured_us if self.timer is not None else predicted
                if ok and score is not None and score < current:
                    current, chosen = score, (p, kernels, score)
            if chosen is not None and self.timer is None:
                break  # the cheapest predicted partition that proves: no later one is predicted faster
            self.progress(self.stats)
        return chosen

    def _tune_region(self, i: int, region: Region, best: list[Kernel], ranked: list[list[Scored]],
                     deadline: float | None) -> None:
        self.stats.region = f"{region.kind} {'+'.join(region.nodes)}"
        plan = self._plan(tuple(best), self.rewrites)
        base_lw = lower_plan(self.model, plan)[i]
        self.best_tie[i] = tie_break(base_lw, self.sizes, self.target)
        oriented = {getattr(base_lw.kernel, "swap_ab", False): base_lw}  # the region lowered per orientation (swap_ab)
        def lowered(k: Kernel):
            if isinstance(base_lw, ContractionLowering) and isinstance(k, ContractionKernel):
                oriented[k.swap_ab] = oriented.get(k.swap_ab) or relower(self.graph, plan, k, base_lw)
                return with_kernel(oriented[k.swap_ab], k, costing=True)
            return relower(self.graph, plan, k, replace(base_lw, kernel=k))

        costed: list[tuple[float, Kernel]] = []
        for k in region_space(self.graph, region, self.target, self.sizes):
            self.stats.generated += 1
            try:
                costed.append((kernel_cost(lowered(k), self.sizes, self.target).seconds, k))
            except Exception:
                continue
        # cheapest predicted first; plans the roofline predicts equal are ordered by the cost model's
        # finer terms (`cost.tie_break`), computed for equal predictions only (a second per 100,000
        # candidates otherwise): without a GPU, a plan replaces an equal one when its terms are better
        costed.sort(key=lambda c: c[0])
        candidates: list[tuple[float, tuple[float, ...], Kernel]] = []
        start = 0
        while start < len(costed):
            end = start
            while end < len(costed) and costed[end][0] == costed[start][0]:
                end += 1
            group = costed[start:end]
            if len(group) > 1 or group[0][0] == self.best_score[i]:
                finer = [tie_break(lowered(k), self.sizes, self.target) for _, k in group]
                candidates += sorted(((c, f, k) for (c, k), f in zip(group, finer, strict=True)),
                                     key=lambda e: e[1])
            else:
                candidates.append((group[0][0], (), group[0][1]))
            start = end
        seen = {best[i]}
        queue = []
        for _cost, _finer, k in candidates:
            if k not in seen:
                seen.add(k)
                queue.append((_cost, _finer, k))

        def in_time() -> bool:
            return self._left() and (deadline is None or time.monotonic() <= deadline)

        at = 0  # the next candidate of the queue to send

        def more() -> bool:
            return at < len(queue) and in_time()

        def send_next() -> tuple[list[tuple[float, tuple[float, ...], Kernel]], list[Scored], _Sent]:
            nonlocal at
            n = self._batch_size()
            batch, at = queue[at:at + n], at + n
            scored = [Scored(k, cost, rewrites=self.rewrites, tie_break=finer) for cost, finer, k in batch]
            kernels = [(*tuple(best[:i]), k, *tuple(best[i + 1:])) for _, _, k in batch]
            return batch, scored, self._send([(ks, i, sc) for ks, sc in zip(kernels, scored, strict=True)])

        # With a time budget and workers of its own, the executor proves the next batches while
        # this one is timed, so the GPUs never wait for proofs: a batch's results come back when
        # its slowest proof does, so several are kept in flight (those still in flight when the
        # time runs out are dropped). With a trials budget, one batch at a time (the same
        # candidates for every executor).
        if self.budget.trials is None and self.executor.concurrent and hasattr(self.timer, "submit"):
            self._stream(i, best, ranked, send_next, more, in_time)
            return
        depth = IN_FLIGHT if self.budget.trials is None and self.executor.concurrent else 1
        in_flight: deque = deque([send_next()] if more() else [])
        while in_flight:
            batch, scored, sent = in_flight.popleft()
            while len(in_flight) < depth - 1 and more():
                in_flight.append(send_next())
            kept = self._receive(sent)
            if not in_time():
                in_flight.clear()
            if not in_flight and more():
                in_flight.append(send_next())
            for (_, _, k), sc, ok in zip(batch, scored, kept, strict=True):
                if ok:
                    self._keep(i, k, sc, best, ranked)
            self.progress(self.stats)

    def _keep(self, i: int, k: Kernel, sc: Scored, best: list[Kernel], ranked: list[list[Scored]]) -> None:
        """A candidate of region i that counts: ranked, and stored at once when it is the best."""
        ranked[i].append(sc)
        if self._improves(i, sc, ranked):
            best[i] = k
            self._save(best, ranked)

    def _stream(self, i: int, best: list[Kernel], ranked: list[list[Scored]], send_next, more, in_time) -> None:
        """Region i's tuning as a stream, for a timer of several GPUs (a Ray pool): proven plans
        are queued on the GPUs as each batch's proofs land, and each measurement is taken as it
        comes back, so no GPU waits for the slowest plan of a batch or for the driver. Batches are
        proven ahead while a few plans per GPU are queued. When the time is up, the proofs in flight
        and the plans not started are dropped and those being timed are waited for."""
        timer = self.timer
        ahead = 2 * max(1, timer.width)  # plans queued or running per pool before the driver waits on proofs
        proofs: deque = deque()

        def take(wait_s: float) -> None:
            began = time.monotonic()
            for (k, sc, plan), m in timer.collect(wait_s):
                if self._timed(plan, i, sc, m):
                    self._keep(i, k, sc, best, ranked)
            self.stats.add("driver waits for GPUs", time.monotonic() - began if wait_s else None)

        while True:
            while len(proofs) < IN_FLIGHT and more():
                proofs.append(send_next())
            take(0.0)
            if not in_time():
                timer.drop_queued()
                while timer.busy:
                    take(1.0)
                break
            oldest_done = proofs and getattr(proofs[0][2].pending, "done", lambda: True)()
            if proofs and (oldest_done or timer.backlog < ahead):
                batch, scored, sent = proofs.popleft()
                kept, to_time = self._proven(sent)
                for (_, _, k), sc, ok in zip(batch, scored, kept, strict=True):
                    if ok:
                        self._keep(i, k, sc, best, ranked)
                timer.submit([((batch[j][2], scored[j], sent.plans[j]), (sent.plans[j].to_json(), c))
                              for j, c in to_time])
            elif timer.busy:
                take(0.05 if proofs else 1.0)
            elif not proofs:
                break
            self.progress(self.stats)

    def _improves(self, i: int, scored: Scored, ranked: list[list[Scored]]) -> bool:
        """Better than region i's current best: measured plan time with a GPU; without one, the
        predicted time, and among equal predictions the finer terms (`cost.tie_break`)."""
        if self.timer is not None:
            score = scored.measured_us
            if score is None or score >= self.best_score[i]:
                return False
            self.best_score[i] = score
            return True
        if not predicted_better(scored.predicted_s, scored.tie_break, self.best_score[i], self.best_tie.get(i)):
            return False
        self.best_score[i] = scored.predicted_s
        self.best_tie[i] = scored.tie_break
        return True

    def _clean_only(self, region: int, scored: Scored) -> bool:
        """Without a GPU, ptxas's report is the only sign of a slow kernel: a candidate that would replace
        the best is compiled, and refused when it spills or its wgmma is serialized (or NVRTC refuses it,
        or its setmaxnreg would hang). The first plan, the default, is kept whatever its report."""
        if not self.clean_compiles or self.trying_default:
            return False
        if region < 0:
            return True
        return predicted_better(scored.predicted_s, scored.tie_break, self.best_score[region],
                                self.best_tie.get(region))

    def _save(self, best: list[Kernel], ranked: list[list[Scored]]) -> list[Record]:
        """Store the finalists now (with a GPU, the ones not measured yet are timed first)."""
        finalists = self._finalists(best, ranked)
        self._time_finalists(finalists)
        return self._store(finalists)

    def _finalists(self, best: list[Kernel], ranked: list[list[Scored]]) -> list[Plan]:
        """The plans to store: the best plan and the runners-up of each region (combined with the other regions'
        best), best first, at most top_k; only plans verified in this run, each with its own certificate (a runner-up
        combined with another region's later best was never proven whole); with a GPU, each on two lanes too."""
        plans: list[Plan] = [self._plan(tuple(best), self.rewrites)]
        key = (lambda s: s.measured_us or 1e30) if self.timer is not None else (lambda s: (s.predicted_s, s.tie_break))
        for i, pool in enumerate(ranked):
            for s in sorted(pool, key=key)[1: self.top_k]:
                kernels = (*tuple(best[:i]), s.kernel, *tuple(best[i + 1:]))
                plans.append(self._plan(kernels, self.rewrites))
        plans = [p for p in plans if p.key in self.certificates][: self.top_k]
        twins = lane_twins(apply_rewrites(self.model, self.rewrites), plans) if self.timer is not None else []
        self.certificates |= {twin.key: lane_certificate(self.certificates[base.key], twin) for twin, base in twins}
        return plans + [twin for twin, _ in twins]  # (the same kernels: the same proof; only a GPU tells them apart)

    def _time_finalists(self, plans: list[Plan]) -> None:
        """Time the finalists that have no measurement yet (one whose timing failed, or was dropped at the end of the
        budget), so that what is stored is measured where it can be. Nothing goes to a timer whose machines are lost."""
        if self.timer is None or self.lost is not None:
            return
        for plan in plans:
            if plan.key in self.measured:
                continue
            m = self.timer.measure(plan.to_json())
            if m.ok:
                self.measured[plan.key] = {"median_us": m.median_us, "p20_us": m.p20_us, "p80_us": m.p80_us,
                                           "samples_us": m.samples_us or [], "golden": m.golden}

    def _store(self, plans: list[Plan]) -> list[Record]:
        """Write `plans` (the finalists, best first) to the database as records: their predicted time, their
        measurement when they have one, their certificate and provenance. No plans: nothing written, []."""
        if not plans:
            return []
        self.stored_best = plans[0]
        records = []
        for plan in plans:
            costs = [kernel_cost(lw, self.sizes, self.target) for lw in lower_plan(self.model, plan)]
            predicted = sum(c.seconds for c in costs) * 1e6
            meas: dict = self.measured.get(plan.key, {}) if self.timer is not None else {}
            measured = meas.get("median_us")
            records.append(Record(rank=0, plan=plan.to_json(), status="measured" if measured else "unmeasured",
                                  median_us=measured, p20_us=meas.get("p20_us"), p80_us=meas.get("p80_us"),
                                  samples_us=meas.get("samples_us") or [], predicted_us=predicted,
                                  certificate=self.certificates[plan.key], golden=meas.get("golden"),
                                  provenance=provenance(self.seed, gpu=self.gpu or {}, source=self.path)
                                  | self._baseline_note()))
            if plan is plans[0]:
                self.stats.best_predicted_us = predicted
                if measured:
                    self.stats.best_us = measured if self.stats.best_us is None else min(self.stats.best_us, measured)
        entry = self.db.store(self.key, records, keep=self.top_k)
        return entry.records


__all__ = ["Budget", "KernelCost", "Search", "SearchResult", "Stats"]
