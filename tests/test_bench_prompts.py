"""bench/prompts.py: the prompts every contender of a benchmark is fed."""
from bench.prompts import benchmark_prompts


def test_context_words_come_before_each_question_and_no_two_prompts_share_them():
    plain = benchmark_prompts(20)
    with_context = benchmark_prompts(20, context_words=300)
    assert len(set(plain)) == 20 and len(set(with_context)) == 20
    for p, q in zip(with_context, plain):
        context, question = p.rsplit("\n\n", 1)
        assert question == q and len(context.split()) == 300
    firsts = {p.split()[0:8].__repr__() for p in with_context}
    assert len(firsts) == 20  # distinct from the start: no cached prefix serves another prompt
    assert benchmark_prompts(20, context_words=300) == with_context  # the same for every contender
