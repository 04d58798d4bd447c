"""Multi-turn sessions and shared system-prompt groups: what turns a schedule of arrivals into prompts
that share prefixes the way real chat traffic does (`SessionSpec`, `SystemPrompts`, `build_requests`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from slobench.errors import SpecError
from slobench.run.records import RequestSpec, with_drawn_ids
from slobench.workload.lengths import LengthDist, length_from_dict
from slobench.workload.phases import RequestClass, Schedule
from slobench.workload.prompts import WORDS, _id_objects
from slobench.workload.reasoning import ReasoningSpec

__all__ = ["SESSION_MODES", "SessionSpec", "SystemPrompts", "ThinkTime", "build_requests", "ids_to_prompt",
           "with_session_mode"]

SESSION_MODES = ("wait", "scheduled")
_THINK_KEYS = {"exponential": ("mean_s",), "fixed": ("value_s",), "lognormal": ("median_s", "p99_s"),
               "pareto": ("alpha", "scale_s")}
_Z99 = 2.3263478740408408


def _positive(field: str, x: object) -> float:
    if isinstance(x, bool) or not isinstance(x, int | float) or not (math.isfinite(x) and x >= 0):
        raise SpecError(field, x, "must be a finite number >= 0")
    return float(x)


@dataclass(frozen=True, slots=True)
class ThinkTime:
    """Seconds a user (or an agent's tool) takes between an answer and the next turn: exponential (mean_s),
    fixed (value_s), lognormal (median_s, p99_s) or Pareto (alpha, scale_s: P(T > t) = (scale_s / t)^alpha
    from scale_s on; heavy-tailed, the mean is infinite for alpha <= 1)."""

    dist: str
    params: tuple[tuple[str, float], ...]

    def __post_init__(self) -> None:
        if self.dist not in _THINK_KEYS:
            raise SpecError("dist", self.dist, f"think time dist must be one of {sorted(_THINK_KEYS)}")
        got = {k for k, _ in self.params}
        if got != set(_THINK_KEYS[self.dist]):
            raise SpecError("dist", self.dist, f"{self.dist} takes exactly {list(_THINK_KEYS[self.dist])}")
        for k, v in self.params:
            _positive(k, v)
        p = dict(self.params)
        if self.dist == "pareto" and not (p["alpha"] > 0 and p["scale_s"] > 0):
            raise SpecError("alpha", p["alpha"], "pareto needs alpha > 0 and scale_s > 0")
        if self.dist == "lognormal" and not 0 < p["median_s"] <= p["p99_s"]:
            raise SpecError("p99_s", p["p99_s"], f"must be >= median_s ({p['median_s']}) > 0")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ThinkTime:
        dist = d.get("dist", "exponential")
        return cls(dist, tuple((str(k), v) for k, v in d.items() if k != "dist"))

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        p = dict(self.params)
        if self.dist == "exponential":
            return rng.standard_exponential(n) * p["mean_s"]
        if self.dist == "fixed":
            return np.full(n, p["value_s"])
        if self.dist == "pareto":  # numpy's pareto is Lomax: shifted by one, it is Pareto from 1
            return (rng.pareto(p["alpha"], n) + 1.0) * p["scale_s"]
        sigma = (math.log(p["p99_s"]) - math.log(p["median_s"])) / _Z99
        return np.exp(math.log(p["median_s"]) + sigma * rng.standard_normal(n))

    def to_dict(self) -> dict[str, Any]:
        return {"dist": self.dist, **dict(self.params)}


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """Multi-turn sessions: each arrival of the schedule starts a conversation of K turns (K from `turns`). Turn 1 is
    [system prompt] + user tokens (the class's input length); turn k+1 is turn k's whole prompt + a synthetic
    answer of turn k's output length + new user tokens (again the class's input length), so the prompt grows
    and every turn's prefix is the previous turn's prompt. Turn k+1 arrives at

        scheduled arrival of turn k + output_k · response_s_per_token + think time,

    i.e. after an *estimate* of turn k's response, not its real completion: the whole schedule is computed
    before the run, so the load stays open-loop across and within sessions (a slow server does not slow the
    offered load down, which is what a capacity measurement needs). A turn whose prompt would pass
    `max_context_tokens` ends its session. With sessions, the arrival rate counts *conversations* per second.

    That is `mode = "scheduled"`. The default, `mode = "wait"`, keeps the sessions' open-loop arrivals but sends
    turn k+1 when turn k's answer has actually ended plus the think time (`slobench.run.session_plan`), with the
    answer the server gave (its token count) in its prompt: what a person or an agent does. The estimate above
    is then only the turn's `arrival_s`, which its record keeps to say how much later the turn left."""

    turns: LengthDist
    think: ThinkTime = ThinkTime("exponential", (("mean_s", 5.0),))
    response_s_per_token: float = 0.02
    max_context_tokens: int | None = None
    mode: str = "wait"  # "wait": a turn leaves when its predecessor's answer ended; "scheduled": at the estimate

    def __post_init__(self) -> None:
        if self.mode not in SESSION_MODES:
            raise SpecError("mode", self.mode, f"session mode must be one of {list(SESSION_MODES)}")
        if not hasattr(self.turns, "sample"):
            raise SpecError("turns", self.turns, "must be a length distribution (of turns per session)")
        _positive("response_s_per_token", self.response_s_per_token)
        m = self.max_context_tokens
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise SpecError("max_context_tokens", m, "must be an integer >= 1")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SessionSpec:
        allowed = {"turns", "think", "response_s_per_token", "max_context_tokens", "mode"}
        for key in d:
            if key not in allowed:
                raise SpecError(str(key), d[key], f"unknown key; allowed: {sorted(allowed)}")
        if not isinstance(d.get("turns"), Mapping):
            raise SpecError("turns", d.get("turns"), 'needs a table, e.g. {dist = "uniform", min = 2, max = 6}')
        kwargs: dict[str, Any] = {"turns": length_from_dict(d["turns"])}
        if "think" in d:
            if not isinstance(d["think"], Mapping):
                raise SpecError("think", d["think"], 'needs a table, e.g. {dist = "exponential", mean_s = 5}')
            kwargs["think"] = ThinkTime.from_dict(d["think"])
        for key in ("response_s_per_token", "max_context_tokens", "mode"):
            if key in d:
                kwargs[key] = d[key]
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"turns": self.turns.to_dict(), "think": self.think.to_dict(),
                             "response_s_per_token": self.response_s_per_token}
        if self.max_context_tokens is not None:
            d["max_context_tokens"] = self.max_context_tokens
        if self.mode != "wait":
            d["mode"] = self.mode
        return d


