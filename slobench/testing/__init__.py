"""Test helpers shipped with slobench: a scheduled-token OpenAI-compatible server and a way to run it.

`TokenServerProcess` runs `python -m slobench.testing.token_server` in a child process (its own core and
event loop, like a real server) and waits for its `LISTENING <port>` line with a bounded deadline
(see `slobench.testing.process.ServerProcess`, which also runs the bundled engine).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slobench.testing.process import EngineServerProcess, ServerProcess

__all__ = ["EngineServerProcess", "ServerProcess", "TokenServerProcess"]


class TokenServerProcess(ServerProcess):
    """Start with `with TokenServerProcess(ttft_ms=50, itl_ms=5) as srv: srv.base_url ...`.

    `log=True` gives the server a per-request log in a temporary file; `read_log()` returns its lines.
    """

    name = "token server"

    def __init__(
        self,
        *,
        ttft_ms: float = 50.0,
        itl_ms: float = 5.0,
        model: str = "test-model",
        serve_models: bool = True,
        log: bool | str | Path = False,
        quirks: Sequence[str] = (),
        vocab: int | None = None,
        max_model_len: int | None = None,
        reasoning_tokens: int = 0,
        reasoning_field: str = "reasoning_content",
        host: str = "127.0.0.1",
        startup_timeout_s: float = 15.0,
    ) -> None:
        args = [
            "-m", "slobench.testing.token_server", "--host", host, "--port", "0",
            "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms), "--model", model,
        ]
        super().__init__(args, host=host, startup_timeout_s=startup_timeout_s)
        self.model = model
        if not serve_models:
            self._args.append("--no-models")
        for q in quirks:
            self._args += ["--quirk", q]
        if vocab is not None:  # the small-vocab quirk's vocabulary size
            self._args += ["--vocab", str(vocab)]
        if max_model_len is not None:  # the max-model-len quirk's context
            self._args += ["--max-model-len", str(max_model_len)]
        if reasoning_tokens:  # the reasoning mode: a chat answer's first tokens are reasoning
            self._args += ["--reasoning-tokens", str(reasoning_tokens), "--reasoning-field", reasoning_field]
        self.log_path: Path | None = (self.tmp_path / "server.jsonl") if log is True else (Path(log) if log else None)
        if self.log_path is not None:
            self._args += ["--log", str(self.log_path)]

    def read_log(self) -> list[dict[str, Any]]:
        """The server's per-request lines so far (a stream's line is on disk before its `[DONE]` is sent)."""
        if self.log_path is None:
            raise RuntimeError("this server was started without log=True")
        if not self.log_path.exists():
            return []
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line.strip()]
