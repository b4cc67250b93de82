"""Schemathesis fuzzes every route of the published OpenAPI schema against a tiny model over loopback: no 5xx, and
every error is a JSON body."""

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from mlx_spec.server.app import build_app
from mlx_spec.server.main import Running
from mlx_spec.server.openapi import schema as openapi_schema

pytestmark = pytest.mark.slow  # minutes: hundreds of requests, some of them generating

EXAMPLES = 25  # per route: the bound on the run (each is one request; a generating one is short, see MAX_TOKENS)
MAX_TOKENS = 8  # a reply's length when a request gives none

schema = schemathesis.openapi.from_dict(openapi_schema())


@pytest.fixture(scope="module")
def server(served_pair):
    with Running(build_app(served_pair, max_concurrency=2, max_tokens=MAX_TOKENS)) as srv:
        yield srv


def test_the_served_schema_is_the_one_fuzzed(server):
    assert httpx.get(server.url + "openapi.json").json() == openapi_schema()


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_no_route_answers_a_fuzzed_request_with_a_5xx_or_an_error_that_is_not_json(case, server):
    r = case.call(base_url=server.url.rstrip("/"), timeout=120)
    assert r.status_code < 500, r.text[:500]
    if r.status_code >= 400:
        assert r.headers["content-type"][0].startswith("application/json"), (r.status_code, r.text[:200])
        assert "error" in r.json()
