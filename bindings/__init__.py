"""The only package that touches llama_cpp or ctypes: thin, typed wrappers over llama.cpp's C API."""
from bindings.context import (
    FLASH_ATTN_TILE_ROWS, LLAMA_MAX_SEQ, Context, ContextSettings, DecodeError, DecodeOutcome,
)
from bindings.interrupt import DecodeInterrupter
from bindings.model import Model
from bindings.token_batch import TokenBatch

__all__ = ["Context", "ContextSettings", "DecodeError", "DecodeInterrupter", "DecodeOutcome", "FLASH_ATTN_TILE_ROWS",
           "LLAMA_MAX_SEQ", "Model", "TokenBatch"]
