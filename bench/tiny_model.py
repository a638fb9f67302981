"""Tiny random-weight GGUF models of templated tool-call families: a real architecture's tensors at
a small size (2 layers, width 128, F16), a real model's tokenizer (the tokenizer.* keys of one of
llama.cpp's vocab-only GGUFs, bench/llama_vocab.py) and a real chat template as
tokenizer.chat_template (bench/tiny_families.py says which). They load in cobatch and in
llama-server like any model; what they write is noise, so they test formats, grammars and
readers, never quality. Built once into <cobatch cache>/tiny-models, never committed.

    python -m bench.tiny_model hermes            # prints the path of the (cached) model
    python -m bench.tiny_model mistral -o m.gguf
"""
from __future__ import annotations

import argparse
import hashlib
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from bench.llama_vocab import vocab_path
from bench.tiny_families import TINY_FAMILIES, TinyFamily
from engine.model_source import cache_dir

FORMAT = 1  # bump when what is written changes, so cached models are rebuilt


@dataclass(frozen=True)
class TinyShape:
    n_layer: int = 2
    n_embd: int = 128
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 256
    context: int = 32768
    seed: int = 0


def tiny_model_path(family: str, directory: Path | None = None, shape: TinyShape = TinyShape()) -> Path:
    """The family's tiny model, built on first use into `directory` (default: the cache), named by
    a hash of everything it is made of."""
    spec = TINY_FAMILIES[family]
    template = spec.template_text()
    vocab = vocab_path(spec.vocab)
    key = hashlib.sha256(repr((FORMAT, asdict(spec), asdict(shape), template, vocab.name,
                               vocab.stat().st_size)).encode()).hexdigest()[:12]
    target = (directory or cache_dir() / "tiny-models") / f"tiny-{family}-{key}.gguf"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".partial-{os.getpid()}")
        try:
            write_tiny_model(partial, spec, vocab, template, shape)
            os.replace(partial, target)  # atomic: a concurrent build never shows half a file
        finally:
            partial.unlink(missing_ok=True)
    return target


def write_tiny_model(path: Path, spec: TinyFamily, vocab_gguf: Path, chat_template: str,
                     shape: TinyShape = TinyShape()) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), spec.arch)
    writer.add_name(f"tiny random {spec.arch} ({spec.template})")
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(shape.n_embd // shape.n_head)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    n_vocab = copy_tokenizer(writer, gguf.GGUFReader(str(vocab_gguf)), spec.extra_control_tokens,
                             spec.extra_text_tokens)
    writer.add_chat_template(chat_template)
    for name, array in tensors(spec.arch, shape, n_vocab):
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def copy_tokenizer(writer, reader, extra_control_tokens: tuple[str, ...],
                   extra_text_tokens: tuple[str, ...] = ()) -> int:
    """Every tokenizer.* key of `reader` into `writer` (but its chat template), with the extra
    control tokens, then the extra text (user-defined) tokens, appended to the vocabulary; returns
    the vocabulary's size."""
    import gguf

    values = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.") and key != "tokenizer.chat_template":
            values[key] = (field.contents(), field.types[0], field.types[-1] if len(field.types) > 1 else None)
    tokens, *token_kinds = values["tokenizer.ggml.tokens"]
    extra = list(extra_control_tokens) + list(extra_text_tokens)
    if extra:
        clash = set(extra) & set(tokens)
        if clash:
            raise ValueError(f"the vocabulary already has {sorted(clash)}")
        values["tokenizer.ggml.tokens"] = (tokens + extra, *token_kinds)
        types = ([int(gguf.TokenType.CONTROL)] * len(extra_control_tokens)
                 + [int(gguf.TokenType.USER_DEFINED)] * len(extra_text_tokens))
        extend = {"tokenizer.ggml.scores": [0.0] * len(extra), "tokenizer.ggml.token_type": types}
        for key, fillers in extend.items():
            if key in values:
                old, kind, sub = values[key]
                values[key] = (list(old) + fillers, kind, sub)
    for key, (value, kind, sub) in values.items():
        writer.add_key_value(key, value, kind, sub if kind == gguf.GGUFValueType.ARRAY else None)
    return len(values["tokenizer.ggml.tokens"][0])


def tensors(arch: str, shape: TinyShape, n_vocab: int) -> list[tuple[str, np.ndarray]]:
    """llama.cpp's tensors for `arch` ("llama" or "qwen2", which adds q/k/v biases), numpy shapes
    being ggml's reversed: a matrix from n_in to n_out is (n_out, n_in)."""
    if arch not in ("llama", "qwen2"):
        raise ValueError(f"no tiny {arch!r}: llama and qwen2 are written")
    rng = np.random.default_rng(shape.seed)
    head_dim = shape.n_embd // shape.n_head
    q_width, kv_width = shape.n_head * head_dim, shape.n_head_kv * head_dim

    def matrix(n_out: int, n_in: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in), dtype=np.float32) * 0.02).astype(np.float16)

    def ones(n: int) -> np.ndarray:  # 1-D tensors (norms, biases) stay F32, as llama.cpp's converters write them
        return np.ones(n, dtype=np.float32)

    out = [("token_embd.weight", matrix(n_vocab, shape.n_embd)), ("output_norm.weight", ones(shape.n_embd)),
           ("output.weight", matrix(n_vocab, shape.n_embd))]
    for i in range(shape.n_layer):
        block = f"blk.{i}"
        out += [(f"{block}.attn_norm.weight", ones(shape.n_embd)),
                (f"{block}.attn_q.weight", matrix(q_width, shape.n_embd)),
                (f"{block}.attn_k.weight", matrix(kv_width, shape.n_embd)),
                (f"{block}.attn_v.weight", matrix(kv_width, shape.n_embd)),
                (f"{block}.attn_output.weight", matrix(shape.n_embd, q_width)),
                (f"{block}.ffn_norm.weight", ones(shape.n_embd)),
                (f"{block}.ffn_gate.weight", matrix(shape.n_ff, shape.n_embd)),
                (f"{block}.ffn_up.weight", matrix(shape.n_ff, shape.n_embd)),
                (f"{block}.ffn_down.weight", matrix(shape.n_embd, shape.n_ff))]
        if arch == "qwen2":
            out += [(f"{block}.attn_q.bias", np.zeros(q_width, dtype=np.float32)),
                    (f"{block}.attn_k.bias", np.zeros(kv_width, dtype=np.float32)),
                    (f"{block}.attn_v.bias", np.zeros(kv_width, dtype=np.float32))]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tiny_model", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("family", choices=sorted(TINY_FAMILIES))
    parser.add_argument("-o", "--output", type=Path, default=None, help="write here instead of the cache")
    args = parser.parse_args(argv)
    if args.output is None:
        print(tiny_model_path(args.family))
    else:
        spec = TINY_FAMILIES[args.family]
        write_tiny_model(args.output, spec, vocab_path(spec.vocab), spec.template_text())
        print(args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main())
