"""The sim engine's token count (a byte-pair tokenizer's, approximated) and its answer's tokens."""

from __future__ import annotations

from tessera.serving.engines.sim_tokens import count_tokens, output_token


def test_pieces_count_as_a_pretokenizer_cuts_them_and_long_words_count_more() -> None:
    assert count_tokens("the cat sat") == 3  # a word with its leading space is one token
    assert count_tokens("don't stop") == 3  # don / 't / stop
    assert count_tokens("antidisestablishmentarianism") == 1 + (28 - 7 + 3) // 4  # rare long words: several
    assert count_tokens("2026-11-27") == 6  # 202 / 6 / - / 11 / - / 27: digits three at a time
    assert count_tokens("") == count_tokens("   ") == 1  # at least one


def test_an_answer_is_tokens_that_count_one_each_and_add_up() -> None:
    tokens = [output_token(42, i) for i in range(50)]
    assert not tokens[0].startswith(" ") and all(t.startswith(" ") for t in tokens[1:])
    assert all(count_tokens(t) == 1 for t in tokens) and count_tokens("".join(tokens)) == 50