def with_session_mode(spec: Any, mode: str | None) -> Any:
    """A workload spec with its sessions' mode set (--session-mode); unchanged without sessions or a mode."""
    if mode is None or getattr(spec, "sessions", None) is None:
        return spec
    return replace(spec, sessions=replace(spec.sessions, mode=mode))


@dataclass(frozen=True, slots=True)
class SystemPrompts:
    """Shared system prompts: `num_groups` fixed prefixes of `tokens` tokens each; every request (or every session,
    for its first turn) picks a group with Zipf popularity P(g) ∝ g^-zipf_s (or the given `weights`), and its
    prompt is that prefix followed by its user tokens (the input length is the user part; the prefix comes on
    top). With `share` < 1 only that fraction takes a group; the others have no shared prefix."""

    num_groups: int
    tokens: tuple[int, ...]  # one length for every group, or one per group
    zipf_s: float = 1.0
    weights: tuple[float, ...] = ()  # one popularity per group, instead of Zipf (what `workload fit` writes)
    share: float = 1.0  # the fraction of requests (sessions) that take a group; the rest have no shared prefix

    def __post_init__(self) -> None:
        n = self.num_groups
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise SpecError("num_groups", n, "must be an integer >= 1")
        if len(self.tokens) not in (1, n) or any(
            isinstance(t, bool) or not isinstance(t, int) or t < 1 for t in self.tokens
        ):
            raise SpecError("tokens", list(self.tokens), f"must be an integer >= 1 or a list of {n} of them")
        _positive("zipf_s", self.zipf_s)
        if self.weights and (len(self.weights) != n or not all(
                not isinstance(w, bool) and isinstance(w, int | float) and math.isfinite(w) and w > 0
                for w in self.weights)):
            raise SpecError("weights", list(self.weights), f"must be {n} numbers > 0, one per group")
        s = self.share
        if isinstance(s, bool) or not isinstance(s, int | float) or not 0 < s <= 1:
            raise SpecError("share", s, "must be a fraction > 0 and <= 1")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SystemPrompts:
        allowed = {"num_groups", "tokens", "zipf_s", "weights", "share"}
        for key in d:
            if key not in allowed:
                raise SpecError(str(key), d[key], f"unknown key; allowed: {sorted(allowed)}")
        for key in ("num_groups", "tokens"):
            if key not in d:
                raise SpecError(key, None, "system_prompts needs num_groups and tokens")
        tokens = d["tokens"]
        tokens = tuple(tokens) if isinstance(tokens, list | tuple) else (tokens,)
        weights = d.get("weights", ())
        if not isinstance(weights, list | tuple):
            raise SpecError("weights", weights, "must be a list of numbers, one per group")
        return cls(d["num_groups"], tokens, d.get("zipf_s", 1.0), tuple(weights), d.get("share", 1.0))

    def lengths(self) -> list[int]:
        return list(self.tokens) * self.num_groups if len(self.tokens) == 1 else list(self.tokens)

    def popularity(self) -> np.ndarray:
        if self.weights:
            w = np.asarray(self.weights, dtype=np.float64)
        else:
            w = np.arange(1, self.num_groups + 1, dtype=np.float64) ** -self.zipf_s
        return w / w.sum()

    def to_dict(self) -> dict[str, Any]:
        tokens: Any = self.tokens[0] if len(self.tokens) == 1 else list(self.tokens)
        d: dict[str, Any] = {"num_groups": self.num_groups, "tokens": tokens, "zipf_s": self.zipf_s}
        if self.weights:
            d["weights"] = list(self.weights)
        if self.share != 1.0:
            d["share"] = self.share
        return d


