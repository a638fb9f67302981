"""The generic tool prompt, for models whose template knows nothing of tools (the default Gemma 3
270M has no template at all). Messages with tools, calls and results become plain turns that
every chat style renders:

* The tools, as compact JSON (each `{"name", "description", "parameters"}` in the order and key
  order the client sent), and an instruction saying how to call them, are appended to the
  system turn (one is made when there is none):

      You can call these functions:
      [{"name":"get_weather","description":"...","parameters":{...}}]
      To call functions, answer with only this JSON, nothing before or after it:
      {"tool_calls":[{"name":"<function name>","arguments":{<arguments>}}]}

* An assistant message's calls are written exactly as the grammar produces them
  (`{"tool_calls":[{"name":"f","arguments":<the arguments text, verbatim>}]}`), after its
  content if it has any.
* A tool result is a user turn of its own: `Result of call <tool_call_id>:\\n<content>`.

The rendering is a pure function of the request, so an agent's next turn starts with the same
tokens as the last one and the prefix cache serves them.
"""
from __future__ import annotations

import json

from server.chat_messages import ChatMessage
from server.tools import ToolSet, calls_text

INSTRUCTION = ("To call functions, answer with only this JSON, nothing before or after it:\n"
               '{"tool_calls":[{"name":"<function name>","arguments":{<arguments>}}]}')


def tools_text(tools: ToolSet) -> str:
    declarations = [f.declaration() for f in tools.functions]
    return ("You can call these functions:\n" + json.dumps(declarations, separators=(",", ":"), ensure_ascii=False)
            + "\n" + INSTRUCTION)


def plain_turns(messages: list[ChatMessage], tools: ToolSet | None) -> list[ChatMessage]:
    """Role-and-content messages only (system, developer, user, assistant)."""
    out: list[ChatMessage] = []
    for m in messages:
        if m.role == "tool":
            out.append(ChatMessage("user", f"Result of call {m.tool_call_id}:\n{m.content}"))
        elif m.tool_calls:
            calls = calls_text([(c.name, c.arguments) for c in m.tool_calls])
            out.append(ChatMessage("assistant", f"{m.content}\n{calls}" if m.content else calls))
        else:
            out.append(ChatMessage(m.role, m.content))
    if tools is None:
        return out
    block = tools_text(tools)
    first_system = next((i for i, m in enumerate(out) if m.role in ("system", "developer")), None)
    if first_system is None:
        return [ChatMessage("system", block)] + out
    m = out[first_system]
    out[first_system] = ChatMessage(m.role, f"{m.content.strip()}\n\n{block}" if m.content.strip() else block)
    return out
