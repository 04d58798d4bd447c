"""A probe stops as soon as its verdict against the SLO is decided: exactly, never statistically.

The rule. A run of N measured requests with attainment target p fails once more requests are *known* to
miss than `allowed_misses(N, p)`, the most misses with which met / N still reaches p (the float comparison
`meets` makes, so the rule and the verdict cannot disagree by a rounding). A request is known to miss when
it finished and missed (`SLO.meets` on its record, the definition every summary uses, failures included),
or while it is still in flight, when the time already passed decides it (`pending_miss`):

- no first token yet, and longer than the TTFT (or TTFA) bound since its scheduled arrival (since its send
  on the `sent` clock): its TTFT can only grow. This is also the unbounded queue: past the cliff the waiting
  requests pass the TTFT bound one after another, and the run stops without draining them;
- not done yet, and longer than the E2E bound;
- with a TPOT bound: (now - first token) / (max_tokens - 1) already above it. TPOT is (done - first token)
  / (tokens - 1) with done later than now and at most max_tokens tokens (what the request asked for, and
  what the targets refuse to exceed), so it can only be larger.

N is the run's scheduled measured requests (warm-up excluded), or a bound above them: a session's later
turn that is never sent only lowers N, and lowering N only lowers the misses allowed. Nothing is
statistical: no later request can change the verdict, which is why the capacity search takes a stopped
probe's fail as it takes a whole probe's.

The in-flight rules read a record while its request runs, so they are used only with a target whose
records are stamped the moment a token is read (`records_live`: the HTTP target); a target that queues
its stamps (the in-process engine) or fills a record in another process (client workers, Ray) gives its
records once they end, and only finished requests count there. With `--warmup auto` (the cut is chosen
after the run) or a stream of unknown length, N is unknown and nothing stops early.

Why no early pass. An exact pass (enough requests known to meet) comes only after p of the run has ended,
so it saves at most the last tenth of a probe and no drain (a passing server keeps its queue short); and
it would leave the met edge of a capacity bracket without its attainment, which the crossing is
interpolated from. A statistical pass (an interval over the first requests entirely above p) is biased:
an open-loop probe near the cliff builds its queue over the run, so its later requests see more queue
than its first, and the first part's attainment overstates the whole run's; near saturation the requests
are also strongly correlated (NOTES-statistics: variance 3-50x the independent one), so such an interval is
too narrow. Both errors would flip verdicts exactly at the crossing the search resolves.

What a stopped run says (`StoppedEarly`, summary.json's `stopped_early`): when, why, the misses known and
allowed, and its attainment as bounds: at most (N - known misses) / N, at least (requests met) / N. Its
attainment value is the share met among the requests decided (met + known misses): below p by
construction (misses > (1 - p) N >= (1 - p) decided), between the bounds, and what the capacity search
interpolates a crossing from (`slobench.experiments.crossing.cross_at`; the choice is measured in
benchmarks/probe_early_stop.py).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slobench.analysis.metrics import RecordArrays
from slobench.analysis.slo import SLO, Attainment
from slobench.errors import SpecError
from slobench.run.records import RequestRecord

CHECK_EVERY_S = 0.1  # how often the in-flight requests are looked at: a stop comes at most this late


def allowed_misses(num_measured: int, target: float) -> int:
    """The most misses of `num_measured` requests with which the attainment (met / N, as a float) still
    reaches `target`; one more and the run fails whatever the others do."""
    if num_measured < 0:
        raise SpecError("num_measured", num_measured, "must be >= 0")
    if not 0 < target <= 1:
        raise SpecError("target", target, "must be in (0, 1]")
    n = num_measured
    if n == 0:
        return 0
    m = min(n, max(0, math.floor((1 - target) * n)))
    while m > 0 and not (n - m) / n >= target:  # float rounding: (1 - 0.9) * 100 is 9.999...
        m -= 1
    while m < n and (n - m - 1) / n >= target:
        m += 1
    return m


@dataclass(frozen=True, slots=True)
class StoppedEarly:
    """Why and when a run stopped before its end, and what its attainment is known to be."""

    reason: str
    at_s: float  # run time of the decision
    known_misses: int
    allowed_misses: int
    num_scheduled: int  # measured requests the verdict was taken over
    num_met: int  # finished and met before the stop
    attainment_at_most: float
    attainment_at_least: float
    # how the server let go of the cancelled requests (`slobench.run.server_idle.wait_idle`), None: not asked
    server_idle: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        if not self.known_misses > self.allowed_misses:
            raise SpecError("known_misses", self.known_misses, f"must exceed allowed_misses {self.allowed_misses}")
        if self.num_scheduled < self.known_misses + self.num_met:
            raise SpecError("num_scheduled", self.num_scheduled, "fewer than the requests decided")

    @property
    def decided_share(self) -> float:
        """Met among the requests decided: the run's attainment value once stopped (module doc)."""
        return self.num_met / (self.num_met + self.known_misses)

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "at_s": round(self.at_s, 3), "known_misses": self.known_misses,
                "allowed_misses": self.allowed_misses, "num_scheduled": self.num_scheduled, "num_met": self.num_met,
                "attainment_at_most": self.attainment_at_most, "attainment_at_least": self.attainment_at_least,
                **({"server_idle": dict(self.server_idle)} if self.server_idle is not None else {})}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StoppedEarly:
        return cls(str(d["reason"]), float(d["at_s"]), int(d["known_misses"]), int(d["allowed_misses"]),
                   int(d["num_scheduled"]), int(d["num_met"]), float(d["attainment_at_most"]),
                   float(d["attainment_at_least"]), d.get("server_idle"))

    def text(self) -> str:
        """One line for a probe's progress."""
        return (f"stopped early at {self.at_s:.1f} s: {self.known_misses} of {self.num_scheduled} requests known to "
                f"miss ({self.allowed_misses} allowed), attainment at most {percent_down(self.attainment_at_most)}")


