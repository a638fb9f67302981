"""Each tenant's limits (server/tenants.py), checked before anything is queued: requests in
flight, requests per minute and tokens per minute over a sliding 60-second window.

A request is charged its prompt tokens plus max_tokens (every choice's) when it is accepted, the
most it can compute, as OpenAI's limiter does; when it finishes the charge becomes its prompt
tokens plus the tokens it generated, so a generous max_tokens does not use up the minute.
A refusal is a 429 with OpenAI's headers (`x-ratelimit-limit-requests`, `-remaining-requests`,
`-reset-requests` and the `-tokens` set, each set for the limits the tenant has) and
`Retry-After` (and `retry-after-ms`, which the `openai` SDK reads first; for the in-flight limit,
paced per tenant by server/retry_pacing.py); a refused request leaves nothing behind: no charge,
no slot. An accepted one's answer carries the same headers, counted with its own charge, so a
client can pace itself before it is refused.

Called from the submit workers and the event loop: the state is guarded by one lock.
"""
from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from server.errors import TooManyRequests, retry_after
from server.retry_pacing import RetryPacer
from server.tenants import Limits, Tenant

WINDOW_S = 60.0
IN_FLIGHT, REQUESTS_PER_MINUTE, TOKENS_PER_MINUTE = "in_flight", "requests_per_minute", "tokens_per_minute"


class RateLimited(TooManyRequests):
    def __init__(self, message: str, reason: str, headers: dict[str, str]) -> None:
        super().__init__(message, code="rate_limit_exceeded", headers=headers)
        self.reason = reason  # which limit: IN_FLIGHT, REQUESTS_PER_MINUTE or TOKENS_PER_MINUTE


@dataclass
class _Usage:
    in_flight: int = 0
    window: collections.deque[list[float]] = field(default_factory=collections.deque)  # [accepted at, tokens]
    pacer: RetryPacer = field(default_factory=RetryPacer)


class Admission:
    """One accepted request's hold on its tenant's limits: `finish` once it has ended (or
    `refund` if it was not queued after all)."""

    def __init__(self, quotas: "Quotas", tenant: Tenant, entry: list[float] | None, prompt_tokens: int,
                 headers: dict[str, str]) -> None:
        self.headers = headers  # x-ratelimit-* as they stood once this request was charged
        self._quotas = quotas
        self._tenant = tenant
        self._entry = entry
        self._prompt_tokens = prompt_tokens
        self._open = True

    def finish(self, generated_tokens: int | None = None) -> None:
        """The request ended, having generated this many tokens (None: not known; the charge stays)."""
        self._quotas._close(self, None if generated_tokens is None else self._prompt_tokens + generated_tokens,
                            refund=False)

    def refund(self) -> None:
        """The request was refused after all (a full queue, a bad prompt): nothing is kept."""
        self._quotas._close(self, None, refund=True)


