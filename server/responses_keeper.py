"""Stored responses as the routes use them: every store call on a thread of its own, and no
response lost to a store that cannot write for a while.

A response that cannot be written (a full disk, a locked or read-only database) is held in
memory, found there by lookups, and written by a retry task as soon as the store takes writes
again; while any is held, new ones join them without waiting on the failing store. Only past
MAX_UNSAVED held responses is a new one not kept at all, and its answer says `"store": false`.
A store that cannot be read is a 503 for that request alone.
"""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Callable, TypeVar

from server.errors import ServiceUnavailable
from server.jobs.store_thread import StoreThread
from server.responses_store import ResponseStore, StoredResponse

log = logging.getLogger("cobatch.responses")

T = TypeVar("T")
MAX_UNSAVED = 256  # responses held in memory while the store cannot write; each holds a whole context
_RETRY_S = (0.05, 0.1, 0.2, 0.5, 1.0, 2.0)  # delays between attempts to write the held responses


class ResponseKeeper:
    def __init__(self, store: Any) -> None:
        self.store = store  # a ResponseStore (or a test's faulty wrapper of one)
        self._db = StoreThread()
        self._unsaved: dict[str, StoredResponse] = {}  # oldest first
        self._retry: asyncio.Task | None = None
        self.problem: str | None = None  # why responses are held, while they are

    @classmethod
    def open(cls, data_dir: Path) -> "ResponseKeeper":
        """The keeper of DATA_DIR's responses; the caller holds the directory's lock."""
        return cls(ResponseStore(data_dir))

    # ---- what the routes call -----------------------------------------------------------------
    async def keep(self, stored: StoredResponse) -> bool:
        """Store the response, or hold it until the store can take it; False if it is not kept."""
        if not self._unsaved:
            try:
                await self._db(self.store.put, stored)
                return True
            except Exception as exc:
                self._note(exc)
        if len(self._unsaved) >= MAX_UNSAVED:
            log.error("response %s was not stored: %d responses already wait for the store", stored.id,
                      len(self._unsaved))
            return False
        self._unsaved[stored.id] = stored
        if self._retry is None or self._retry.done():
            self._retry = asyncio.get_running_loop().create_task(self._write_held())
        return True

    async def find(self, response_id: str, owner: str | None) -> StoredResponse | None:
        """The response if it is kept (stored or held) and `owner` (None: any) may see it."""
        held = self._unsaved.get(response_id)
        if held is not None:
            return held if owner in (None, held.owner) else None
        return await self._read(self.store.get, response_id, owner=owner)

    async def was_deleted(self, response_id: str, owner: str | None) -> bool:
        return await self._read(self.store.was_deleted, response_id, owner=owner)

    async def delete(self, response_id: str, owner: str | None) -> bool:
        """Remove the response; False if none that `owner` may see is kept. Nothing changes when
        the store cannot write (a 503)."""
        held = self._unsaved.get(response_id)
        if held is not None and owner in (None, held.owner):
            # Written first, then deleted: the tombstone and the row go through the store together.
            await self._write(self.store.put, held)
            self._unsaved.pop(response_id, None)
        return await self._write(self.store.delete, response_id, owner=owner)

    def health(self) -> dict[str, Any]:
        return {"held": len(self._unsaved), "reason": self.problem}

    async def close(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            await asyncio.gather(self._retry, return_exceptions=True)
        await self._write_held_once()
        if self._unsaved:
            log.error("%d stored response(s) could not be written before shutdown and are lost: %s",
                      len(self._unsaved), ", ".join(list(self._unsaved)[:10]))
        await self._db(self.store.close)
        self._db.close()

    # ---- plumbing -----------------------------------------------------------------------------
    async def _write_held(self) -> None:
        attempt = 0
        while self._unsaved:
            await asyncio.sleep(_RETRY_S[min(attempt, len(_RETRY_S) - 1)])
            attempt += 1
            await self._write_held_once()
        if self.problem is not None:
            log.warning("stored responses: the store takes writes again; every held response is written")
            self.problem = None

    async def _write_held_once(self) -> None:
        for response_id, stored in list(self._unsaved.items()):
            try:
                await self._db(self.store.put, stored)
            except Exception as exc:
                self._note(exc)
                return
            self._unsaved.pop(response_id, None)

    def _note(self, exc: BaseException) -> None:
        reason = f"the response store cannot write ({type(exc).__name__}: {exc}); responses are held in memory"
        if self.problem is None:
            log.warning("%s", reason)
        self.problem = reason

    async def _read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return await self._db(fn, *args, **kwargs)
        except Exception as exc:
            log.exception("the response store could not be read")
            raise ServiceUnavailable(f"stored responses cannot be read now: {type(exc).__name__}: {exc}",
                                     code="store_unavailable") from None

    async def _write(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return await self._db(fn, *args, **kwargs)
        except Exception as exc:
            log.warning("the response store could not write: %s: %s", type(exc).__name__, exc)
            raise ServiceUnavailable(f"the response store cannot write now ({type(exc).__name__}: {exc}); "
                                     "nothing was changed: try again", code="store_unavailable") from None
