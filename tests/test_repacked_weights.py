"""Whether llama.cpp repacked a model's weights: the allotment prices draft rows by blocks of
output rows there (engine/speculation.py)."""
from __future__ import annotations

from bindings import Model
from bindings.library import amx_built, system_info


def test_a_model_says_whether_llama_cpp_repacked_its_weights(model_path):
    with Model(model_path) as model:
        repacked = model.weights_repacked
    info = system_info()
    if amx_built():
        assert not repacked  # cobatch turns llama.cpp's extra buffer types off there
    elif "REPACK = 1" in info and "AVX2 = 1" in info:
        assert repacked  # Gemma 3's Q4_K and Q8_0 tensors have x86 kernels for repacked layouts
    with Model(model_path, vocab_only=True) as vocab:
        assert not vocab.weights_repacked  # no weights loaded, none repacked
