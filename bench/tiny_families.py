"""Which real chat template, tokenizer and architecture each tiny model of a tool-call family gets
(bench/tiny_model.py builds them): the template from tests/templates (llama.cpp's copies, licences
there), the tokenizer from one of llama.cpp's vocab-only GGUFs (bench/llama_vocab.py)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent.parent / "tests" / "templates"


@dataclass(frozen=True)
class TinyFamily:
    template: str  # tests/templates/<template>.jinja
    vocab: str  # ggml-vocab-<vocab>.gguf
    arch: str  # a llama.cpp architecture whose tensors bench/tiny_model.py writes
    # Control tokens the family's real vocabulary has and the vocab GGUF lacks, appended to it, so
    # the template's markers tokenize as its model's do (one token each).
    extra_control_tokens: tuple[str, ...] = ()
    # Added tokens that are text (user-defined: written as text, read as one token), likewise.
    extra_text_tokens: tuple[str, ...] = ()

    def template_text(self) -> str:
        path = TEMPLATES / f"{self.template}.jinja"
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: tiny models are built from a cobatch checkout")
        return path.read_text(encoding="utf-8")


TINY_FAMILIES: dict[str, TinyFamily] = {
    # Qwen's tokenizer (<|im_start|> is one token) and architecture; Qwen 2.5 added <tool_call> and
    # </tool_call> as text tokens, which the vocab GGUF (Qwen 1.5's) lacks.
    "hermes": TinyFamily("Qwen-Qwen2.5-7B-Instruct", "qwen2", "qwen2",
                         extra_text_tokens=("<tool_call>", "</tool_call>")),
    # Llama 3's tokenizer (<|eot_id|>, <|python_tag|>, <|start_header_id|>) and architecture.
    "llama3": TinyFamily("meta-llama-Llama-3.1-8B-Instruct", "llama-bpe", "llama"),
    # Nemo's own tokenizer (Tekken) is not among llama.cpp's vocab GGUFs; Llama 2's SentencePiece
    # vocabulary plus Mistral's control tokens (as Mistral 7B v0.3's tokenizer has them) stands in.
    "mistral": TinyFamily("mistralai-Mistral-Nemo-Instruct-2407", "llama-spm", "llama",
                          ("[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                           "[TOOL_RESULTS]", "[/TOOL_RESULTS]")),
}
