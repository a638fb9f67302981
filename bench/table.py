"""Markdown tables for benchmark output."""
from __future__ import annotations


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    def cell(v: object) -> str:
        return f"{v:.2f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)
