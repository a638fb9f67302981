"""What the HTTP layer needs of an engine: `engine.Engine` in one process, or a proxy for one
elsewhere (server/cluster), typed once so the routes never reach past it."""
from __future__ import annotations

from pathlib import Path
from typing import Protocol

from engine import EngineStats, Request, RequestHandle


class ServedModel(Protocol):
    path: Path | str
    description: str
    chat_template: str | None
    token_bytes: tuple[bytes, ...]
    bos_token: int
    eos_token: int

    def tokenize(self, text: str, *, add_bos: bool = True, parse_special: bool = False) -> list[int]: ...

    def token_to_piece(self, token: int, *, special: bool = False) -> bytes: ...

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str: ...


class ServedEngine(Protocol):
    model: ServedModel
    n_ctx: int

    def submit(self, request: Request) -> RequestHandle:
        """Queue it, or raise one of engine.REFUSALS (nothing queued then)."""

    def submit_many(self, requests: list[Request]) -> list[RequestHandle]:
        """Queue all of them, or raise one of engine.REFUSALS with none queued."""

    def stats(self) -> EngineStats: ...

    def close(self, drain_timeout: float = 0.0) -> None: ...
