import numpy as np
import pytest

from slobench.workload import (
    DEFAULT_TOKEN_ID_RANGE,
    WORDS,
    random_text,
    random_token_ids,
    text_prompts,
    token_prompts,
)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_token_prompts_have_exact_lengths_and_ids_in_range():
    lengths = np.array([1, 5, 300, 4096, 17])
    prompts = token_prompts(lengths, rng(1))
    assert [len(p) for p in prompts] == lengths.tolist()
    lo, hi = DEFAULT_TOKEN_ID_RANGE
    for p in prompts:
        assert isinstance(p, tuple)
        assert all(type(x) is int for x in p)  # JSON-serialisable, not numpy scalars
        assert lo <= min(p) and max(p) < hi


def test_token_ids_cover_the_range():
    (p,) = token_prompts([50_000], rng(2), id_range=(10, 20))
    assert set(p) == set(range(10, 20))


def test_token_prompts_are_deterministic_per_seed():
    lengths = [64, 128, 7]
    assert token_prompts(lengths, rng(3)) == token_prompts(lengths, rng(3))
    assert token_prompts(lengths, rng(3)) != token_prompts(lengths, rng(4))


def test_first_prompts_do_not_depend_on_how_many_follow():
    lengths = rng(5).integers(1, 20, size=5000)  # more than one internal batch
    many = token_prompts(lengths, rng(6))
    few = token_prompts(lengths[:10], rng(6))
    assert few == many[:10]


def test_distinct_prompts_do_not_share_a_first_block():
    prompts = token_prompts([16] * 2000, rng(7))
    assert len(set(prompts)) == 2000


def test_shared_prefix_prompts():
    prefix = random_token_ids(100, rng(8))
    assert len(prefix) == 100
    prompts = token_prompts([100, 150, 400], rng(9), prefix=prefix)
    assert [len(p) for p in prompts] == [100, 150, 400]
    assert all(p[:100] == prefix for p in prompts)
    assert prompts[1][100:] != prompts[2][100:150]


def test_prefix_longer_than_a_length_is_refused():
    with pytest.raises(ValueError, match="prefix length 10"):
        token_prompts([20, 9], rng(), prefix=tuple(range(1000, 1010)))


def test_bad_id_range_is_refused():
    with pytest.raises(ValueError, match="id_range"):
        token_prompts([3], rng(), id_range=(500, 500))


def test_text_prompts_have_the_asked_number_of_words_from_the_list():
    lengths = [1, 2, 50, 777]
    prompts = text_prompts(lengths, rng(10))
    assert [len(p.split(" ")) for p in prompts] == lengths
    vocab = set(WORDS)
    assert all(w in vocab for p in prompts for w in p.split(" "))
    assert text_prompts(lengths, rng(10)) == prompts
    assert text_prompts(lengths, rng(11)) != prompts


def test_text_prompts_with_shared_prefix():
    system = random_text(20, rng(12))
    prompts = text_prompts([20, 25, 60], rng(13), prefix=system)
    assert prompts[0] == system
    assert all(p.startswith(system + " ") for p in prompts[1:])
    assert [len(p.split()) for p in prompts] == [20, 25, 60]


def test_word_list_is_short_common_words():
    assert len(WORDS) == len(set(WORDS)) >= 200
    assert all(w.isalpha() and w.islower() and len(w) <= 6 for w in WORDS)


def test_words_for_tokens_keeps_the_length_and_the_shared_prefix_share() -> None:
    from slobench.workload.text import words_for_tokens

    shared = tuple(range(100, 400))  # 300 ids shared, then 700 of each prompt's own
    a, b = shared + tuple(range(5000, 5700)), shared + tuple(range(9000, 9700))
    wa, wb = words_for_tokens(a, 4.0), words_for_tokens(b, 4.0)
    assert len(wa) == len(wb) == 250  # 1,000 tokens asked, 4 a word
    common = next(i for i, (x, y) in enumerate(zip(wa, wb, strict=True)) if x != y)
    assert common == 75  # 300 of 1,000 tokens shared: 75 of 250 words
    assert words_for_tokens((7,), 4.0) == (7,)  # never empty
    assert words_for_tokens(tuple(range(10)), 0.5) == (0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9)
