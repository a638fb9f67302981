"""Interrupting a running llama_decode from another thread, without the GIL.

llama.cpp's CPU backend polls an abort callback before every graph node (thousands per step).
A Python callback there would take the GIL each time and stall decoding whenever another
thread holds it, so the callback is C's own `strlen` over a two-byte flag buffer: it returns
0 while the flag byte is 0 and 1 once it is set, which the caller reads as a C `bool`.
"""
from __future__ import annotations

import ctypes
import ctypes.util

import llama_cpp

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
_STRLEN_ADDRESS = ctypes.cast(_libc.strlen, ctypes.c_void_p).value


class DecodeInterrupter:
    """Arm before a decode, `interrupt()` from any thread; the decode then returns ABORTED and
    llama.cpp removes the batch's cells, so the same batch can be decoded again later."""

    def __init__(self, context_handle: ctypes.c_void_p) -> None:
        self._flag = ctypes.create_string_buffer(2)  # [flag, NUL]
        self._callback = llama_cpp.ggml_abort_callback(_STRLEN_ADDRESS)  # kept alive with us
        llama_cpp.llama_set_abort_callback(
            context_handle, self._callback, ctypes.cast(self._flag, ctypes.c_void_p)
        )

    def interrupt(self) -> None:
        self._flag[0] = b"\x01"

    def reset(self) -> None:
        self._flag[0] = b"\x00"

    @property
    def interrupted(self) -> bool:
        return self._flag[0] != b"\x00"
