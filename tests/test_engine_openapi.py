"""A schemathesis run over the engine's OpenAPI schema (/openapi.json): requests generated from the documented
schemas, valid ones and deliberately invalid ones, never get a 5xx, and every status and content type answered
is one the schema lists. (schemathesis' pytest plugin does not load under pytest 9, so its strategies are used
through hypothesis directly.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_engine.engine import LLMEngine
from reference_engine.server import build_app
from reference_engine.tokenizer import ByteTokenizer
from tests.test_engine_server import MODEL, make_engine

schemathesis = pytest.importorskip("schemathesis")
from schemathesis.checks import content_type_conformance, not_a_server_error, status_code_conformance  # noqa: E402

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance]


@pytest.fixture(scope="module")
def engine() -> Iterator[LLMEngine]:
    eng = make_engine(num_blocks=256, max_model_len=512)
    eng.start()  # ASGI calls run no lifespan
    try:
        yield eng
    finally:
        eng.stop()


@pytest.fixture(scope="module")
def api_schema(engine: LLMEngine) -> Any:
    schema = schemathesis.openapi.from_asgi("/openapi.json", build_app(engine, MODEL, ByteTokenizer()))
    ops = {f"{op.method.upper()} {op.path}" for op in (r.ok() for r in schema.get_all_operations())}
    assert {"POST /v1/completions", "POST /v1/chat/completions", "GET /v1/models"} <= ops
    return schema


@pytest.mark.parametrize("mode", ["positive", "negative"])
def test_engine_api_conforms_and_never_answers_5xx(api_schema: Any, engine: LLMEngine, mode: str) -> None:
    strategy = api_schema.as_strategy(generation_mode=schemathesis.GenerationMode(mode))
    statuses: set[int] = set()

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        case = data.draw(strategy)
        statuses.add(case.call_and_validate(checks=CHECKS).status_code)

    run()
    assert engine.is_healthy()
    assert statuses & {400} and (mode == "negative" or statuses & {200}), statuses
