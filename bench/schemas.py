"""Schemas shared by benchmarks and tests."""

# The product spec's review schema: rating 1-5, pros, cons, summary.
REVIEW_SCHEMA = {
    "type": "object",
    "properties": {
        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
        "pros": {"type": "array", "items": {"type": "string"}},
        "cons": {"type": "array", "items": {"type": "string"}},
        "summary": {"type": "string"},
    },
    "required": ["rating", "pros", "cons", "summary"],
}

# A record whose structure outweighs its free text: fixed keys, enums, numbers and a boolean.
ORDER_SCHEMA = {
    "type": "object",
    "properties": {
        "order_id": {"type": "integer", "minimum": 1, "maximum": 99999},
        "status": {"enum": ["pending", "shipped", "delivered", "cancelled"]},
        "country": {"enum": ["France", "Germany", "Italy", "Spain"]},
        "express_delivery": {"type": "boolean"},
        "quantity": {"type": "integer", "minimum": 1, "maximum": 9},
        "gift_wrapped": {"type": "boolean"},
    },
    "required": ["order_id", "status", "country", "express_delivery", "quantity", "gift_wrapped"],
}

# For benchmarks that take --schema: name -> (schema, what the prompt asks for).
NAMED = {"review": (REVIEW_SCHEMA, "a JSON product review"), "order": (ORDER_SCHEMA, "a JSON order record")}