def ids_to_prompt(ids: np.ndarray, is_text: bool, id_range: tuple[int, int]) -> str | tuple[int, ...]:
    """Token ids as a prompt tuple, or (text) word indices as words joined by spaces."""
    if is_text:
        return " ".join(WORDS[i] for i in ids.tolist())
    lo, hi = id_range
    # Shared int objects: a long prompt costs one pointer per token, not one int object (see prompts.py).
    return tuple(_id_objects(lo, hi)[ids - lo].tolist())


@dataclass(slots=True)
class _Turns:
    """Flat per-turn columns before prompts exist."""

    start: np.ndarray  # index of the arrival that started the session
    turn: np.ndarray  # 0-based turn number
    times_s: np.ndarray
    user: np.ndarray  # new user tokens
    output: np.ndarray
    think_s: np.ndarray  # think time before the turn (0 for a first turn)


def _expand(sched: Schedule, classes: Sequence[RequestClass], sessions: SessionSpec | None,
            prefix_len: np.ndarray, rng: np.random.Generator, reasoning: ReasoningSpec | None) -> _Turns:
    n = len(sched.times_s)
    if sessions is None:
        return _Turns(np.arange(n), np.zeros(n, np.int64), sched.times_s, sched.input_tokens, sched.output_tokens,
                      np.zeros(n))
    k = sessions.turns.sample(n, rng)
    later = k - 1
    # Later turns' lengths, drawn per class in session order, so a class's k-th draw is stable.
    user_later: list[np.ndarray] = [np.empty(0, np.int64)] * n
    out_later: list[np.ndarray] = [np.empty(0, np.int64)] * n
    for ci, c in enumerate(classes):
        members = np.flatnonzero(sched.class_index == ci)
        total = int(later[members].sum())
        if not total:
            continue
        u_all, o_all = c.input.sample(total, rng), c.output.sample(total, rng)
        bounds = np.concatenate([[0], np.cumsum(later[members])])
        for j, s in enumerate(members.tolist()):
            user_later[s] = u_all[bounds[j] : bounds[j + 1]]
            out_later[s] = o_all[bounds[j] : bounds[j + 1]]
    think = sessions.think.sample(int(later.sum()), rng)
    cols: list[list[Any]] = [[], [], [], [], [], []]
    cap = sessions.max_context_tokens
    pos = 0
    for s in range(n):
        user = np.concatenate([[sched.input_tokens[s]], user_later[s]]).tolist()
        out = np.concatenate([[sched.output_tokens[s]], out_later[s]]).tolist()
        t = float(sched.times_s[s])
        context = int(prefix_len[s])
        for j in range(int(k[s])):
            wait_s = float(think[pos + j - 1]) if j else 0.0
            if j:
                t += out[j - 1] * sessions.response_s_per_token + wait_s
            context += user[j]
            if cap is not None and context > cap:
                break
            for col, v in zip(cols, (s, j, t, user[j], out[j], wait_s), strict=True):
                col.append(v)
            context += out[j] - (reasoning.tokens(out[j]) if reasoning else 0)  # the answer, not its reasoning
        pos += int(later[s])
    return _Turns(np.array(cols[0], np.int64), np.array(cols[1], np.int64), np.array(cols[2], np.float64),
                  np.array(cols[3], np.int64), np.array(cols[4], np.int64), np.array(cols[5], np.float64))


