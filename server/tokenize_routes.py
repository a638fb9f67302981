"""`POST /tokenize` and `POST /detokenize`, in llama-server's shapes.

    /tokenize    {"content": str, "add_special": false, "with_pieces": false}
                 -> {"tokens": [ids]}, or with pieces {"tokens": [{"id", "piece"}]} (a piece that
                 is not whole UTF-8 is a list of byte values, as llama-server gives it)
                 {"messages": [...], "tools"?: [...]} instead of content: the chat as
                 /v1/chat/completions renders it (with those tools), whose count is that route's
                 prompt_tokens
                 Both also answer "count" and "max_model_len" (vLLM's names).
                 vLLM's spelling is taken too: {"prompt": str, "add_special_tokens": true}, where
                 special tokens written in the text (<eos>) are read as such, as its tokenizers do.
    /detokenize  {"tokens": [ids]} -> {"content": str, "prompt": str} (llama-server's and vLLM's key)
    GET /tokenizer_info  vLLM's: {"eos_token", "bos_token", "pad_token", "chat_template",
                 "model_max_length"}. lm-evaluation-harness reads it with /tokenize and
                 /detokenize to use this server's tokenizer (its "remote" tokenizer backend).
"""
from __future__ import annotations

from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from server.chat_format import parse_messages
from server.context import ServerContext
from server.errors import BadRequest
from server.tools import parse_tools
from server.validation import FieldReader, read_json_object

MAX_TOKENS_PER_CALL = 1_000_000  # bounds one /detokenize call's work


async def tokenize(request: Request, ctx: ServerContext) -> Response:
    body = await read_json_object(request, ctx.settings.max_body_bytes)
    engine = ctx.require_engine()
    fields = FieldReader(body)
    content = fields.raw("content", None)
    messages = fields.raw("messages", None)
    # they are part of the rendered prompt
    tools = parse_tools(fields.raw("tools", None), None, None, ctx.tool_syntax())
    add_special = fields.boolean("add_special", False)
    with_pieces = fields.boolean("with_pieces", False)
    parse_special = add_special
    if fields.present("prompt") or fields.present("add_special_tokens"):  # vLLM's spelling
        if content is not None:
            raise BadRequest("send 'content' (llama-server's name) or 'prompt' (vLLM's), not both", param="prompt")
        content = fields.raw("prompt", None)
        add_special = fields.boolean("add_special_tokens", True, nullable=True)
        parse_special = True
    fields.finish()
    if (content is None) == (messages is None):
        raise BadRequest("send either 'content' (text) or 'messages' (a chat)", param="content")
    if tools is not None and messages is None:
        raise BadRequest("'tools' go with 'messages'", param="tools")
    if messages is not None:
        chat, parsed = ctx.state.chat, parse_messages(messages)
        assert chat is not None
        ids = (await run_in_threadpool(chat.render, parsed, tools)).token_ids
    else:
        if not isinstance(content, str):
            raise BadRequest("'content' must be a string", param="content")
        ids = await run_in_threadpool(engine.model.tokenize, content, add_bos=add_special, parse_special=parse_special)
    tokens: list[Any] = list(ids)
    if with_pieces:
        tokens = [{"id": t, "piece": _piece(engine.model.token_bytes[t])} for t in ids]
    return JSONResponse({"tokens": tokens, "count": len(ids), "max_model_len": engine.n_ctx})


def _piece(raw: bytes) -> str | list[int]:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


async def detokenize(request: Request, ctx: ServerContext) -> Response:
    body = await read_json_object(request, ctx.settings.max_body_bytes)
    engine = ctx.require_engine()
    fields = FieldReader(body)
    tokens = fields.raw("tokens", None)
    fields.finish()
    vocab = engine.model.token_bytes
    if (not isinstance(tokens, list) or len(tokens) > MAX_TOKENS_PER_CALL
            or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens)):
        raise BadRequest("'tokens' must be a list of token ids", param="tokens")
    bad = next((t for t in tokens if not 0 <= t < len(vocab)), None)
    if bad is not None:
        raise BadRequest(f"token id {bad} is outside the vocabulary (size {len(vocab)})", param="tokens")
    text = b"".join(vocab[t] for t in tokens).decode("utf-8", errors="replace")
    return JSONResponse({"content": text, "prompt": text})


async def tokenizer_info(request: Request, ctx: ServerContext) -> Response:
    engine = ctx.require_engine()
    model = engine.model

    def text(token: int) -> str | None:
        return None if token < 0 else model.token_to_piece(token, special=True).decode("utf-8", "replace")

    return JSONResponse({"eos_token": text(model.eos_token), "bos_token": text(model.bos_token), "pad_token": None,
                         "chat_template": model.chat_template, "model_max_length": engine.n_ctx,
                         "tokenizer_class": "llama.cpp"})
