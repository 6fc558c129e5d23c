"""The cheapest cluster that meets both SLOs for the accepted share: a bounded search.

Every point is one simulation (``radix_global_tools/simulate``: the production index, conductor
and cost model, the decode model) of the whole trace with no admission, so every request is
served and counted: a request meets its SLOs when its TTFT and its mean time between tokens are
both within them. Each dimension is searched by doubling then bisection, assuming more of a
resource never hurts (monotone); the checks in ``tests/radix_global_tools/plan`` test that
assumption where it matters (one prefill instance fewer, or half the pool, misses).

Prefill/decode disaggregated (PD): TTFT depends on prefill instances, pool and fabric; TBT on
decode instances (and the hand-off over the fabric). So the prefill count is searched with no
decode side, the decode count at a prefill count that meets TTFT, and the pair is then checked
together (and grown by one instance at a time while it misses). Co-located: one count, both SLOs.

Pool sizes tried: none, and the capacities where the trace's LRU reuse curve
(``capacity_curve.py``) reaches 50/80/90/95/100% of its unbounded reuse; for each prefill count
found, the smallest pool that still keeps it is bisected between two tried sizes. With a disk
tier in the hardware profile (its ``[disk]`` table), each pool short of the largest is tried
again with a disk under it holding the whole reuse (the largest size), then the disk is bisected
down while the same prefill count holds: a small memory pool backed by cheap, slower disk against
a large memory pool.

Each candidate found then gets the smallest own cache per prefill instance (bisected down from
the profile's, never below the device's part: co-located its device KV, PD the longest prompt)
that still meets the targets. With ``copies`` (the
extra copies of hot prefixes to try), a pool is per-instance segments with sender congestion and
the router's copy rounds (``docs/interfaces.md``, "The capacity plan file and the decode model"),
and every fabric is searched at each copy count: more bandwidth against more copies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import NamedTuple

from radix_global_tools.plan.capacity_curve import CapacityCurve
from radix_global_tools.plan.costs import CostWeights
from radix_global_tools.plan.sizing import Sizing
from radix_global_tools.simulate.config import Calibration
from radix_global_tools.simulate.experiments import FIG5_SETUPS, run_one
from radix_global_tools.simulate.metrics import oracle_reuse
from radix_global_tools.simulate.records import RequestRecord
from radix_global_tools.simulate.segments import FaultDomains
from radix_global_tools.simulate.workload import SimRequest
from router.cluster.copy_planner import CopyConfig
from router.routing.dispatch_gate import DispatchConfig

POOL_FRACTIONS = (0.5, 0.8, 0.9, 0.95, 1.0)
MAX_INSTANCES = 512
COPY_ROUND_S = 10.0  # simulated seconds between the router's copy rounds (with copies)


class PlanError(ValueError):
    """No cluster the search may build meets the targets (or the targets are malformed)."""


class Targets(NamedTuple):
    ttft_slo_s: float
    tbt_slo_s: float
    accept: float  # the share of all requests that must meet both


class Outcome(NamedTuple):
    sizing: Sizing
    ttft_share: float
    tbt_share: float
    both_share: float
    hit_rate: float
    p99_ttft_s: float
    p99_tbt_s: float


class Candidate(NamedTuple):
    outcome: Outcome
    cost: float
    chosen: bool = False


class Planner:
    """Search over clusters for one trace, profile and cost weights (``plan`` once)."""

    def __init__(self, trace: Sequence[SimRequest], cal: Calibration, targets: Targets,
                 costs: CostWeights, colocated: bool,
                 progress: Callable[[str], None] = lambda _: None,
                 prefill_batch: int = DispatchConfig().depth,
                 copies: Sequence[int] = ()) -> None:
        if any(c < 0 for c in copies):
            raise PlanError(f"copies must be >= 0, got {list(copies)}")
        self.trace, self.cal, self.targets = trace, cal, targets
        # None: the striped pool (no sender bottleneck, no copies); else segments and copies
        self.copies: tuple[int | None, ...] = tuple(sorted(set(copies))) or (None,)
        self.costs, self.colocated, self.progress = costs, colocated, progress
        # Our router's dispatch gate sends an engine at most its depth of requests awaiting a
        # first token; the engine prefills those that wait together as one batch.
        self.prefill_batch = prefill_batch
        self._memo: dict[tuple[Sizing, bool], Outcome] = {}
        # What an instance's own cache holds at least: co-located, the device KV it decodes in;
        # PD, the longest prompt it prefills (the profile does not say a prefill instance's
        # device size), in whole pages. The host cache is planned above it, and only what is
        # above it is priced as host memory.
        page = cal.page_tokens
        self._device_tokens = cal.decode.kv_tokens_per_instance if colocated else \
            -(-max((r.input_tokens for r in trace), default=page) // page) * page
        self.skipped: dict[str, str] = {}  # fabric (and copies) -> why no cluster met there

    @property
    def simulations(self) -> int:
        return len(self._memo)

    def evaluate(self, s: Sizing, decode_side: bool = True) -> Outcome:
        """One simulation of ``s`` (memoised); ``decode_side`` False: TTFT only, no decode."""
        host = self.cal.local_tokens_per_instance if s.host_tokens is None else s.host_tokens
        s = s._replace(host_tokens=host)
        if s.copies is not None and not s.pool_tokens:
            s = s._replace(copies=0)  # no pool, nothing to copy: one simulation for every count
        key = (s, decode_side)
        if key in self._memo:
            return self._memo[key]
        cal = replace(self.cal, bandwidth_bytes_per_s=s.bandwidth_Bps)
        setup = FIG5_SETUPS["global_cache_aware" if s.pool_tokens else "local_cache_aware"]
        _, sim = run_one(cal, self.trace, s.prefill, setup, host,
                         pool_tokens=s.pool_tokens or None, disk_tokens=s.disk_tokens,
                         decode_instances=s.decode if decode_side else 0,
                         colocated=decode_side and self.colocated,
                         prefill_batch=self.prefill_batch, fault_domains=segmented_pool(s))
        out = outcome(s, sim.records, self.targets)
        self._memo[key] = out
        disk = f", disk {s.disk_tokens:,}" if s.disk_tokens else ""
        copies = f", {s.copies} copies" if s.copies else ""
        self.progress(f"{s.prefill} prefill, {s.decode} decode, pool {s.pool_tokens:,}{disk} "
                      f"tokens{copies}, host {s.host_tokens:,}, {s.bandwidth_Bps * 8 / 1e9:g} "
                      f"Gbit/s: TTFT {out.ttft_share:.3f}, TBT {out.tbt_share:.3f}")
        return out

    def cost(self, s: Sizing) -> float:
        return self.costs.of(s, self.cal.kv_bytes_per_token, self.cal.local_tokens_per_instance,
                             self._device_tokens)

    def _smallest(self, lo: int, share: Callable[[int], float], what: str) -> int:
        """The smallest n >= lo whose ``share(n)`` reaches the accepted share: doubling to an
        upper bound, then bisection. Stops when doubling no longer helps (a plateau)."""
        a, hi = self.targets.accept, lo
        last = share(hi)
        while last < a:
            lo, hi = hi + 1, hi * 2
            now = share(hi)
            if hi > MAX_INSTANCES or (hi >= 8 and now <= last):
                raise PlanError(f"more {what} instances do not help: {now:.1%} of requests "
                                f"meet the SLOs at {hi}, {a:.1%} asked")
            last = now
        while lo < hi:
            mid = (lo + hi) // 2
            if share(mid) >= a:
                hi = mid
            else:
                lo = mid + 1
        return hi

    def _prefill_share(self, s: Sizing) -> Callable[[int], float]:
        """The share that the prefill count decides, the rest as ``s``: PD, the TTFT share (no
        decode side); co-located, the share meeting both."""
        if self.colocated:
            return lambda p: self.evaluate(s._replace(prefill=p, decode=0)).both_share
        return lambda p: self.evaluate(s._replace(prefill=p, decode=0), False).ttft_share

    def plan(self, bandwidths: Sequence[float], curve: CapacityCurve) -> list[Candidate]:
        """Every candidate found (cheapest marked ``chosen``), ascending by cost."""
        pools = sorted({0, *(max(0, curve.capacity_for(f * curve.max_hit_rate))
                             for f in POOL_FRACTIONS)})
        found: list[Outcome] = []
        for bw in bandwidths:
            for copies in self.copies:
                where = f"{bw * 8 / 1e9:g} Gbit/s" + (f", {copies} copies" if copies else "")
                self.progress(f"fabric {where} per instance")
                try:
                    found += self._at(Sizing(1, 0, 0, bw, 0, self.cal.local_tokens_per_instance,
                                             copies), pools)
                except PlanError as exc:  # another fabric may do
                    self.skipped[where] = str(exc)
        if not found:
            raise PlanError("; ".join(f"{where}: {why}" for where, why in self.skipped.items()))
        unique = {o.sizing: o for o in found}  # growing two sizings may meet at one
        ranked = sorted(unique.values(), key=lambda o: (self.cost(o.sizing), o.sizing))
        return [Candidate(o, self.cost(o.sizing), i == 0) for i, o in enumerate(ranked)]

    def _at(self, base: Sizing, pools: list[int]) -> list[Outcome]:
        """The candidates at ``base``'s fabric and copies."""
        prefill: dict[int, int] = {}
        lower = 1
        for pool in reversed(pools):  # a smaller pool never needs fewer instances
            try:
                prefill[pool] = lower = self._smallest(
                    lower, self._prefill_share(base._replace(pool_tokens=pool)), "prefill")
            except PlanError:
                if pool == pools[-1]:
                    raise
                break  # smaller pools will not do better
        decode = 0
        if not self.colocated:
            full = base._replace(prefill=prefill[pools[-1]], pool_tokens=pools[-1])
            decode = self._smallest(
                1, lambda d: self.evaluate(full._replace(decode=d)).tbt_share, "decode")
        base = base._replace(decode=decode)
        # every pool size tried (the trade-off: fewer prefill instances against a bigger pool),
        # and for each prefill count the smallest pool that keeps it
        sizes = {base._replace(prefill=p, pool_tokens=pool) for pool, p in prefill.items()}
        sizes |= {base._replace(prefill=p, pool_tokens=self._smallest_pool(base, prefill, p))
                  for p in set(prefill.values())}
        sizes |= self._with_disk(base, pools, prefill)
        return [self._least_host(self._together(s)) for s in sorted(sizes)]

    def _with_disk(self, base: Sizing, pools: list[int], prefill: dict[int, int]
                   ) -> set[Sizing]:
        """Each tried pool short of the largest, with a disk under it: first one that holds
        the whole reuse (the largest pool size), for the prefill count it needs with it, then
        bisected down while that count holds (checked with the decode side by the caller, where
        a small pool alone may need one more). Not with segments (the simulated disk sits under
        the striped pool only)."""
        if self.cal.disk_read_bytes_per_s is None or not pools[-1] or base.copies is not None:
            return set()
        disk, out = pools[-1], set()
        fewest = prefill[disk]  # a memory pool that holds everything: a disk cannot beat it
        for pool in [p for p in pools if 0 < p < disk]:
            s = base._replace(pool_tokens=pool, disk_tokens=disk)
            try:
                s = s._replace(prefill=self._smallest(fewest, self._prefill_share(s), "prefill"))
            except PlanError:
                continue
            out.add(s._replace(disk_tokens=self._least_disk(s)))
        return out

    def _least_disk(self, s: Sizing) -> int:
        """The smallest disk under ``s``'s pool that keeps ``s``'s prefill count."""
        return self._bisect_down(s.pool_tokens, s.disk_tokens, lambda d: self._prefill_share(
            s._replace(disk_tokens=d))(s.prefill))

    def _smallest_pool(self, base: Sizing, prefill: dict[int, int], p: int) -> int:
        """Bisect the pool between the largest tried size that needs more than ``p`` prefill
        instances and the smallest that needs ``p``, to a quarter of the smaller."""
        pools = sorted(prefill)
        hi = min(pool for pool in pools if prefill[pool] == p)
        below = [pool for pool in pools if pool < hi]
        if not below:
            return hi
        return self._bisect_down(below[-1], hi, lambda pool: self._prefill_share(
            base._replace(pool_tokens=pool))(p))

    def _bisect_down(self, lo: int, hi: int, share: Callable[[int], float]) -> int:
        """The smallest size in (``lo``, ``hi``] whose ``share`` still reaches the accepted
        share, given that ``hi``'s does: bisection in whole pages, to a quarter of ``lo``."""
        page = self.cal.page_tokens
        while hi - lo > max(page, lo // 4):
            mid = (lo + hi) // 2 // page * page
            if mid <= lo:
                break
            if share(mid) >= self.targets.accept:
                hi = mid
            else:
                lo = mid
        return hi

    def _least_host(self, out: Outcome) -> Outcome:
        """``out`` with the smallest own cache per prefill instance that still meets the
        targets: from the profile's down, never below the device's part."""
        s = out.sizing
        assert s.host_tokens is not None
        floor = min(s.host_tokens, self._device_tokens)
        if floor >= s.host_tokens:
            return out
        at_floor = self.evaluate(s._replace(host_tokens=floor))
        if at_floor.both_share >= self.targets.accept:
            return at_floor
        host = self._bisect_down(floor, s.host_tokens, lambda h: self.evaluate(
            s._replace(host_tokens=h)).both_share)
        return self.evaluate(s._replace(host_tokens=host))

    def _together(self, s: Sizing) -> Outcome:
        """``s`` checked with both sides at once, grown one instance at a time while it misses
        (PD: the side whose SLO the share misses)."""
        a = self.targets.accept
        for _ in range(8):
            out = self.evaluate(s)
            if out.both_share >= a:
                return out
            if self.colocated or out.ttft_share < a or out.tbt_share >= a:
                s = s._replace(prefill=s.prefill + 1)
            else:
                s = s._replace(decode=s.decode + 1)
        raise PlanError(f"{s} and its neighbours miss the targets together")


def segmented_pool(s: Sizing) -> FaultDomains | None:
    """A pool of ``s.copies`` extra copies: one segment per prefill instance, each instance its
    own fault domain, copy rounds keeping hot prefixes in ``1 + copies`` of them (none: off)."""
    if s.copies is None or not s.pool_tokens:
        return None
    rounds = CopyConfig(interval_s=COPY_ROUND_S if s.copies else 0.0, domains=1 + s.copies)
    return FaultDomains(tuple(f"instance-{i}" for i in range(s.prefill)), rounds)


def outcome(s: Sizing, records: Sequence[RequestRecord], targets: Targets) -> Outcome:
    """Shares of all requests meeting TTFT, TBT and both (a rejected request meets neither)."""
    n = len(records) or 1
    ttft_ok = [r.accepted and r.ttft_s is not None and r.ttft_s <= targets.ttft_slo_s
               for r in records]
    tbt_ok = [r.accepted and (r.tbt_s is None or r.tbt_s <= targets.tbt_slo_s) for r in records]
    ttfts = sorted(r.ttft_s for r in records if r.ttft_s is not None)
    tbts = sorted(r.tbt_s for r in records if r.tbt_s is not None)
    acc = [r for r in records if r.accepted]
    tokens = sum(r.input_tokens for r in acc) or 1
    return Outcome(
        s, sum(ttft_ok) / n, sum(tbt_ok) / n,
        sum(a and b for a, b in zip(ttft_ok, tbt_ok, strict=True)) / n,
        sum(r.local_tokens + r.fetched_tokens for r in acc) / tokens,
        _p99(ttfts), _p99(tbts))


def _p99(values: Sequence[float]) -> float:
    return values[min(len(values) - 1, int(0.99 * len(values)))] if values else float("nan")


def attainable_share(trace: Sequence[SimRequest], cal: Calibration, targets: Targets) -> float:
    """The share of requests that could meet both SLOs on any cluster: no queueing, every page
    any earlier request computed reused for free, decoding alone. A bound: if it is below the
    accepted share, no plan exists (and searching would only find that out slowly)."""
    met = sum(
        cal.prefill_s(req.input_tokens, reused) + cal.first_token_s <= targets.ttft_slo_s
        and (req.output_tokens <= 1 or cal.decode.step_s(1, req.input_tokens) <= targets.tbt_slo_s)
        for req, reused in oracle_reuse(cal, trace))
    return met / len(trace) if trace else 0.0
