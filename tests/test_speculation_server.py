"""Speculative decoding seen by a client: `cobatch serve` with its defaults (drafts on), extractions
through the openai SDK with a JSON schema, and what each response's metrics, /metrics and /health
say of their drafts."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.server_fixtures import metric, scrape, serve_process, wait_until

pytestmark = pytest.mark.model

MODEL = "gemma-3-270m-Q4_K_M"
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string"}},
          "required": ["name", "age", "city"], "additionalProperties": False}
TEXTS = ["Tobias is a 34-year-old pilot who lives in Krakow.", "Ines is 71 and lives in Malmo.",
         "Oskar, a carpenter of 45, has a workshop in Bergen.", "Mara is 23; she studies in Lisbon."]


def test_drafts_are_counted_alike_per_response_in_metrics_and_in_health():
    with serve_process("--n-ctx", "2048", "--max-running", "4") as (_, url), \
            httpx.Client(base_url=url, timeout=60) as http, \
            openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        before = scrape(http)
        drafted = accepted = 0
        for text in TEXTS:
            chat = client.chat.completions.create(
                model=MODEL, temperature=0, max_tokens=48,
                messages=[{"role": "user", "content": f"Extract the person as JSON (name, age, city).\n\n{text}"}],
                response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
            assert json.loads(chat.choices[0].message.content).keys() == PERSON["properties"].keys()
            metrics = chat.model_extra["metrics"]  # cobatch's own, beside the standard usage
            assert 0 <= metrics["accepted_tokens"] <= metrics["drafted_tokens"]
            drafted += metrics["drafted_tokens"]
            accepted += metrics["accepted_tokens"]

        after: dict = {}

        def delta(name: str, **labels: str) -> float:
            return metric(after, name, **labels) - metric(before, name, **labels)

        def counted() -> bool:  # the stats are published as the step that answered ends
            nonlocal after
            after = scrape(http)
            return delta("cobatch_draft_tokens_total") == drafted and delta("cobatch_draft_tokens_accepted_total") == accepted

        wait_until(counted, 10, "/metrics did not count the responses' drafts")
        health = http.get("/health").json()["speculation"]

    # The extractions' values are drafted from their prompts' words, and most of those are kept.
    assert delta("cobatch_draft_tokens_total", source="prompt_words") > 0
    assert delta("cobatch_draft_tokens_accepted_total", source="prompt_words") >= \
        0.5 * delta("cobatch_draft_tokens_total", source="prompt_words")
    # Every drafted token is counted once, by source, in the responses (above), /metrics and /health alike.
    assert drafted > 0
    assert sum(health["drafted"].values()) == metric(after, "cobatch_draft_tokens_total")
    assert health["drafted"]["prompt_words"] == metric(after, "cobatch_draft_tokens_total", source="prompt_words")
    assert sum(health["accepted"].values()) == metric(after, "cobatch_draft_tokens_accepted_total")
    assert 0 < health["steps_with_drafts"] == metric(after, "cobatch_draft_steps_total")
    # A verification row per drafted token plus the sampling row of its sequence.
    assert health["verified_rows"] == metric(after, "cobatch_draft_verification_rows_total") > \
        sum(health["drafted"].values())
