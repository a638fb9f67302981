"""`POST /v1/web/validate` {"schema", "instance"}: whether a document is valid against a JSON
Schema, checked with the `jsonschema` package, independently of the grammar that generated it;
the playground marks a structured answer with it."""
from __future__ import annotations

from typing import Any

from jsonschema import exceptions, validators
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.errors import BadRequest
from server.validation import read_json_object

MAX_ERRORS = 5


async def validate(request: Request, max_body_bytes: int) -> Response:
    body = await read_json_object(request, max_body_bytes)
    unknown = sorted(set(body) - {"schema", "instance"})
    if unknown:
        raise BadRequest(f"unknown parameter {unknown[0]!r}", param=unknown[0])
    if not isinstance(body.get("schema"), (dict, bool)):
        raise BadRequest("schema must be a JSON Schema (an object or a boolean)", param="schema")
    if "instance" not in body:
        raise BadRequest("instance is required: the JSON document to check", param="instance")
    return JSONResponse(check(body["schema"], body["instance"]))


def check(schema: Any, instance: Any) -> dict[str, Any]:
    """{"valid", "errors": [{"path", "message"}], "checked_with"}; a schema that is not one is a 400."""
    cls = validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except exceptions.SchemaError as exc:
        raise BadRequest(f"schema is not a valid JSON Schema: {exc.message}", param="schema") from None
    found = sorted(cls(schema).iter_errors(instance), key=lambda e: list(e.absolute_path))[:MAX_ERRORS]
    errors = [{"path": "/" + "/".join(map(str, e.absolute_path)), "message": e.message} for e in found]
    return {"valid": not errors, "errors": errors, "checked_with": f"jsonschema {cls.__name__}"}
