"""Fixed, varied prompts so every benchmark feeds the same work to every contender."""
from __future__ import annotations

import random

TOPICS = [
    "the history of the printing press", "how volcanoes form", "a recipe for bread",
    "the rules of chess", "why the sky is blue", "the life of honey bees",
    "how a steam engine works", "the water cycle", "a trip to the mountains",
    "the invention of the telephone", "how to learn a language", "the planets of the solar system",
    "a day at the beach", "the causes of rain", "how computers store numbers", "the Roman empire",
]


def benchmark_prompts(n: int, context_words: int = 0) -> list[str]:
    """n distinct short prompts (about a dozen tokens each, like llama-batched-bench's PP=12),
    each after `context_words` words of its own context (a seeded word stream, as retrieved text
    would be: no two prompts share a prefix)."""
    prompts = [f"Write a short paragraph about {TOPICS[i % len(TOPICS)]} (part {i // len(TOPICS) + 1}):"
               for i in range(n)]
    if context_words <= 0:
        return prompts
    return [f"{_context(i, context_words)}\n\n{p}" for i, p in enumerate(prompts)]


def _context(seed: int, words: int) -> str:
    rng = random.Random(f"context/{seed}")
    return " ".join(rng.choice(_WORDS) for _ in range(words))


_WORDS = ("the of and to in a is that for it as was with be by on not this are or from at which but have "
          "an they you were her his one all we there can been has more if will would about when so who what "
          "time river stone light north market winter letter garden engine silver harbour village").split()


# Short questions with short answers: the interactive requests of the mixed-priority benchmarks.
QUESTIONS = [
    "What is the capital of France?", "How many legs does a spider have?",
    "Name a primary colour.", "What is two plus two?", "Which planet is closest to the sun?",
    "What do bees make?", "What is the boiling point of water in Celsius?",
    "Who wrote Romeo and Juliet?",
]