def build_requests(
    sched: Schedule,
    classes: Sequence[RequestClass],
    *,
    sessions: SessionSpec | None,
    system_prompts: SystemPrompts | None,
    ss: np.random.SeedSequence,
    ss_prompt: np.random.SeedSequence,
    is_text: bool,
    id_range: tuple[int, int],
    num_requests: int | None,
    duration_s: float | None,
    ignore_eos: bool,
    pin_min_tokens: bool,
    reasoning: ReasoningSpec | None = None,
) -> list[RequestSpec]:
    """RequestSpecs in arrival order, with session turns expanded and prompts built (see `SessionSpec`
    and `SystemPrompts`). `ss` drives session shapes and group choice; `ss_prompt` the prompt content.
    `reasoning`: each request asks for that share of its answer as reasoning, and a session's next turn
    carries the previous answer without it (`slobench.workload.reasoning`)."""
    s_group, s_sess = ss.spawn(2)
    n = len(sched.times_s)
    group = np.full(n, -1, dtype=np.int64)
    prefix_len = np.zeros(n, dtype=np.int64)
    if system_prompts is not None:
        rng = np.random.default_rng(s_group)
        group = rng.choice(system_prompts.num_groups, size=n, p=system_prompts.popularity())
        prefix_len = np.asarray(system_prompts.lengths(), dtype=np.int64)[group]
        if system_prompts.share < 1.0:  # drawn after the groups: a spec without `share` keeps its draws
            alone = rng.random(n) >= system_prompts.share
            group[alone], prefix_len[alone] = -1, 0
    turns = _expand(sched, classes, sessions, prefix_len, np.random.default_rng(s_sess), reasoning)
    waits = sessions is not None and sessions.mode == "wait"
    # waiting, a session started within the run is planned whole: when its later turns leave is the server's
    started_s = turns.times_s[np.searchsorted(turns.start, turns.start)] if waits else turns.times_s
    keep = np.ones(len(turns.times_s), dtype=bool) if duration_s is None else started_s < duration_s
    order = np.flatnonzero(keep)[np.argsort(turns.times_s[keep], kind="stable")]
    if num_requests is not None:
        order = order[:num_requests]
    # Prompts in (session, turn) order, so a turn can extend its predecessor's prompt.
    s_prefix, s_body = ss_prompt.spawn(2)
    lo, hi = (0, len(WORDS)) if is_text else id_range
    prefixes: list[np.ndarray] = []
    if system_prompts is not None:
        r = np.random.default_rng(s_prefix)
        prefixes = [r.integers(lo, hi, size=m, dtype=np.int64) for m in system_prompts.lengths()]
    body = np.random.default_rng(s_body)
    prompts: dict[int, str | tuple[int, ...]] = {}
    context: dict[int, np.ndarray] = {}
    for i in sorted(order.tolist(), key=lambda i: (int(turns.start[i]), int(turns.turn[i]))):
        s = int(turns.start[i])
        prev = context.get(s)
        if prev is None:
            head = prefixes[group[s]] if group[s] >= 0 else np.empty(0, np.int64)
            ids = np.concatenate([head, body.integers(lo, hi, size=int(turns.user[i]), dtype=np.int64)])
        else:
            answered = int(turns.output[i - 1])  # i-1: the previous turn
            answer_and_user = answered - (reasoning.tokens(answered) if reasoning else 0) + int(turns.user[i])
            ids = np.concatenate([prev, body.integers(lo, hi, size=answer_and_user, dtype=np.int64)])
        if sessions is not None:
            context[s] = ids
        prompts[i] = ids_to_prompt(ids, is_text, id_range)
    out: list[RequestSpec] = []
    for rid, i in enumerate(order.tolist()):
        p = prompts[i]
        s = int(turns.start[i])
        n_out = int(turns.output[i])
        out.append(RequestSpec(
            request_id=rid, arrival_s=float(turns.times_s[i]), prompt=p,
            input_tokens=len(p) if isinstance(p, tuple) else len(p.split()), max_tokens=n_out,
            min_tokens=n_out if pin_min_tokens else None, ignore_eos=ignore_eos, tag=sched.tags[s],
            session_id=s if sessions is not None else None, turn=int(turns.turn[i]) if sessions is not None else None,
            think_s=float(turns.think_s[i]) if waits and turns.turn[i] > 0 else None,
            extra_body=reasoning.body(n_out) if reasoning else (),
        ))
    if not is_text:  # every id drawn from [lo, hi) above (prefixes, bodies): say so once, here
        drawn = (int(lo), int(hi))
        for sp in out:
            with_drawn_ids(sp, drawn)
    return out
