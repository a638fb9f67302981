"""The OpenAI Agents SDK (`openai-agents`) against a real `cobatch serve`, on its default model,
the Responses API: an Agent with a function tool run by `Runner.run` (the whole conversation sent
each turn) and by `Runner.run_streamed`; a run that chains its turns with `previous_response_id`
(`auto_previous_response_id`), each turn sending only its new items and the server supplying the
rest from the stored responses; and an Agent with a structured `output_type` (text.format
json_schema). An agent with both tools and an output_type is refused for now: cobatch does not yet
combine a format with callable tools on any route (docs/responses-api.md)."""
from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel, Field

agents = pytest.importorskip("agents")  # the test extra installs it: setup.py
from agents import Agent, ModelSettings, Runner, function_tool, set_tracing_disabled  # noqa: E402
from agents.models.openai_responses import OpenAIResponsesModel  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402

from tests.server_fixtures import serve_process  # noqa: E402

pytestmark = pytest.mark.model

MODEL = "gemma-3-270m-Q4_K_M"
CITIES_ASKED: list[str] = []


class Forecast(BaseModel):
    city: str = Field(max_length=30)  # bounded: the JSON closes well within the output budget
    sky: str = Field(max_length=30)


@function_tool
def get_weather(city: str) -> str:
    """The current weather for a city.

    Args:
        city: The city's name.
    """
    CITIES_ASKED.append(city)
    return f"The sky over {city} is clear."


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    set_tracing_disabled(True)  # traces would be sent to OpenAI's servers
    with serve_process("--n-ctx", "4096", "--flash-attn", "off",
                       "--data-dir", str(tmp_path_factory.mktemp("agents-data"))) as (_, url):
        yield url


def model_for(url: str) -> OpenAIResponsesModel:
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
    return OpenAIResponsesModel(model=MODEL, openai_client=client)


def weather_agent(url: str) -> Agent:
    # tool_choice "required" makes the first turn call the tool; the SDK then resets it to auto
    # (reset_tool_choice) for the turn that reads the tool's output.
    return Agent(name="weather", instructions="Look up the weather, then report it in one sentence.",
                 tools=[get_weather], model=model_for(url),
                 model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=60))


def check_run(result, asked_before: int) -> None:
    assert isinstance(result.final_output, str) and result.final_output
    assert len(CITIES_ASKED) > asked_before  # the tool ran
    kinds = [item.type for item in result.new_items]
    assert "tool_call_item" in kinds and "tool_call_output_item" in kinds
    assert kinds.index("tool_call_item") < kinds.index("tool_call_output_item")
    assert all(r.response_id and r.response_id.startswith("resp_") for r in result.raw_responses)


def test_runner_run_calls_the_tool_and_returns_the_structured_output(server):
    before = len(CITIES_ASKED)
    result = asyncio.run(Runner.run(weather_agent(server), "What is the weather in Paris?", max_turns=4))
    check_run(result, before)
    # The turn after the tool call read the first turn from the prefix cache.
    assert result.raw_responses[-1].usage.input_tokens_details.cached_tokens > 0


def test_runner_run_streamed_gives_the_same_kind_of_run(server):
    async def run():
        streamed = Runner.run_streamed(weather_agent(server), "What is the weather in Rome?", max_turns=4)
        events = [event async for event in streamed.stream_events()]
        return streamed, events

    before = len(CITIES_ASKED)
    streamed, events = asyncio.run(run())
    check_run(streamed, before)
    raw = [e.data.type for e in events if e.type == "raw_response_event"]
    assert raw.count("response.created") == len(streamed.raw_responses)
    assert "response.function_call_arguments.delta" in raw and "response.output_text.delta" in raw


def test_a_run_chained_by_previous_response_id_sends_only_new_items(server):
    before = len(CITIES_ASKED)
    result = asyncio.run(Runner.run(weather_agent(server), "What is the weather in Oslo?", max_turns=4,
                                    auto_previous_response_id=True))
    check_run(result, before)
    first, last = result.raw_responses[0], result.raw_responses[-1]
    # The server rebuilt the conversation from the stored first turn: the same prompt, from the cache.
    assert last.usage.input_tokens > first.usage.input_tokens
    assert last.usage.input_tokens_details.cached_tokens > 0
    assert result.last_response_id == last.response_id


def test_an_output_type_is_parsed_from_a_json_schema_answer(server):
    agent = Agent(name="forecaster", instructions="Give a forecast for the city the user names.",
                  output_type=Forecast, model=model_for(server),
                  model_settings=ModelSettings(temperature=0, max_tokens=80))
    result = asyncio.run(Runner.run(agent, "Forecast for Lisbon, please.", max_turns=2))
    assert isinstance(result.final_output, Forecast) and result.final_output.city
    assert len(result.raw_responses) == 1