def percent_down(share: float) -> str:
    """A share as a percentage rounded down: an upper bound of 89.96% is no 90.0%."""
    return f"{math.floor(share * 1000) / 10:.1f}%"


def bound_text(at_most: float | None, at_s: float) -> str:
    """What a table's attainment cell says of a run that stopped early."""
    return f"at most {'-' if at_most is None else percent_down(at_most)} (stopped early at {at_s:.1f} s)"


class MissCounter:
    """The decider: fed the finished records as they come and asked about the ones in flight."""

    def __init__(self, slo: SLO, num_measured: int, *, in_flight_rules: bool) -> None:
        self.slo = slo
        self.num_measured = num_measured
        self.allowed = allowed_misses(num_measured, slo.target)
        self.in_flight_rules = in_flight_rules
        self.finished_met = 0
        self.finished_missed = 0

    def add_finished(self, records: Sequence[RequestRecord]) -> None:
        measured = [r for r in records if not r.is_warmup]
        if not measured:
            return
        met = int(self.slo.meets(RecordArrays.from_records(measured)).sum())
        self.finished_met += met
        self.finished_missed += len(measured) - met

    def pending_miss(self, rec: RequestRecord, now_s: float) -> str | None:
        """Why a request still in flight is already known to miss, or None."""
        slo = self.slo
        since = rec.scheduled_s if slo.clock == "scheduled" else rec.sent_s
        if since is None or rec.is_warmup:  # the sent clock starts at the send
            return None
        waited_s = now_s - since
        if rec.first_token_s is None:
            for name, bound in (("TTFT", slo.ttft_s), ("TTFA", slo.ttfa_s)):
                if bound is not None and waited_s > bound:
                    return f"no first token after the {name} bound"
        if slo.e2e_s is not None and waited_s > slo.e2e_s:
            return "not done after the E2E bound"
        if slo.tpot_s is not None and rec.first_token_s is not None and rec.max_tokens > 1 \
                and (now_s - rec.first_token_s) / (rec.max_tokens - 1) > slo.tpot_s:
            return "tokens too slow for the TPOT bound"
        return None

    def check(self, in_flight: Iterable[RequestRecord], now_s: float) -> StoppedEarly | None:
        """The decision, once the misses known exceed those allowed."""
        misses = self.finished_missed
        reasons: dict[str, int] = {}
        if misses > self.allowed:
            reasons["finished and missed"] = misses
        elif self.in_flight_rules:
            for rec in in_flight:
                why = self.pending_miss(rec, now_s)
                if why is not None:
                    misses += 1
                    reasons[why] = reasons.get(why, 0) + 1
        if not misses > self.allowed:
            return None
        if self.finished_missed:
            reasons.setdefault("finished and missed", self.finished_missed)
        n = self.num_measured
        said = "; ".join(f"{k}: {v}" for k, v in sorted(reasons.items(), key=lambda kv: -kv[1]))
        return StoppedEarly(said, now_s, misses, self.allowed, n, self.finished_met, (n - misses) / n,
                            self.finished_met / n)


def stopped_attainment(stopped: StoppedEarly, duration_s: float) -> Attainment:
    """A stopped run's attainment: the share met among the decided requests, its bounds as the interval."""
    return partial_attainment(stopped.num_scheduled, stopped.num_met, stopped.known_misses, duration_s)


def partial_attainment(num_scheduled: int, num_met: int, num_missed: int, duration_s: float) -> Attainment:
    """What part of a run's requests say of its attainment: `num_met` and `num_missed` decided of
    `num_scheduled`; the value the share met among them, the interval what the rest could make of it."""
    good = num_met / duration_s if duration_s > 0 and math.isfinite(duration_s) else 0.0
    decided = num_met + num_missed
    return Attainment(num_met / decided if decided else math.nan, num_met / num_scheduled,
                      (num_scheduled - num_missed) / num_scheduled, num_scheduled, num_met, good)


async def watch(counter: MissCounter, finished: Sequence[RequestRecord], in_flight: Mapping[int, RequestRecord],
                now_s: Callable[[], float], on_decided: Callable[[StoppedEarly], None], *,
                every_s: float = CHECK_EVERY_S) -> None:
    """Beside a run: every `every_s`, the records finished since the last look (`finished` grows at its end)
    and those in flight are counted; once decided, `on_decided(StoppedEarly)` is called and the watch ends."""
    seen = 0
    while True:
        await asyncio.sleep(every_s)
        new = finished[seen:]
        seen += len(new)
        counter.add_finished(new)
        decided = counter.check(list(in_flight.values()), now_s())
        if decided is not None:
            on_decided(decided)
            return