class Quotas:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._usage: dict[str, _Usage] = collections.defaultdict(_Usage)

    def admit(self, tenant: Tenant, prompt_tokens: Callable[[], int], max_new_tokens: int) -> Admission:
        """Take a place for one request of `tenant` or raise RateLimited. `prompt_tokens()` is
        called only when the tenant has a token limit (it may tokenize)."""
        limits = tenant.limits
        prompt = prompt_tokens() if limits.tokens_per_minute is not None else 0
        wanted = prompt + max_new_tokens if limits.tokens_per_minute is not None else 0
        with self._lock:
            usage = self._usage[tenant.name]
            now = self._clock()
            self._expire(usage, now)
            refusal = self._refusal(limits, usage, wanted, now)
            if refusal is not None:
                raise refusal
            entry = [now, float(wanted)] if limits.requests_per_minute or limits.tokens_per_minute else None
            if entry is not None:
                usage.window.append(entry)
            usage.in_flight += 1
            headers = self._headers(limits, usage, sum(e[1] for e in usage.window), now, None)
        return Admission(self, tenant, entry, prompt, headers)

    def refuse_early(self, tenant: Tenant) -> None:
        """Raise the RateLimited that `admit` would raise for any request of `tenant` whatever
        its size (in flight, requests per minute), taking nothing: a client sending past its
        limit then costs no chat rendering, tokenizing or worker thread per refusal. `admit`
        still decides for a request let through."""
        limits = tenant.limits
        if limits.max_in_flight is None and limits.requests_per_minute is None:
            return
        with self._lock:
            usage = self._usage[tenant.name]
            now = self._clock()
            self._expire(usage, now)
            refusal = self._refusal(limits, usage, 0, now, tokens=False)
        if refusal is not None:
            raise refusal

    def in_flight(self) -> dict[str, int]:
        """Tenant name → requests accepted and not yet finished."""
        with self._lock:
            return {name: u.in_flight for name, u in self._usage.items()}

    # ---- helpers ------------------------------------------------------------------------------
    def _close(self, admission: Admission, computed: int | None, refund: bool) -> None:
        with self._lock:
            if not admission._open:
                return
            admission._open = False
            usage = self._usage[admission._tenant.name]
            usage.in_flight -= 1
            usage.pacer.freed(self._clock())
            entry = admission._entry
            if entry is None:
                return
            if refund:
                try:
                    usage.window.remove(entry)
                except ValueError:
                    pass  # already out of the window
            elif computed is not None:
                entry[1] = float(computed)

    @staticmethod
    def _expire(usage: _Usage, now: float) -> None:
        while usage.window and usage.window[0][0] <= now - WINDOW_S:
            usage.window.popleft()

    def _refusal(self, limits: Limits, usage: _Usage, wanted: int, now: float,
                 tokens: bool = True) -> RateLimited | None:
        window = usage.window
        used = sum(e[1] for e in window)
        if limits.max_in_flight is not None and usage.in_flight >= limits.max_in_flight:
            reason, wait = IN_FLIGHT, usage.pacer.refused(now)
            message = f"this key has {usage.in_flight} requests in flight, its limit; retry when one has finished"
        elif limits.requests_per_minute is not None and len(window) >= limits.requests_per_minute:
            reason = REQUESTS_PER_MINUTE
            wait = window[len(window) - limits.requests_per_minute][0] + WINDOW_S - now
            message = f"this key's limit of {limits.requests_per_minute} requests per minute is reached"
        elif tokens and limits.tokens_per_minute is not None and used + wanted > limits.tokens_per_minute:
            reason = TOKENS_PER_MINUTE
            if wanted > limits.tokens_per_minute:
                wait = WINDOW_S
                message = (f"this request may compute {wanted} tokens (its prompt plus max_tokens), more than this "
                           f"key's limit of {limits.tokens_per_minute} per minute: lower max_tokens or shorten it")
            else:
                wait, freed = 0.0, 0.0
                for at, n in window:  # until enough of the window has expired for it to fit
                    freed += n
                    wait = at + WINDOW_S - now
                    if used - freed + wanted <= limits.tokens_per_minute:
                        break
                message = (f"this key's limit of {limits.tokens_per_minute} tokens per minute would be passed: "
                           f"{int(used)} used in the last minute, this request may compute {wanted} (its prompt "
                           "plus max_tokens)")
        else:
            return None
        headers = self._headers(limits, usage, used, now, reason)
        headers.update(retry_after(wait))
        return RateLimited(message, reason, headers)

    @staticmethod
    def _headers(limits: Limits, usage: _Usage, used: float, now: float, reason: str | None) -> dict[str, str]:
        """OpenAI's x-ratelimit-* headers for the limits the tenant has. Its `reset` is the time
        until the limit is back to its initial state: here, until the last charge leaves the window."""
        headers: dict[str, str] = {}
        window = usage.window
        full_reset = window[-1][0] + WINDOW_S - now if window else 0.0
        if reason == IN_FLIGHT or (limits.requests_per_minute is None and limits.max_in_flight is not None):
            assert limits.max_in_flight is not None  # a refusal for IN_FLIGHT needs its limit
            headers.update(_set("requests", limits.max_in_flight, limits.max_in_flight - usage.in_flight,
                                usage.pacer.wait_s if usage.in_flight >= limits.max_in_flight else 0.0))
        elif limits.requests_per_minute is not None:
            headers.update(_set("requests", limits.requests_per_minute, limits.requests_per_minute - len(window),
                                full_reset))
        if limits.tokens_per_minute is not None:
            headers.update(_set("tokens", limits.tokens_per_minute, int(limits.tokens_per_minute - used), full_reset))
        return headers


def _set(kind: str, limit: int, remaining: int, reset_s: float) -> dict[str, str]:
    return {f"x-ratelimit-limit-{kind}": str(limit), f"x-ratelimit-remaining-{kind}": str(max(0, remaining)),
            f"x-ratelimit-reset-{kind}": duration(reset_s)}


def duration(seconds: float) -> str:
    """OpenAI's spelling of a reset time: "20ms", "1s", "6m0s"."""
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    minutes, rest = divmod(seconds, 60)
    rest_text = f"{rest:.3f}".rstrip("0").rstrip(".")
    return f"{int(minutes)}m{rest_text}s" if minutes else f"{rest_text}s"
