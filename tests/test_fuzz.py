"""A bounded OpenAPI fuzz run (schemathesis) against a real node: no server error, only documented statuses.

Every operation of the node's own OpenAPI document gets a fixed number of
generated requests, valid and invalid (derandomised, so a run is repeatable
and bounded); each answer must be below 500, carry a status the document lists
for that route, and have the documented content type.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import content_type_conformance, not_a_server_error, status_code_conformance
from schemathesis.core.result import Ok

from tests.conftest import running_node

pytestmark = [pytest.mark.node, pytest.mark.slow]

EXAMPLES = 60
OPERATIONS = [
    "POST /rollout/step",
    "POST /rollout/steps",
    "POST /sessions",
    "GET /sessions/{session_id}",
    "DELETE /sessions/{session_id}",
    "POST /sessions/{session_id}/fork",
    "GET /sessions",
    "POST /sessions/close",
    "POST /sessions/keepalive",
    "POST /sessions/status",
    "POST /sessions/{session_id}/timeout",
    "GET /runners",
    "GET /images",
    "GET /runners/{kind}",
    "GET /healthz",
    "GET /readyz",
    "GET /metrics",
    "POST /run_code",
    "GET /v1/ping",
    "POST /envs/{kind}/reset",
    "POST /envs/{kind}/step",
    "GET /envs/{kind}/state",
    "GET /envs/{kind}/health",
    "GET /envs/{kind}/metadata",
    "GET /envs/{kind}/schema",
    "POST /drain",
]
NOT_FUZZED = {"POST /drain"}  # it takes the node out of service for every later case (tests/test_gunicorn.py)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_node(
        runners='["python","tools","textgame","fake"]',
        workers=1,
        python__slots_per_worker=2,
        max_timeout_s=5,
        default_timeout_s=2,
        max_batch=16,
    ) as base:
        yield base


def test_the_document_names_every_operation(node: str) -> None:
    doc = httpx.get(f"{node}/openapi.json", timeout=30).json()
    found = [f"{m.upper()} {p}" for p, ops in doc["paths"].items() for m in ops]
    assert sorted(found) == sorted(OPERATIONS)


# Invalid input only where there is a body to break: path parameters are free-form strings.
CASES = [(label, GenerationMode.POSITIVE) for label in OPERATIONS if label not in NOT_FUZZED] + [
    (label, GenerationMode.NEGATIVE) for label in OPERATIONS if label.startswith("POST ") and label not in NOT_FUZZED
]


@pytest.mark.parametrize(("label", "mode"), CASES, ids=[f"{m.value}-{label}" for label, m in CASES])
def test_no_input_is_a_server_error(node: str, label: str, mode: GenerationMode) -> None:
    schema = schemathesis.openapi.from_dict(httpx.get(f"{node}/openapi.json", timeout=30).json())
    ops = []
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), f"the document has an invalid operation: {result}"
        ops.append(result.ok())
    (op,) = [o for o in ops if o.label == label]

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        case = data.draw(op.as_strategy(generation_mode=mode))
        response = case.call(base_url=node, timeout=60)
        case.validate_response(response, checks=[not_a_server_error, status_code_conformance, content_type_conformance])

    run()
