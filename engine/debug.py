"""Debug mode: the engine checks its own rules as it runs, at a cost no server should pay.

On when `COBATCH_DEBUG_CHECKS=1` is in the environment as `engine` is imported (the test suite
sets it, so every test, with the real model or the fake backend, runs checked): every write to
an object owned by one thread comes from that thread (engine/ownership.py), and after every
step the KV cache's invariants hold (`KvCache.check`, which checks the block ledger's too).
"""
from __future__ import annotations

import os

ENABLED = os.environ.get("COBATCH_DEBUG_CHECKS", "") not in ("", "0")
