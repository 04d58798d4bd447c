"""Sessions that wait for the server: which turns leave on the schedule and which when their predecessor ends.

A session's later turn with `think_s` set (`RequestSpec`; the waiting session mode, slobench.workload.sessions)
is held back from the open-loop schedule. When turn k's request finishes, `next_turn` gives turn k+1 and the
time to send it: turn k's end plus the think time. Its prompt is rebuilt from what was actually sent and
answered: the conversation as sent for turn k, then a stand-in for the answer of the length the server
actually gave (its answer tokens: a reasoning model's reasoning is not resent), then the turn's new user
part. The stand-in is the planned answer's ids (or words), cut to the actual count or repeated past it:
deterministic, and the very prompt of the precomputed schedule whenever the server answered the planned
length. A turn that failed (any status but "ok") ends its session:
the later turns are not sent, and the failed record says why. Both the live runner and the simulator use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from slobench.run.records import RequestRecord, RequestSpec, with_drawn_ids
from slobench.workload.reasoning import answer_tokens

__all__ = ["SessionPlan"]


class SessionPlan:
    """The held-back turns of `specs`, by (session, turn), and each session's conversation as sent so far."""

    def __init__(self, specs: Sequence[RequestSpec]) -> None:
        self.later: dict[tuple[int, int], RequestSpec] = {}
        self.planned: dict[int, RequestSpec] = {}  # request id -> its spec as planned (the schedule's prompt)
        for sp in specs:
            if sp.session_id is not None and sp.turn is not None:
                self.planned[sp.request_id] = sp
                if sp.think_s is not None:
                    self.later[(sp.session_id, sp.turn)] = sp
        self.num_failed = 0  # sessions ended by a failed turn
        self.num_unsent = 0  # turns not sent because their session had ended by a failure

    @staticmethod
    def waits(specs: Sequence[RequestSpec]) -> bool:
        """Whether any turn of `specs` waits for its predecessor (the waiting session mode)."""
        return any(sp.think_s is not None for sp in specs)

    def first_turns(self, specs: Sequence[RequestSpec]) -> list[RequestSpec]:
        """The specs sent on the open-loop schedule: all but the held-back turns."""
        return [sp for sp in specs if sp.think_s is None]

    def next_turn(self, sent: RequestSpec, rec: RequestRecord) -> tuple[RequestSpec, float] | None:
        """The turn after `sent` (whose record `rec` has finished) and when to send it (run seconds), or
        None: the session ended (its last turn, or `rec` failed: the rest is dropped and counted)."""
        if sent.session_id is None or sent.turn is None:
            return None
        key = (sent.session_id, sent.turn + 1)
        nxt = self.later.pop(key, None)
        if nxt is None:
            return None
        if rec.status != "ok" or rec.done_s is None:
            self.num_failed += 1
            turn = key[1]
            while nxt is not None:  # this turn and every later one of the session: never sent
                self.num_unsent += 1
                turn += 1
                nxt = self.later.pop((key[0], turn), None)
            return None
        reasoned = min(rec.reasoning_tokens or 0, int(rec.output_tokens))  # not resent: the answer is
        prompt = self._rebuilt(sent, nxt, int(rec.output_tokens) - reasoned)
        spec = nxt if prompt is None else replace(
            nxt, prompt=prompt, input_tokens=len(prompt) if isinstance(prompt, tuple) else len(prompt.split()))
        if spec is not nxt and nxt.ids_below is not None:  # the same drawn ids, rearranged
            with_drawn_ids(spec, (0, nxt.ids_below))
        return spec, rec.done_s + float(nxt.think_s or 0.0)

    def _rebuilt(self, sent: RequestSpec, nxt: RequestSpec, answered: int) -> str | tuple[int, ...] | None:
        """`nxt`'s prompt with `answered` answer tokens after the conversation as `sent` carried it; None
        where the planned prompts do not nest as the generator builds them (sent unchanged)."""
        was = self.planned.pop(sent.request_id, sent)  # the planned spec `sent` stood for
        planned_prev, planned_next = _units(was.prompt), _units(nxt.prompt)
        planned_answer = answer_tokens(was)  # (its reasoning is not in the conversation)
        head = len(planned_prev) + planned_answer  # the previous prompt and its planned answer
        if len(planned_next) < head or planned_next[:len(planned_prev)] != planned_prev:
            return None
        answer = planned_next[len(planned_prev):head]
        if answered == planned_answer:
            stand_in = answer
        elif answered < len(answer) or not answer:
            stand_in = answer[:answered]
        else:
            stand_in = (answer * (answered // len(answer) + 1))[:answered]
        units = _units(sent.prompt) + stand_in + planned_next[head:]
        return " ".join(units) if isinstance(nxt.prompt, str) else tuple(units)


def _units(prompt: str | tuple[int, ...]) -> list:  # type: ignore[type-arg]
    """A prompt's tokens: token ids, or a text prompt's words (the generator's one word a token)."""
    return prompt.split() if isinstance(prompt, str) else list(prompt)
