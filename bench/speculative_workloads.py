"""The requests of `cobatch bench speculative`: six workloads, from output that repeats its input
to output drafts cannot guess, each request distinct (seeded by workload, trial, concurrency and
index) so that no server finds an earlier answer or prompt to reuse across trials.

Every request is rendered here once, as token ids: llama-server gets exactly those ids on
/v1/completions, and cobatch gets them there too, or, for the chat workloads, the messages on
/v1/chat/completions, whose rendering (cobatch's own, server/chat_format.py) gives the same ids.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any, Callable

WORDS = {
    "adjective": ["quiet", "old", "bright", "narrow", "busy", "green", "cold", "tall", "small", "red"],
    "noun": ["baker", "ferry", "lighthouse", "library", "market", "garden", "bridge", "school", "mill", "tower"],
    "place": ["harbour", "valley", "square", "river", "station", "hill", "forest", "village", "coast", "road"],
    "verb": ["opens", "closes", "waits", "shines", "rings", "fills", "empties", "turns", "sings", "rests"],
    "time": ["morning", "evening", "winter", "Sunday", "spring", "night", "summer", "week", "hour", "autumn"],
    "name": ["Mara", "Tobias", "Lena", "Oskar", "Ines", "Felix", "Nora", "Jonas", "Clara", "Emil", "Ada",
             "Hugo", "Rosa", "Paul", "Vera", "Otto"],
    "animal": ["fox", "owl", "rabbit", "badger", "heron", "mouse", "bear", "otter"],
    "city": ["Lisbon", "Oslo", "Turin", "Ghent", "Krakow", "Porto", "Lyon", "Bergen", "Graz", "Malmo"],
    "job": ["teacher", "nurse", "carpenter", "pilot", "farmer", "chemist", "librarian", "plumber"],
}

# Person extraction: the batch job's schema (every answer is checked against it).
PERSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"},
                   "occupation": {"type": "string"}},
    "required": ["name", "age", "city", "occupation"],
    "additionalProperties": False,
}

FUNCTIONS = [
    ("total_price", "def {name}(items, tax_rate):\n    subtotal = 0\n    for item in items:\n"
     "        subtotal += item.price * item.quantity\n    tax = subtotal * tax_rate\n"
     "    return round(subtotal + tax, 2)\n"),
    ("count_words", "def {name}(text):\n    counts = {{}}\n    for word in text.lower().split():\n"
     "        word = word.strip('.,;:!?')\n        if word:\n            counts[word] = counts.get(word, 0) + 1\n"
     "    return counts\n"),
    ("find_user", "def {name}(users, email):\n    for user in users:\n        if user.email == email:\n"
     "            return user\n    raise KeyError(f'no user with email {{email}}')\n"),
    ("moving_average", "def {name}(values, window):\n    result = []\n    for i in range(len(values) - window + 1):\n"
     "        chunk = values[i:i + window]\n        result.append(sum(chunk) / window)\n    return result\n"),
]


@dataclass(frozen=True)
class Ask:
    """One request, as every server gets it."""

    key: str  # workload/concurrency/trial/index: the same request across contenders
    prompt_ids: list[int]  # BOS first
    messages: list[dict[str, Any]] | None = None  # cobatch's chat route gets these (same ids)
    schema: dict[str, Any] | None = None  # the answer must be JSON valid against it
    ignore_eos: bool = True


@dataclass(frozen=True)
class Workload:
    name: str
    label: str
    drafts_pay: bool  # output repeats input or itself: the 1.5x target at C=1
    make: Callable[[random.Random, "Renderer"], Ask] = field(repr=False)
    json_job: bool = False  # the batch job: its own request counts, validity checked

    def asks(self, renderer: "Renderer", concurrency: int, trial: int, count: int) -> list[Ask]:
        out = []
        for i in range(count):
            key = f"{self.name}/c{concurrency}/t{trial}/{i}"
            ask = self.make(random.Random(key), renderer)
            out.append(Ask(key, ask.prompt_ids, ask.messages, ask.schema, ask.ignore_eos))
        return out


class Renderer:
    """Token ids of plain prompts and of chats, as cobatch renders them for the served model."""

    def __init__(self, model: Any) -> None:
        from server.chat_setup import chat_formatter_for

        self.model = model
        self.chat = chat_formatter_for(model)

    def plain(self, text: str) -> Ask:
        return Ask("", self.model.tokenize(text, add_bos=True))

    def chat_ask(self, messages: list[dict[str, Any]], schema: dict[str, Any] | None = None) -> Ask:
        from server.chat_messages import parse_messages

        ids = self.chat.render(parse_messages(messages)).token_ids
        return Ask("", list(ids), messages, schema, ignore_eos=schema is None)


def _sentence(rng: random.Random) -> str:
    w = {k: rng.choice(v) for k, v in WORDS.items()}
    return f"The {w['adjective']} {w['noun']} by the {w['place']} {w['verb']} every {w['time']}."


def paragraph(rng: random.Random, renderer: Renderer) -> Ask:
    text = " ".join(_sentence(rng) for _ in range(9))
    return renderer.plain(f"Repeat the following paragraph exactly, word for word.\n\nParagraph:\n{text}\n\n"
                          "Repeated paragraph:\n")


def open_story(rng: random.Random, renderer: Renderer) -> Ask:
    name, animal, place = rng.choice(WORDS["name"]), rng.choice(WORDS["animal"]), rng.choice(WORDS["place"])
    return renderer.plain(f"Write a long story for children.\n\nOnce upon a time, near a {place}, there lived "
                          f"a {animal} named {name}.")


def rename_function(rng: random.Random, renderer: Renderer) -> Ask:
    old, body = rng.choice(FUNCTIONS)
    new = f"{rng.choice(['compute', 'get', 'build', 'make'])}_{old.split('_', 1)[1]}_{rng.randint(2, 99)}"
    code = body.format(name=old)
    return renderer.plain(f"Here is a Python function:\n\n```python\n{code}```\n\nRewrite it with the function "
                          f"renamed from `{old}` to `{new}`, changing nothing else.\n\n```python\n")


def json_rows(rng: random.Random, renderer: Renderer) -> Ask:
    start = rng.randint(1, 900)
    rows = [json.dumps({"id": start + i, "name": rng.choice(WORDS["name"]), "city": rng.choice(WORDS["city"]),
                        "age": rng.randint(18, 90), "job": rng.choice(WORDS["job"])}) for i in range(6)]
    return renderer.plain("people.jsonl, one JSON object per line:\n" + "\n".join(rows) + "\n")


def agent_echo(rng: random.Random, renderer: Renderer) -> Ask:
    topic = rng.choice(WORDS["noun"])
    report = "\n".join(f"- {_sentence(rng)}" for _ in range(7))
    messages = [
        {"role": "system", "content": "You are an assistant that reads files with tools."},
        {"role": "user", "content": f"What does the {topic} report say?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "read_file", "arguments": json.dumps({"path": f"reports/{topic}.txt"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": f"Report on the {topic}:\n{report}"},
        {"role": "user", "content": "Restate the tool result above word for word, every line."},
    ]
    return renderer.chat_ask(messages)


def person_json(rng: random.Random, renderer: Renderer) -> Ask:
    name, city, job, age = (rng.choice(WORDS["name"]), rng.choice(WORDS["city"]), rng.choice(WORDS["job"]),
                            rng.randint(18, 90))
    text = f"{name} is a {age}-year-old {job} who lives in {city}."
    messages = [{"role": "user", "content": "Extract the person as JSON with the fields name, age, city and "
                                            f"occupation.\n\n{text}"}]
    return renderer.chat_ask(messages, PERSON_SCHEMA)


WORKLOADS = [
    Workload("paragraph", "repeat a paragraph", True, paragraph),
    Workload("story", "open story", True, open_story),
    Workload("rename", "rewrite a function, one name changed", False, rename_function),
    Workload("json-rows", "continue JSON rows", False, json_rows),
    Workload("agent-echo", "agent loop, tool result restated", False, agent_echo),
    Workload("json-job", "JSON batch job with a schema", False, person_json, json_job=True),
]
