"""A replayed trace's sessions (BurstGPT's `Session ID`, Mooncake-style `session_id` or `chat_id` /
`parent_chat_id`, ShareGPT's conversations, slobench JSONL's `session_id`) as turns, and in the waiting mode
as turns that wait for the server.

Each request of a session gets its turn number, in the order the replay sends them (a session whose first
turns lie before the replay's window starts at the first one inside it). In the waiting mode, the default
for a trace with sessions, a session's first turn still arrives at the trace's (scaled) time, so sessions
arrive as the trace has them, and turn k+1 is sent when turn k's answer has ended plus a think time
(`slobench.run.session_plan`, the live runner's and the simulator's rule alike): the trace's (scaled) gap
between the two turns' arrivals, or, where the trace's turn times were made from a think time (ShareGPT,
whose times are synthetic), that think time. The gap held the traced server's own answer time, so a waiting
replay's sessions are never denser than the trace's; the turn's trace time stays its `arrival_s`, the
estimate its record keeps (`estimated_s`) to say how much later it left. `mode = "scheduled"` sends every
turn at its trace time, whether or not the previous answer has ended; a streamed replay
(`slobench.workload.trace_stream`) numbers its turns so, as the runner cannot hold back what it has not read."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace

from slobench.errors import SpecError
from slobench.run.records import RequestSpec, with_drawn_ids
from slobench.workload.sessions import SESSION_MODES

__all__ = ["check_session_mode", "session_turns"]


def check_session_mode(mode: str) -> None:
    if mode not in SESSION_MODES:
        raise SpecError("session_mode", mode, f"must be one of {list(SESSION_MODES)}")


def session_turns(specs: Iterable[RequestSpec], mode: str, think_s: float | None = None) -> Iterator[RequestSpec]:
    """`specs` (in arrival order) with each session's requests numbered by turn and, in the waiting mode
    (`mode` "wait"), each later turn's think time: `think_s` where the trace's times were made from one,
    else the gap between its arrival and its predecessor's. Requests of no session are left as they are;
    each is handed on as it comes (a streamed replay's too)."""
    check_session_mode(mode)
    last: dict[int, tuple[int, float]] = {}  # session -> (its latest turn, that turn's arrival)
    for sp in specs:
        sid = sp.session_id
        if sid is None:
            yield sp
            continue
        prev = last.get(sid)
        turn = 0 if prev is None else prev[0] + 1
        last[sid] = (turn, sp.arrival_s)
        wait_s = None
        if mode == "wait" and prev is not None:
            wait_s = think_s if think_s is not None else max(0.0, sp.arrival_s - prev[1])
        numbered = replace(sp, turn=turn, think_s=wait_s)
        if sp.ids_below is not None:  # the same drawn ids
            with_drawn_ids(numbered, (0, sp.ids_below))
        yield numbered
