"""The OpenAI Agents SDK (`openai-agents`) against a real `cobatch serve`, on its default model,
the Responses API: an Agent with a function tool run by `Runner.run` and `Runner.run_streamed`; an
Agent with a structured `output_type` (text.format json_schema); an Agent with both, whose run
calls the tool and then answers in the format (tools and text.format in one request); and a run
that continues another by `previous_response_id`, sending only the tool's output while the server
supplies the rest from the stored response."""
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


INSTRUCTIONS = "Look up the weather for the city the user names."


def weather_agent(url: str) -> Agent:
    # tool_choice "required": the turn calls the tool, once; stop_on_first_tool: the tool's output
    # is the run's final output (the small test model does not reliably end a free-text turn
    # within its budget).
    return Agent(name="weather", instructions=INSTRUCTIONS, tools=[get_weather],
                 tool_use_behavior="stop_on_first_tool", model=model_for(url),
                 model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, temperature=0,
                                              max_tokens=60))


def reporter(url: str) -> Agent:
    """Reads the weather agent's turn and answers a Forecast: the same instructions and tools
    (so the same prompt prefix), none of them callable (the answer must be the forecast)."""
    return Agent(name="reporter", instructions=INSTRUCTIONS, tools=[get_weather], output_type=Forecast,
                 model=model_for(url), model_settings=ModelSettings(tool_choice="none", temperature=0, max_tokens=80))


def forecaster(url: str) -> Agent:
    return Agent(name="forecaster", instructions="Give a forecast for the city the user names.",
                 output_type=Forecast, model=model_for(url),
                 model_settings=ModelSettings(temperature=0, max_tokens=80))


def check_tool_run(result, asked_before: int) -> None:
    assert len(CITIES_ASKED) == asked_before + 1  # the tool ran once
    assert result.final_output == f"The sky over {CITIES_ASKED[-1]} is clear."
    assert [item.type for item in result.new_items] == ["tool_call_item", "tool_call_output_item"]
    (response,) = result.raw_responses
    assert response.response_id.startswith("resp_")


def test_runner_run_calls_the_function_tool(server):
    before = len(CITIES_ASKED)
    check_tool_run(asyncio.run(Runner.run(weather_agent(server), "What is the weather in Paris?", max_turns=2)),
                   before)


def test_runner_run_streamed_calls_the_function_tool(server):
    async def run():
        streamed = Runner.run_streamed(weather_agent(server), "What is the weather in Rome?", max_turns=2)
        return streamed, [event async for event in streamed.stream_events()]

    before = len(CITIES_ASKED)
    streamed, events = asyncio.run(run())
    check_tool_run(streamed, before)
    raw = [e.data.type for e in events if e.type == "raw_response_event"]
    assert raw[0] == "response.created" and raw[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in raw


def test_an_output_type_is_parsed_from_a_json_schema_answer(server):
    result = asyncio.run(Runner.run(forecaster(server), "Forecast for Lisbon, please.", max_turns=2))
    assert isinstance(result.final_output, Forecast) and result.final_output.city
    assert len(result.raw_responses) == 1


def test_an_agent_with_a_tool_and_an_output_type_calls_then_answers_in_the_format(server):
    """Turn 1 is required to call (its format does not apply); the SDK then resets tool_choice, and
    turn 2 sends the tool and the format under auto: the answer is a call or a Forecast. The
    small model would call again and again, so turn 2's `tool` token after `{"` is biased away
    (turn 1's call opening is forced by the grammar, not sampled, so the bias does not touch it)."""
    import httpx

    tool_token = httpx.post(f"{server}/tokenize", json={"content": '{"tool_calls":['}).json()["tokens"][1]
    assert httpx.post(f"{server}/detokenize", json={"tokens": [tool_token]}).json()["content"] == "tool"
    agent = Agent(name="forecaster", instructions="Look up the weather for the city the user names, then answer "
                  "with a forecast.", tools=[get_weather], output_type=Forecast, model=model_for(server),
                  model_settings=ModelSettings(tool_choice="required", parallel_tool_calls=False, temperature=0,
                                               max_tokens=80, extra_body={"logit_bias": {str(tool_token): -100}}))
    before = len(CITIES_ASKED)
    result = asyncio.run(Runner.run(agent, "What is the weather in Lisbon?", max_turns=3))
    assert isinstance(result.final_output, Forecast) and result.final_output.city
    assert len(CITIES_ASKED) == before + 1  # the tool ran once
    assert [item.type for item in result.new_items] == ["tool_call_item", "tool_call_output_item",
                                                         "message_output_item"]
    first, second = result.raw_responses
    answer = [o for o in second.output if o.type == "message"]
    assert Forecast.model_validate_json(answer[0].content[0].text) == result.final_output
    stored = httpx.get(f"{server}/v1/responses/{second.response_id}").json()  # what turn 2 asked for
    assert stored["text"]["format"]["type"] == "json_schema" and stored["tool_choice"] == "auto"
    assert [t["name"] for t in stored["tools"]] == ["get_weather"]
    assert httpx.get(f"{server}/v1/responses/{first.response_id}").json()["tool_choice"] == "required"


def test_a_run_continues_another_by_previous_response_id(server):
    """The tool's output goes to a second agent that sends only it, chained to the first run's
    stored response: the server supplies the question and the call, and the first turn's prompt
    comes from the prefix cache."""
    looked_up = asyncio.run(Runner.run(weather_agent(server), "What is the weather in Oslo?", max_turns=2))
    call_output = looked_up.new_items[-1].raw_item
    result = asyncio.run(Runner.run(reporter(server), [call_output], max_turns=2,
                                    previous_response_id=looked_up.last_response_id))
    assert isinstance(result.final_output, Forecast) and result.final_output.city
    (first,), (second,) = looked_up.raw_responses, result.raw_responses
    assert second.usage.input_tokens > first.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens // 16 * 16 > 0  # whole blocks
