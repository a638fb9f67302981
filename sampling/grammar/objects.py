"""Object keywords beyond properties / required: patternProperties, dependencies /
dependentRequired, and the key automaton for extra members.

Dependencies are rewritten into an `anyOf` of plain object schemas, one per subset of the
optional trigger properties present (triggers absent are forbidden, triggers present bring
their dependent properties or schema along): the variants are disjoint, so anyOf is exact.
"""
from __future__ import annotations

import itertools
import re

from . import ir, utf8
from .errors import SchemaError, unsupported

MAX_TRIGGERS = 4          # 2**4 variants at most
_RAW = [(0x20, 0x21), (0x23, 0x5B), (0x5D, utf8.MAX_CP)]   # characters JSON lets us write unescaped


def dependency_variants(schema: dict, ptr: str) -> list[dict] | None:
    """None when the schema has no dependencies; else object schemas whose union it is."""
    deps: dict[str, object] = {}
    for key in ("dependentRequired", "dependencies"):
        v = schema.get(key)
        if v is None:
            continue
        if not isinstance(v, dict):
            raise SchemaError(f"{key!r} at {ptr or '/'} must be an object")
        for name, dep in v.items():
            if isinstance(dep, list):
                if not all(isinstance(d, str) for d in dep):
                    raise SchemaError(f"{key!r} at {ptr or '/'}: {name!r} must list property names")
            elif key == "dependentRequired" or not isinstance(dep, (dict, bool)):
                raise SchemaError(f"{key!r} at {ptr or '/'}: {name!r} must be an array (or a schema)")
            deps.setdefault(name, [])
            deps[name] = deps[name] + [dep]
    if not deps:
        return None
    base = {k: v for k, v in schema.items() if k not in ("dependentRequired", "dependencies")}
    base["type"] = "object"
    required = list(base.get("required", []))
    if not isinstance(base.get("required", []), list):
        raise SchemaError(f"'required' at {ptr or '/'} must be an array of strings")
    # Required triggers always bring their dependencies; optional ones are enumerated.
    always, optional = [], []
    for name in deps:
        (always if name in required else optional).append(name)
    if len(optional) > MAX_TRIGGERS:
        raise unsupported("dependencies", ptr, f"more than {MAX_TRIGGERS} optional trigger properties")
    variants = []
    for present in itertools.product((False, True), repeat=len(optional)):
        on = always + [n for n, p in zip(optional, present) if p]
        off = [n for n, p in zip(optional, present) if not p]
        v = dict(base)
        props = dict(v.get("properties", {}))
        for name in off:
            props[name] = False
        v["properties"] = props
        req = list(required)
        extra_schemas = []
        for name in on:
            req.append(name)
            for dep in deps[name]:
                if isinstance(dep, list):
                    req.extend(dep)
                else:
                    extra_schemas.append(dep)
        v["required"] = list(dict.fromkeys(req))
        if any(s is False for s in extra_schemas):
            continue
        extra_schemas = [s for s in extra_schemas if s is not True]
        if extra_schemas:
            v = {"allOf": [v, *extra_schemas]}
        variants.append(v)
    return variants


def pattern_entries(schema: dict, ptr: str) -> list[tuple[str, object]]:
    pp = schema.get("patternProperties", {})
    if not isinstance(pp, dict):
        raise SchemaError(f"'patternProperties' at {ptr or '/'} must be an object")
    for p in pp:
        try:
            re.compile(p)
        except re.error as e:
            raise SchemaError(f"invalid patternProperties regex {p!r} at {ptr or '/'}: {e}") from None
    return list(pp.items())


def matching(name: str, patterns: list[tuple[str, object]]) -> list[object]:
    """Schemas of the patterns that `name` matches (JSON Schema: unanchored search)."""
    return [s for p, s in patterns if re.search(p, name)]


def literal_prefix(pattern: str) -> str | None:
    """'^abc' -> 'abc' (a pattern matching exactly the keys with that prefix); else None."""
    m = re.fullmatch(r"\^((?:[A-Za-z0-9_ ,;:@!%&'<>=/-]|\\[.$-])*)", pattern)
    return None if m is None else re.sub(r"\\(.)", r"\1", m.group(1))


def key_not_in(names: list[str], prefixes: tuple[str, ...] = ()) -> object:
    """A quoted key of unescaped characters that differs from every name and starts with none
    of the prefixes (so an extra member never repeats a declared one, nor falls under a
    patternProperties prefix)."""
    trie: dict = {}
    for word, kind in [(n, "name") for n in names] + [(p, "prefix") for p in prefixes]:
        if all(any(lo <= ord(c) <= hi for lo, hi in _RAW) for c in word):
            node = trie
            for c in word:
                if node.get(None) == "prefix":
                    break
                node = node.setdefault(ord(c), {})
            else:
                if kind == "prefix":
                    node.clear()
                node[None] = kind if node.get(None) != "prefix" else "prefix"
    any_raw = ir.Repeat(ir.chars(_RAW), 0, None)
    alts = []

    def visit(node: dict, prefix: list) -> None:
        if node.get(None) == "prefix":
            return
        if None not in node:
            alts.append(ir.seq(*prefix))
        children = [c for c in node if c is not None]
        others = utf8.subtract(_RAW, [(c, c) for c in children])
        alts.append(ir.seq(*prefix, ir.chars(others), any_raw))
        for c in children:
            visit(node[c], prefix + [ir.chars([(c, c)])])

    visit(trie, [])
    return ir.seq(ir.lit(b'"'), ir.alt(*alts), ir.lit(b'"'))
