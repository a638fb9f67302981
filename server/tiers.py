"""Which of the engine's two tiers a request is served in, from the fields clients send.

OpenAI's `service_tier` is the field ordinary clients know (the `openai` SDK has it as a
parameter): "priority" is the interactive tier, "flex" the batch tier, "auto" / "default" /
absent the route's default (on /v1/responses too), or the key's (server/tenants.py). cobatch's own `priority` ("interactive" | "batch") wins over it when
both are given. The route's default comes from `--default-tier` (docs/tiers.md says why
"auto" is interactive for chats, OpenAI's and Anthropic's, and batch for completions).
Anthropic's `service_tier` values ask for no tier of ours (server/anthropic_schemas.py).
"""
from __future__ import annotations

from server.errors import BadRequest
from server.validation import FieldReader

INTERACTIVE, BATCH = "interactive", "batch"
TIERS = (INTERACTIVE, BATCH)
DEFAULT_TIER_CHOICES = ("auto", INTERACTIVE, BATCH)

# OpenAI's names for the tier served, as its responses echo them.
SERVICE_TIER_OF = {INTERACTIVE: "priority", BATCH: "flex"}
_TIER_OF_SERVICE_TIER = {"priority": INTERACTIVE, "flex": BATCH}
_ROUTE_DEFAULT = ("auto", "default")

# Under --default-tier auto: routes a person waits on are interactive; the rest are scripts'.
CHAT_ROUTES = frozenset({"chat_completions", "messages", "responses"})


def route_default(setting: str, endpoint: str, key_default: str | None = None) -> str:
    """The tier a request on `endpoint` gets when it names none: its key's default tier (the keys
    file's `default_tier`, server/tenants.py) if it has one, else `--default-tier setting`'s."""
    if setting not in DEFAULT_TIER_CHOICES:
        raise ValueError(f"default tier must be one of {DEFAULT_TIER_CHOICES}, not {setting!r}")
    if key_default is not None:
        return key_default
    if setting != "auto":
        return setting
    return INTERACTIVE if endpoint in CHAT_ROUTES else BATCH


def read_tier(fields: FieldReader, default: str) -> str:
    """The tier named by `priority`, else by `service_tier`, else `default`."""
    service_tier = fields.string("service_tier", None, nullable=True)
    priority = fields.string("priority", None, choices=TIERS, nullable=True)
    if service_tier is not None and service_tier not in _ROUTE_DEFAULT and service_tier not in _TIER_OF_SERVICE_TIER:
        raise BadRequest(f"'service_tier' {service_tier!r} is not served here; send \"auto\", \"default\", "
                         "\"flex\" (the batch tier) or \"priority\" (the interactive tier)", param="service_tier")
    if priority is not None:
        return priority
    return _TIER_OF_SERVICE_TIER.get(service_tier or "auto", default)
