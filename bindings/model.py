"""A loaded GGUF model: its vocabulary, tokenizer and chat template."""
from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp

from bindings.library import ensure_backend, model_params, repack_reports


class ModelLoadError(RuntimeError):
    pass


class Model:
    """Owns a `llama_model`. Close it (or use it as a context manager) after every Context on it."""

    def __init__(self, path: str | Path, *, use_mmap: bool = True, vocab_only: bool = False) -> None:
        """`vocab_only`: the tokenizer and template without weights (a vocabulary GGUF; no Context)."""
        ensure_backend()
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelLoadError(f"model file not found: {self.path}")
        params = model_params()
        params.use_mmap = use_mmap
        params.vocab_only = vocab_only
        reports = repack_reports()
        handle = llama_cpp.llama_model_load_from_file(str(self.path).encode(), params)
        if not handle:
            raise ModelLoadError(f"llama.cpp could not load {self.path} (not a GGUF it supports?)")
        self._handle = handle
        self._vocab = llama_cpp.llama_model_get_vocab(handle)
        self.n_vocab: int = llama_cpp.llama_vocab_n_tokens(self._vocab)
        self.n_ctx_train: int = llama_cpp.llama_model_n_ctx_train(handle)
        self.n_embd: int = llama_cpp.llama_model_n_embd(handle)
        self.n_params: int = llama_cpp.llama_model_n_params(handle)  # 0 for a vocabulary-only file
        # Repacked weights multiply activations four rows at a time, and each row left over alone
        # (a step's output rows cost by the block there). Models load one at a time in practice.
        self.weights_repacked: bool = repack_reports() > reports
        self.bos_token: int = llama_cpp.llama_vocab_bos(self._vocab)
        self.eos_token: int = llama_cpp.llama_vocab_eos(self._vocab)  # chat templates name it
        self.add_bos: bool = bool(llama_cpp.llama_vocab_get_add_bos(self._vocab))
        is_eog, is_control = llama_cpp.llama_vocab_is_eog, llama_cpp.llama_vocab_is_control
        self.eog_tokens: frozenset[int] = frozenset(
            t for t in range(self.n_vocab) if is_eog(self._vocab, t)
        )
        self.special_tokens: frozenset[int] = frozenset(
            t for t in range(self.n_vocab) if is_control(self._vocab, t)
        ) | self.eog_tokens
        self.token_bytes: tuple[bytes, ...] = self._build_token_bytes()
        self.chat_template: str | None = self._read_chat_template()
        self.description: str = self._describe()

    @property
    def handle(self) -> ctypes.c_void_p:
        if self._handle is None:
            raise RuntimeError("model is closed")
        return self._handle

    def tokenize(self, text: str, *, add_bos: bool = True, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        capacity = len(data) + 8
        while True:
            out = (llama_cpp.llama_token * capacity)()
            n = llama_cpp.llama_tokenize(
                self._vocab, data, len(data), out, capacity, add_bos and self.add_bos, parse_special
            )
            if n >= 0:
                return list(out[:n])
            capacity = -n

    def token_to_piece(self, token: int, *, special: bool = False) -> bytes:
        """The bytes of one token, using the length llama.cpp returns (the buffer may hold more)."""
        size = 32
        while True:
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, size, 0, special)
            if n >= 0:
                return buf.raw[:n]
            size = -n

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """Render chat messages with the file's own template; raises if the file has none."""
        if self.chat_template is None:
            raise ValueError("this model file has no chat template")
        n = len(messages)
        chat = (llama_cpp.llama_chat_message * n)()
        keep = []  # the C structs hold raw pointers: keep the bytes alive until the call returns
        for i, message in enumerate(messages):
            role, content = message["role"].encode(), message["content"].encode()
            keep += [role, content]
            chat[i].role, chat[i].content = role, content
        template = self.chat_template.encode()
        size = 4 * sum(len(m["content"]) + len(m["role"]) for m in messages) + 1024
        while True:
            buf = ctypes.create_string_buffer(size)
            written = llama_cpp.llama_chat_apply_template(template, chat, n, add_generation_prompt, buf, size)
            if written < 0:
                raise ValueError("llama.cpp does not recognise this model's chat template")
            if written <= size:
                return buf.raw[:written].decode("utf-8", errors="replace")
            size = written

    def close(self) -> None:
        if self._handle is not None:
            llama_cpp.llama_model_free(self._handle)
            self._handle = None
            self._vocab = None

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build_token_bytes(self) -> tuple[bytes, ...]:
        # One reusable buffer: 262k calls through ctypes would otherwise allocate 262k buffers.
        size = 256
        buf = ctypes.create_string_buffer(size)
        piece = llama_cpp.llama_token_to_piece
        vocab = self._vocab
        table = []
        for token in range(self.n_vocab):
            n = piece(vocab, token, buf, size, 0, False)
            table.append(buf.raw[:n] if n >= 0 else self.token_to_piece(token))
        return tuple(table)

    def _read_chat_template(self) -> str | None:
        raw = llama_cpp.llama_model_chat_template(self._handle, None)
        return raw.decode("utf-8", errors="replace") if raw else None

    def _describe(self) -> str:
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_model_desc(self._handle, buf, 256)
        return buf.value.decode("utf-8", errors="replace") if n > 0 else self.path.name
