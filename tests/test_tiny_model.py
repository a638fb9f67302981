"""The vocab GGUFs' finder (bench/llama_vocab.py: found, else fetched once from the sdist) and the
tiny random-weight models built around them (bench/tiny_model.py): their metadata, and (marked
model) that each loads in the engine, derives its family's syntax and generates."""
from __future__ import annotations

import io
import subprocess
import tarfile
from dataclasses import replace
from pathlib import Path

import pytest

from bench import llama_vocab
from bench.llama_vocab import VocabUnavailable, vocab_dir, vocab_path
from bench.tiny_families import TINY_FAMILIES
from bench.tiny_model import TinyShape, tiny_model_path, write_tiny_model


def _sdist(dest: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(dest / "llama_cpp_python-9.9.9.tar.gz", "w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.delenv(llama_vocab.ENV_VAR, raising=False)
    monkeypatch.setenv("COBATCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(llama_vocab, "installed_version", lambda: "9.9.9")
    return tmp_path / "cache"


def test_a_fetch_extracts_only_the_vocab_ggufs_once(empty_cache, monkeypatch):
    calls = []

    def fake_pip(command, **_):
        calls.append(command)
        assert command[-1] == "llama-cpp-python==9.9.9" and ":all:" in command
        root = "llama_cpp_python-9.9.9/vendor/llama.cpp/"
        _sdist(Path(command[command.index("--dest") + 1]), {
            root + "models/ggml-vocab-qwen2.gguf": b"qwen2", root + "models/ggml-vocab-qwen2.gguf.inp": b"text",
            root + "models/templates/x.jinja": b"{{ x }}", root + "src/llama.cpp": b"code"})
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(llama_vocab.subprocess, "run", fake_pip)
    found = vocab_dir()
    assert found == empty_cache / "llama-src" / "9.9.9" / "models"
    assert sorted(p.name for p in found.iterdir()) == ["ggml-vocab-qwen2.gguf"]
    assert vocab_path("qwen2").read_bytes() == b"qwen2"
    assert vocab_dir() == found and len(calls) == 1  # the second look finds the cache
    with pytest.raises(VocabUnavailable, match="llama-bpe"):
        vocab_path("llama-bpe")


def test_a_failed_download_says_why_and_leaves_nothing(empty_cache, monkeypatch):
    monkeypatch.setattr(llama_vocab.subprocess, "run", lambda command, **_: subprocess.CompletedProcess(
        command, 1, "", "ERROR: Could not find a version that satisfies the requirement\n"))
    with pytest.raises(VocabUnavailable, match="Could not find a version"):
        vocab_dir()
    assert not any((empty_cache / "llama-src" / "9.9.9").glob("models"))
    with pytest.raises(VocabUnavailable, match="not asked"):
        vocab_dir(fetch=False)


def test_a_named_folder_without_vocabs_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(llama_vocab.ENV_VAR, str(tmp_path))
    with pytest.raises(VocabUnavailable, match=llama_vocab.ENV_VAR):
        vocab_dir()


def _vocab(name: str) -> Path:
    try:
        return vocab_path(name)
    except VocabUnavailable as exc:
        pytest.skip(f"llama.cpp's vocab GGUFs are not available: {exc}")


def test_a_tiny_model_carries_the_vocab_tokenizer_the_template_and_the_arch_tensors(tmp_path):
    gguf = pytest.importorskip("gguf")
    spec = TINY_FAMILIES["mistral"]
    shape = TinyShape(n_layer=1, n_embd=64, n_head=2, n_head_kv=1, n_ff=96)
    source = gguf.GGUFReader(str(_vocab(spec.vocab)))
    spec = replace(spec, extra_text_tokens=("<tool_call>",))  # a text token after the control ones
    write_tiny_model(tmp_path / "m.gguf", spec, _vocab(spec.vocab), "{{ messages }}", shape)
    written = gguf.GGUFReader(str(tmp_path / "m.gguf"))

    def value(reader, key):
        return reader.fields[key].contents()

    tokens = value(written, "tokenizer.ggml.tokens")
    n_source = len(value(source, "tokenizer.ggml.tokens"))
    assert tokens[:n_source] == value(source, "tokenizer.ggml.tokens")
    assert tokens[n_source:] == list(spec.extra_control_tokens) + ["<tool_call>"]
    assert value(written, "tokenizer.ggml.token_type")[n_source:] == [3] * len(spec.extra_control_tokens) + [4]
    for key in source.fields:
        if key.startswith("tokenizer.") and key not in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                                                        "tokenizer.ggml.scores", "tokenizer.chat_template"):
            assert value(written, key) == value(source, key), key
    assert value(written, "tokenizer.chat_template") == "{{ messages }}"
    assert value(written, "general.architecture") == "llama"
    shapes = {t.name: tuple(int(d) for d in t.shape) for t in written.tensors}  # ggml's order: n_in first
    assert shapes["token_embd.weight"] == (64, len(tokens)) and shapes["output.weight"] == (64, len(tokens))
    assert shapes["blk.0.attn_k.weight"] == (64, 32) and shapes["blk.0.ffn_down.weight"] == (96, 64)
    assert len(shapes) == 3 + 9 * shape.n_layer


@pytest.mark.model
@pytest.mark.parametrize("family", sorted(TINY_FAMILIES))
def test_each_tiny_model_loads_derives_its_family_and_generates(family):
    pytest.importorskip("gguf")
    _vocab(TINY_FAMILIES[family].vocab)
    from bindings import Model
    from engine import Engine
    from server.chat_setup import chat_formatter_for

    path = tiny_model_path(family)
    with Model(path) as model:
        syntax = chat_formatter_for(model).tool_syntax
        assert syntax.family == family and syntax.source == "derived"
        if family == "mistral":  # the appended control token is one special token, as in Mistral's vocabulary
            assert syntax.opening_token is not None
            assert model.tokenize("[TOOL_CALLS]", add_bos=False, parse_special=True) == [syntax.opening_token]
        if family == "hermes":  # Qwen 2.5's text tokens: one token each, written as their text
            [call] = model.tokenize("<tool_call>", add_bos=False)
            assert model.token_to_piece(call) == b"<tool_call>" and call not in model.special_tokens
    with Engine(str(path), n_ctx=512, max_running=2) as engine:
        result = engine.generate("Hello", max_tokens=8, temperature=0.8, seed=1, ignore_eos=True)[0]
    assert result.metrics.tokens_generated == 8
