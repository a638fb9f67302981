"""llama.cpp's vocab-only GGUFs (`models/ggml-vocab-*.gguf`: a real model's tokenizer, no weights),
found where they are or fetched once from the package registry.

They ship in llama-cpp-python's source distribution (vendor/llama.cpp/models). Found, in order: the
folder COBATCH_LLAMA_MODELS names, then the cache (<cobatch cache>/llama-src/<version>/models);
otherwise `pip download --no-binary :all:` brings the sdist of the installed llama-cpp-python
version, and only those files are extracted into the cache. Tool-format tests and tiny models
(bench/tiny_model.py) tokenize with them."""
from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from engine.model_source import cache_dir

ENV_VAR = "COBATCH_LLAMA_MODELS"
MEMBER_PATTERN = "*/vendor/llama.cpp/models/ggml-vocab-*.gguf"


class VocabUnavailable(RuntimeError):
    """The vocab GGUFs are not on this machine and could not be fetched (the message says why)."""


def installed_version() -> str:
    try:
        return version("llama-cpp-python")
    except PackageNotFoundError as exc:
        raise VocabUnavailable("llama-cpp-python is not installed, so no sdist version to fetch") from exc


def cached_dir(llama_version: str) -> Path:
    return cache_dir() / "llama-src" / llama_version / "models"


def _holds_vocabs(folder: Path) -> bool:
    return folder.is_dir() and any(folder.glob("ggml-vocab-*.gguf"))


def vocab_dir(fetch: bool = True) -> Path:
    """The folder holding ggml-vocab-*.gguf; fetched into the cache once if nowhere else.
    Raises VocabUnavailable (with the reason) when it is not there and cannot be fetched."""
    named = os.environ.get(ENV_VAR)
    if named:
        if _holds_vocabs(Path(named)):
            return Path(named)
        raise VocabUnavailable(f"{ENV_VAR}={named} holds no ggml-vocab-*.gguf")
    llama_version = installed_version()
    target = cached_dir(llama_version)
    if _holds_vocabs(target):
        return target
    if not fetch:
        raise VocabUnavailable(f"not in {target}, and fetching was not asked for")
    fetch_into(llama_version, target)
    return target


def vocab_path(name: str, fetch: bool = True) -> Path:
    """ggml-vocab-<name>.gguf (e.g. "qwen2", "llama-bpe", "llama-spm")."""
    path = vocab_dir(fetch) / f"ggml-vocab-{name}.gguf"
    if not path.is_file():
        raise VocabUnavailable(f"{path} does not exist")
    return path


def fetch_into(llama_version: str, target: Path) -> None:
    """Download llama-cpp-python's sdist with pip and extract only the vocab GGUFs into `target`
    (atomically: a concurrent process sees all of them or none)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                   "--dest", scratch, f"llama-cpp-python=={llama_version}"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        archives = list(Path(scratch).glob("*.tar.gz"))
        if done.returncode != 0 or not archives:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise VocabUnavailable(f"pip download of llama-cpp-python=={llama_version} failed: {tail[0]}")
        staged = Path(scratch) / "models"
        staged.mkdir()
        with tarfile.open(archives[0]) as archive:
            for member in archive:
                if member.isfile() and fnmatch.fnmatch(member.name, MEMBER_PATTERN):
                    source = archive.extractfile(member)
                    assert source is not None
                    with source, open(staged / Path(member.name).name, "wb") as out:
                        shutil.copyfileobj(source, out)
        if not _holds_vocabs(staged):
            raise VocabUnavailable(f"the llama-cpp-python {llama_version} sdist holds no {MEMBER_PATTERN}")
        try:
            os.replace(staged, target)
        except OSError:
            if not _holds_vocabs(target):  # another process put them there first: theirs are the same files
                raise
