"""A few real-world-shaped schemas with test instances, for `cobatch bench schemas --quick`
(written for this project in the style of JSONSchemaBench's records; no dataset download)."""

SAMPLES = [
    {"name": "tool-call", "category": "function-calls", "schema": {
        "type": "object", "properties": {
            "location": {"type": "string", "description": "City"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["location"]},
     "tests": [{"data": {"location": "Paris", "unit": "celsius"}, "valid": True},
               {"data": {"unit": "celsius"}, "valid": False},
               {"data": {"location": "Oslo", "unit": "kelvin"}, "valid": False}]},
    {"name": "required-undeclared", "category": "function-calls", "schema": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]},
     "tests": [{"data": {"b": 1}, "valid": True}, {"data": {"a": 1}, "valid": False}]},
    {"name": "vendor-keywords", "category": "store", "schema": {
        "$schema": "http://json-schema.org/draft-04/schema#", "id": "http://example.com/pkg.json",
        "type": "object", "x-generator": "tool", "additionalProperties": False,
        "properties": {"name": {"type": "string", "pattern": "^[a-z][a-z0-9-]*$", "maxLength": 40},
                       "homepage": {"type": "string", "format": "uri"},
                       "version": {"type": "string", "_format": "semver"}},
        "patternProperties": {"^x-": {}},
        "required": ["name"]},
     "tests": [{"data": {"name": "pkg", "homepage": "https://example.com"}, "valid": True},
               {"data": {"name": "Pkg"}, "valid": False},
               {"data": {"name": "pkg", "x-extra": [1]}, "valid": True},
               {"data": {"name": "pkg", "other": 1}, "valid": False}]},
    {"name": "siblings", "category": "store", "schema": {
        "definitions": {"port": {"type": "integer", "minimum": 1, "maximum": 65535}},
        "type": "object", "properties": {
            "port": {"$ref": "#/definitions/port", "description": "listen port", "maximum": 9999},
            "mode": {"type": "string", "enum": ["a", "bb", "ccc"], "maxLength": 2}},
        "required": ["port"], "minProperties": 1},
     "tests": [{"data": {"port": 80, "mode": "bb"}, "valid": True},
               {"data": {"port": 10000}, "valid": False},
               {"data": {"port": 80, "mode": "ccc"}, "valid": False}]},
    {"name": "k8s-like", "category": "kubernetes", "schema": {
        "type": "object", "properties": {
            "apiVersion": {"type": ["string", "null"]},
            "kind": {"type": "string", "enum": ["Pod"]},
            "metadata": {"type": "object", "properties": {"labels": {
                "type": "object", "additionalProperties": {"type": "string"}}}},
            "ports": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "maxItems": 4}},
        "dependencies": {"ports": ["kind"]}},
     "tests": [{"data": {"kind": "Pod", "metadata": {"labels": {"app": "web"}}}, "valid": True},
               {"data": {"ports": [80]}, "valid": False},
               {"data": {"kind": "Pod", "ports": [80]}, "valid": True}]},
    {"name": "one-of", "category": "kubernetes", "schema": {
        "oneOf": [{"type": "string", "format": "date-time"},
                  {"type": "object", "properties": {"seconds": {"type": "integer", "minimum": 0}},
                   "required": ["seconds"], "additionalProperties": False},
                  {"type": "string", "maxLength": 3}]},
     "tests": [{"data": {"seconds": 3}, "valid": True}, {"data": "2024-01-02T03:04:05Z", "valid": True}]},
]
