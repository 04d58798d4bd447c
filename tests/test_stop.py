"""Stop strings (reference_engine.stop.OutputText): the cut, the hold-back of a stream, min_tokens, UTF-8."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_engine.protocol import BadRequest, parse_completion
from reference_engine.stop import OutputText
from reference_engine.tokenizer import ByteTokenizer


def stream(text: str, stops: list[str], **kw: object) -> tuple[list[str], str, OutputText]:
    out = OutputText(stops, **kw)  # type: ignore[arg-type]
    pieces = []
    for b in text.encode():
        pieces.append(out.push(b))
        if out.stopped:
            break
    pieces.append(out.flush())
    return pieces, "".join(pieces), out


def reference_cut(text: str, stops: list[str], include: bool) -> tuple[str, int | None]:
    """The stop string that completes first (earliest end, then earliest start): (text, tokens consumed)."""
    hits = [(text.find(s) + len(s), text.find(s), s) for s in stops if s in text]
    if not hits:
        return text, None
    end, start, s = min(hits)
    return text[: end if include else start], end


def test_cut_before_the_stop_string_and_nothing_past_it() -> None:
    pieces, text, out = stream("hello world, bye", ["world"])
    assert text == "hello " and out.stopped and out.num_tokens == len("hello world")
    assert "w" not in "".join(pieces)  # no part of the stop string was ever released
    assert stream("hello world, bye", ["world"], include_stop=True)[1] == "hello world"


def test_hold_back_is_longest_stop_minus_one() -> None:
    out = OutputText(["abc", "z"])
    assert [out.push(b) for b in b"xyab"] == ["", "", "x", "y"]  # two characters held back while "ab" could grow
    assert out.push(ord("q")) == "a" and out.flush() == "bq"
    plain = OutputText()
    assert [plain.push(b) for b in b"hi"] == ["h", "i"]  # no stop strings: nothing held back


def test_first_stop_to_complete_wins() -> None:
    assert stream("xxabcd", ["bcd", "ab"])[1] == "xx"
    assert stream("xxabcd", ["abc", "bc"])[1] == "xx"  # both end at 'c': the earlier start
    assert stream("no match here", ["zz"])[1] == "no match here"


def test_min_tokens_delays_the_check() -> None:
    # vLLM's rule: only an occurrence ending at the min_tokens-th output token or later counts.
    assert stream("ab-cd-ef", ["-"], min_tokens=4)[1] == "ab-cd"
    assert stream("ab-cd-ef", ["-"], min_tokens=3)[1] == "ab"
    assert stream("ab-cd-ef", ["cd-"], min_tokens=6)[1] == "ab-"


def test_multibyte_characters_are_never_split() -> None:
    text = "naïve café ☕ done"
    assert stream(text, ["☕"])[1] == "naïve café "
    assert stream(text, ["é ☕"], include_stop=True)[1] == "naïve café ☕"
    pieces, whole, _ = stream(text, [])
    assert whole == text and all("\ufffd" not in p for p in pieces)


def test_bad_stop_strings_are_refused() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        OutputText([""])
    tok = ByteTokenizer()
    for stop, words in ((["a", ""], "must not be empty"), ([1], "string or a list"), ("", None), ([], None)):
        body = {"model": "m", "prompt": "hi", "stop": stop}
        if words is None:
            assert parse_completion(body, "m", tok, 100).stop == ()
        else:
            with pytest.raises(BadRequest, match=words):
                parse_completion(body, "m", tok, 100)
    assert parse_completion({"model": "m", "prompt": "hi", "stop": ["a", "b", "a"]}, "m", tok, 100).stop == ("a", "b")


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="abc-", max_size=40),
    stops=st.lists(st.text(alphabet="abc-", min_size=1, max_size=4), max_size=3),
    include=st.booleans(),
)
def test_streamed_cut_equals_the_reference(text: str, stops: list[str], include: bool) -> None:
    pieces, got, out = stream(text, stops, include_stop=include)
    want, consumed = reference_cut(text, stops, include)
    assert got == want
    assert out.stopped == (consumed is not None)
    if consumed is not None:
        assert out.num_tokens == consumed
        # Nothing after the cut point was released before the stop, in any chunk.
        assert "".join(pieces[:-1]) == want
