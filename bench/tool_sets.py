"""Tool sets for `cobatch bench tools` and the tool-calling property test: functions whose
parameters are shaped like real-world schemas (JSONSchemaBench's kinds: API functions, config
files, records with nested objects, enums, arrays, formats, `$ref`s), written for this project.
`tool_sets(n, seed)` draws n sets of 1 to 4 distinct functions, each with a user prompt."""
from __future__ import annotations

import random
from typing import Any

_ADDRESS = {"type": "object", "properties": {
    "street": {"type": "string", "maxLength": 60}, "city": {"type": "string", "maxLength": 40},
    "postcode": {"type": "string", "pattern": "^[0-9]{4,6}$"}, "country": {"type": "string", "enum": ["FR", "DE", "US", "NO"]}},
    "required": ["city", "country"]}

FUNCTIONS: list[dict[str, Any]] = [
    {"name": "get_weather", "description": "Current weather for a city",
     "parameters": {"type": "object", "properties": {
         "city": {"type": "string", "maxLength": 40}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
         "required": ["city"]}},
    {"name": "search_web", "description": "Search the web",
     "parameters": {"type": "object", "properties": {
         "query": {"type": "string", "minLength": 1, "maxLength": 80},
         "max_results": {"type": "integer", "minimum": 1, "maximum": 20},
         "safe": {"type": "boolean"}}, "required": ["query"]}},
    {"name": "send_email", "description": "Send an email",
     "parameters": {"type": "object", "properties": {
         "to": {"type": "array", "items": {"type": "string", "format": "email"}, "minItems": 1, "maxItems": 3},
         "subject": {"type": "string", "maxLength": 60}, "body": {"type": "string", "maxLength": 200},
         "priority": {"enum": ["low", "normal", "high"]}}, "required": ["to", "subject"]}},
    {"name": "create_event", "description": "Add an event to the calendar",
     "parameters": {"type": "object", "properties": {
         "title": {"type": "string", "maxLength": 50}, "start": {"type": "string", "format": "date-time"},
         "duration_minutes": {"type": "integer", "minimum": 5, "maximum": 480, "multipleOf": 5},
         "attendees": {"type": "array", "items": {"type": "string", "format": "email"}, "maxItems": 4, "uniqueItems": True}},
         "required": ["title", "start"]}},
    {"name": "create_user", "description": "Register a customer",
     "parameters": {"type": "object", "properties": {
         "name": {"type": "string", "maxLength": 40}, "age": {"type": "integer", "minimum": 0, "maximum": 130},
         "email": {"type": "string", "format": "email"}, "address": _ADDRESS},
         "required": ["name", "email"]}},
    {"name": "place_order", "description": "Order products",
     "parameters": {"$defs": {"line": {"type": "object", "properties": {
         "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}, "quantity": {"type": "integer", "minimum": 1, "maximum": 99}},
         "required": ["sku", "quantity"]}},
         "type": "object", "properties": {
             "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}, "minItems": 1, "maxItems": 4},
             "express": {"type": "boolean"}, "ship_to": _ADDRESS}, "required": ["lines"]}},
    {"name": "convert_currency", "description": "Convert an amount of money",
     "parameters": {"type": "object", "properties": {
         "amount": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000000},
         "from": {"type": "string", "enum": ["EUR", "USD", "GBP", "NOK", "JPY"]},
         "to": {"type": "string", "enum": ["EUR", "USD", "GBP", "NOK", "JPY"]}}, "required": ["amount", "from", "to"]}},
    {"name": "set_thermostat", "description": "Set a room's temperature",
     "parameters": {"type": "object", "properties": {
         "room": {"type": "string", "enum": ["kitchen", "bedroom", "living room", "office"]},
         "celsius": {"type": "number", "minimum": 5, "maximum": 30}}, "required": ["room", "celsius"]}},
    {"name": "get_stock_price", "description": "Latest price of a stock",
     "parameters": {"type": "object", "properties": {"ticker": {"type": "string", "pattern": "^[A-Z]{1,5}$"}},
                    "required": ["ticker"]}},
    {"name": "translate", "description": "Translate text",
     "parameters": {"type": "object", "properties": {
         "text": {"type": "string", "maxLength": 120}, "target": {"type": "string", "enum": ["fr", "de", "es", "no", "ja"]},
         "formal": {"type": ["boolean", "null"]}}, "required": ["text", "target"]}},
    {"name": "book_flight", "description": "Book a flight",
     "parameters": {"type": "object", "properties": {
         "from": {"type": "string", "pattern": "^[A-Z]{3}$"}, "to": {"type": "string", "pattern": "^[A-Z]{3}$"},
         "date": {"type": "string", "format": "date"},
         "passengers": {"type": "array", "items": {"type": "object", "properties": {
             "name": {"type": "string", "maxLength": 40}, "seat": {"enum": ["window", "aisle", "any"]}},
             "required": ["name"]}, "minItems": 1, "maxItems": 3},
         "class": {"enum": ["economy", "business"]}}, "required": ["from", "to", "date"]}},
    {"name": "deploy_service", "description": "Deploy a container (Kubernetes-style spec)",
     "parameters": {"type": "object", "properties": {
         "name": {"type": "string", "pattern": "^[a-z][a-z0-9-]{0,30}$"}, "image": {"type": "string", "maxLength": 80},
         "replicas": {"type": "integer", "minimum": 1, "maximum": 10},
         "ports": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 65535}, "maxItems": 3},
         "env": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 40}, "maxProperties": 3}},
         "required": ["name", "image"]}},
    {"name": "file_issue", "description": "Open an issue in a repository",
     "parameters": {"type": "object", "properties": {
         "repo": {"type": "string", "pattern": "^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$"}, "title": {"type": "string", "maxLength": 80},
         "labels": {"type": "array", "items": {"enum": ["bug", "feature", "docs", "question"]}, "uniqueItems": True},
         "assignee": {"anyOf": [{"type": "string", "maxLength": 39}, {"type": "null"}]}}, "required": ["repo", "title"]}},
    {"name": "log_workout", "description": "Record a workout",
     "parameters": {"type": "object", "properties": {
         "kind": {"enum": ["run", "swim", "cycle", "lift"]}, "minutes": {"type": "integer", "minimum": 1, "maximum": 600},
         "distance_km": {"type": "number", "minimum": 0, "maximum": 300}, "day": {"type": "string", "format": "date"}},
         "required": ["kind", "minutes"]}},
    {"name": "lookup_order", "description": "Find an order by id",
     "parameters": {"type": "object", "properties": {"order_id": {"type": "string", "format": "uuid"}},
                    "required": ["order_id"]}},
    {"name": "rate_product", "description": "Rate a product",
     "parameters": {"type": "object", "properties": {
         "product": {"type": "string", "maxLength": 40}, "stars": {"type": "integer", "minimum": 1, "maximum": 5},
         "pros": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3},
         "cons": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 3}},
         "required": ["product", "stars"]}},
    {"name": "make_tree", "description": "Describe a folder tree",
     "parameters": {"$defs": {"node": {"type": "object", "properties": {
         "name": {"type": "string", "maxLength": 12},
         "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}, "required": ["name"]}},
         "type": "object", "properties": {"root": {"$ref": "#/$defs/node"}}, "required": ["root"]}},
    {"name": "get_time", "description": "The current time in a time zone",
     "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "enum": ["UTC", "Europe/Paris", "America/New_York", "Asia/Tokyo"]}}}},
    {"name": "list_files", "description": "List files in a folder", "parameters": {}},
    {"name": "set_reminder", "description": "Remind me of something",
     "parameters": {"type": "object", "properties": {
         "text": {"type": "string", "maxLength": 80}, "when": {"type": "string", "format": "date-time"},
         "repeat": {"oneOf": [{"const": "daily"}, {"const": "weekly"}, {"type": "null"}]}}, "required": ["text", "when"]}},
]

PROMPTS = [
    "What's the weather like in Oslo, and can you email Ana about the meeting?",
    "Book me something for tomorrow and tell me the details.",
    "I need to order two boxes of ABC-123 shipped to Paris.",
    "Please help me with my task using the tools you have.",
    "Convert 120 euros to dollars, then remind me to pay rent on the 1st.",
    "Deploy the web service with three replicas.",
    "Log my 30 minute run from this morning.",
    "Find order 0b5a8f2e-3c1d-4e7f-9a2b-6c8d0e1f2a3b and rate the kettle 4 stars.",
]


def tool_sets(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """n sets: {"tools": OpenAI tools list, "prompt": user message}; deterministic per seed."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        functions = rng.sample(FUNCTIONS, rng.randint(1, 4))
        out.append({"tools": [{"type": "function", "function": f} for f in functions],
                    "prompt": rng.choice(PROMPTS)})
    return out
