"""Which replica gets the next request: one policy code for the simulated fleet and the client-side router
(the policies: `Router`'s doc). The router keeps the in-flight counts itself: call `started(i, tokens)` when
a request goes to replica i (`pick` does not) and `finished(i, tokens)` when it ends, with the same token
weight.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from slobench.errors import SpecError

ROUTERS = ("least-outstanding", "least-tokens", "round-robin", "prefix-affinity", "prefix-balanced")
PREFIX_TOKENS = 64  # token-id prompts: the affinity key is this many leading ids
PREFIX_CHARS = 256  # text prompts: this many leading characters
BALANCE_SLACK = 4
BALANCE_RATIO = 1.5


def prefix_key(prompt: str | Sequence[int]) -> bytes:
    """The bytes a prompt's replica is hashed from: its head, as ids or as UTF-8 text."""
    if isinstance(prompt, str):
        return prompt[:PREFIX_CHARS].encode()
    return np.asarray(list(prompt[:PREFIX_TOKENS]), dtype=np.int64).tobytes()


class Router:
    """The policies:

      least-outstanding  fewest requests in flight (ties: lowest index), what most LLM load balancers do
      least-tokens       fewest tokens in flight: each request weighs its prompt plus its max_tokens, so one
                         long document counts for what it costs the replica, not as one request
      round-robin        in turn, blind to load
      prefix-affinity    a hash of the prompt's head, so requests sharing a prefix meet the same prefix cache;
                         blind to load, so the cost of affinity shows up as queueing
      prefix-balanced    the prefix's home unless it holds more than BALANCE_SLACK requests beyond the least
                         loaded replica and BALANCE_RATIO times as many; then the least loaded (SGLang's
                         cache-aware router balances alike)
    """

    def __init__(self, policy: str, num_replicas: int) -> None:
        if policy not in ROUTERS:
            raise SpecError("router", policy, f"must be one of {list(ROUTERS)}")
        if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
            raise SpecError("replicas", num_replicas, "must be an integer >= 1")
        self.policy = policy
        self.outstanding = [0] * num_replicas
        self.outstanding_tokens = [0] * num_replicas
        self.sent = [0] * num_replicas
        self._turn = 0

    @property
    def reads_prompts(self) -> bool:
        """Whether `pick` reads a prompt (its head: the prefix policies, among more than one replica)."""
        return len(self.outstanding) > 1 and self.policy.startswith("prefix")

    def pick(self, prompt: str | Sequence[int]) -> int:
        n = len(self.outstanding)
        if n == 1:
            return 0
        if self.policy == "round-robin":
            i = self._turn % n
            self._turn += 1
            return i
        if self.policy == "least-tokens":
            tok = self.outstanding_tokens
            return min(range(n), key=lambda k: (tok[k], k))
        out = self.outstanding
        least = min(range(n), key=lambda k: (out[k], k))
        if self.policy == "least-outstanding":
            return least
        home = zlib.crc32(prefix_key(prompt)) % n
        if self.policy == "prefix-balanced" and out[home] - out[least] > BALANCE_SLACK and (
            out[home] > BALANCE_RATIO * out[least]
        ):
            return least
        return home

    def started(self, i: int, tokens: int = 0) -> None:
        self.outstanding[i] += 1
        self.outstanding_tokens[i] += tokens
        self.sent[i] += 1

    def finished(self, i: int, tokens: int = 0) -> None:
        self.outstanding[i] -= 1
        self.outstanding_tokens[i] -= tokens
