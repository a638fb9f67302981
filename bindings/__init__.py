"""The only package that touches llama_cpp or ctypes: thin, typed wrappers over llama.cpp's C API."""
from bindings.batch import Batch
from bindings.context import Context, ContextSettings, DecodeError, DecodeOutcome
from bindings.interrupt import DecodeInterrupter
from bindings.model import Model

__all__ = ["Batch", "Context", "ContextSettings", "DecodeError", "DecodeInterrupter", "DecodeOutcome", "Model"]
