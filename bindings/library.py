"""Loads llama.cpp once per process and keeps its logging quiet unless asked."""
from __future__ import annotations

import ctypes
import os
import threading

import llama_cpp

_init_lock = threading.Lock()
_initialised = False
_repack_reports = 0  # load logs that named llama.cpp's buffer of repacked weights


@llama_cpp.llama_log_callback
def _quiet_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    global _repack_reports
    if b"CPU_REPACK" in text:
        _repack_reports += 1
    # llama.cpp logs every tensor at load; only errors (level 4; 5 continues a line with
    # progress dots) are worth a user's attention.
    if os.environ.get("COBATCH_LLAMA_LOG") or (level == 4 and not _is_abort_report(text)):
        try:
            os.write(2, text)
        except OSError:
            pass


def _is_abort_report(text: bytes) -> bool:
    # An interrupted decode (bindings/interrupt.py) is logged as a failed graph with status 1,
    # GGML_STATUS_ABORTED, and llama_decode returning 2; that is the engine's own doing.
    return text.rstrip().endswith((b"failed with error 1", b"compute status: 1", b"failed to decode, ret = 2"))


def ensure_backend() -> None:
    global _initialised
    with _init_lock:
        if not _initialised:
            llama_cpp.llama_log_set(_quiet_log, ctypes.c_void_p(0))
            llama_cpp.llama_backend_init()
            _initialised = True


def repack_reports() -> int:
    """How many load logs so far named the CPU_REPACK buffer: llama.cpp copies weights there, in
    the layout of its kernels that multiply four activation rows at a time, when the CPU has them.
    No API says so; a model load that raised this count repacked."""
    return _repack_reports


def system_info() -> str:
    ensure_backend()
    return llama_cpp.llama_print_system_info().decode("utf-8", errors="replace")


def model_params() -> "llama_cpp.llama_model_params":
    """llama.cpp's default model parameters, minus what is known to crash on this CPU."""
    ensure_backend()
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0
    if amx_built():
        # ggml's AMX matmul segfaults in the first decode of a K-quant model (llama.cpp issue
        # 20824, unfixed in the version we pin); its extra buffer types are where AMX comes in.
        params.use_extra_bufts = False
    return params


def amx_built() -> bool:
    """llama.cpp was compiled with Intel AMX kernels (a native build on a CPU that has AMX)."""
    return "AMX_INT8 = 1" in system_info()


def llama_cpp_version() -> str:
    return getattr(llama_cpp, "__version__", "unknown")
