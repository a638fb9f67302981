"""Fixed, varied prompts so every benchmark feeds the same work to every contender."""
from __future__ import annotations

TOPICS = [
    "the history of the printing press", "how volcanoes form", "a recipe for bread",
    "the rules of chess", "why the sky is blue", "the life of honey bees",
    "how a steam engine works", "the water cycle", "a trip to the mountains",
    "the invention of the telephone", "how to learn a language", "the planets of the solar system",
    "a day at the beach", "the causes of rain", "how computers store numbers", "the Roman empire",
]


def benchmark_prompts(n: int) -> list[str]:
    """n distinct short prompts (about a dozen tokens each, like llama-batched-bench's PP=12)."""
    return [f"Write a short paragraph about {TOPICS[i % len(TOPICS)]} (part {i // len(TOPICS) + 1}):"
            for i in range(n)]


# Short questions with short answers: the interactive requests of the mixed-priority benchmarks.
QUESTIONS = [
    "What is the capital of France?", "How many legs does a spider have?",
    "Name a primary colour.", "What is two plus two?", "Which planet is closest to the sun?",
    "What do bees make?", "What is the boiling point of water in Celsius?",
    "Who wrote Romeo and Juliet?",
]
