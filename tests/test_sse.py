"""The SSE parser: line endings, multi-line data, comments, event names, splits anywhere, bad bytes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slobench.targets.sse import DONE, SSEDecodeError, SSEEvent, SSEParser


def parse(stream: bytes, cuts: list[int] | None = None) -> list[SSEEvent]:
    p = SSEParser()
    out: list[SSEEvent] = []
    prev = 0
    for cut in sorted(cuts or []):
        out += p.feed(stream[prev:cut])
        prev = cut
    out += p.feed(stream[prev:])
    return out


def datas(events: list[SSEEvent]) -> list[str]:
    return [e.data for e in events]


def test_openai_style_stream() -> None:
    s = b'data: {"a":1}\n\ndata: {"a":2}\n\ndata: [DONE]\n\n'
    assert datas(parse(s)) == ['{"a":1}', '{"a":2}', DONE]


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_line_endings(eol: bytes) -> None:
    s = eol.join([b"event: add", b"data: one", b"data: two", b"", b"data: three", b"", b""])
    assert parse(s) == [SSEEvent("one\ntwo", "add"), SSEEvent("three", "message")]


def test_crlf_split_between_cr_and_lf_is_one_line_ending() -> None:
    s = b"data: a\r\n\r\ndata: b\r\n\r\n"
    for cut in range(len(s) + 1):
        assert datas(parse(s, [cut])) == ["a", "b"], cut


def test_lone_cr_then_lf_in_next_feed_ends_only_one_line() -> None:
    p = SSEParser()
    assert p.feed(b"data: a\r") == []
    # the \n belongs to the \r: if it counted as a second line ending, "a" would be dispatched here
    assert p.feed(b"\n") == []
    assert datas(p.feed(b"\r\n")) == ["a"]


def test_comments_and_keepalives_are_skipped() -> None:
    s = b": keep-alive\n\n:\ndata: x\n: inside an event\ndata: y\n\n"
    assert datas(parse(s)) == ["x\ny"]


def test_field_parsing_rules() -> None:
    s = b"data:nospace\n\ndata:  two spaces\n\ndata\n\nretry: 5\nfoo: bar\ndata: z\n\n"
    assert datas(parse(s)) == ["nospace", " two spaces", "", "z"]


def test_event_without_data_is_not_dispatched_and_resets_the_name() -> None:
    s = b"event: ping\n\ndata: after\n\n"
    assert parse(s) == [SSEEvent("after", "message")]


def test_ids_persist_and_nul_ids_are_ignored() -> None:
    s = b"id: 7\ndata: a\n\ndata: b\n\nid: x\0y\ndata: c\n\n"
    assert [e.id for e in parse(s)] == ["7", "7", "7"]


def test_incomplete_final_event_is_not_dispatched_but_is_reported() -> None:
    p = SSEParser()
    assert p.feed(b"data: a\n\ndata: partial") == [SSEEvent("a")]
    assert p.has_pending
    p2 = SSEParser()
    p2.feed(b"data: a\n\n")
    assert not p2.has_pending
    p3 = SSEParser()
    p3.feed(b"data: a\n")  # line complete, event not
    assert p3.has_pending


def test_multibyte_utf8_split_anywhere() -> None:
    s = "data: héllo → 世界 🎉\n\n".encode()
    for cut in range(len(s) + 1):
        assert datas(parse(s, [cut])) == ["héllo → 世界 🎉"], cut


def test_bom_is_skipped_even_when_split() -> None:
    s = b"\xef\xbb\xbfdata: a\n\n"
    for cut in range(5):
        assert datas(parse(s, [cut])) == ["a"], cut


def test_non_utf8_raises_a_clear_error_carrying_the_good_events_before_it() -> None:
    with pytest.raises(SSEDecodeError, match=r"not UTF-8: byte 0xff") as e:
        SSEParser().feed(b"data: ok\n\ndata: \xff\xfe bad\n\ndata: after\n\n")
    assert datas(e.value.events) == ["ok"]
    with pytest.raises(SSEDecodeError) as e:
        SSEParser().feed(b"data: \xff\n\n")
    assert e.value.events == []


def test_an_empty_feed_between_cr_and_lf_changes_nothing() -> None:
    p = SSEParser()
    assert p.feed(b"data: a\r") == []
    assert p.feed(b"") == []
    assert p.feed(b"\n") == []  # still the \r's partner, not a blank line
    assert datas(p.feed(b"\r\n")) == ["a"]


def test_empty_feeds_are_harmless() -> None:
    p = SSEParser()
    assert p.feed(b"") == []
    assert p.feed(b"data: a") == []
    assert p.feed(b"") == []
    assert datas(p.feed(b"\n\n")) == ["a"]


# ---- property: any split of a valid stream yields the same events -------------------------------------

_text = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=12)
_event = st.tuples(
    st.lists(_text, min_size=1, max_size=3),  # data lines
    st.one_of(st.none(), _text.filter(lambda s: s != "")),  # event name
    st.booleans(),  # a comment line inside
)


def _serialise(events: list[tuple[list[str], str | None, bool]], eol: str) -> tuple[bytes, list[SSEEvent]]:
    lines: list[str] = []
    expected: list[SSEEvent] = []
    for data_lines, name, comment in events:
        if name is not None:
            lines.append(f"event: {name}")
        if comment:
            lines.append(": keep-alive")
        lines += [f"data: {d}" for d in data_lines]
        lines.append("")
        expected.append(SSEEvent("\n".join(data_lines), name or "message"))
    return ("".join(line + eol for line in lines)).encode(), expected


@settings(max_examples=300, deadline=None)
@given(
    events=st.lists(_event, max_size=6),
    eol=st.sampled_from(["\n", "\r\n", "\r"]),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_any_split_yields_the_same_events(
    events: list[tuple[list[str], str | None, bool]], eol: str, cuts: list[int]
) -> None:
    stream, expected = _serialise(events, eol)
    whole = parse(stream)
    assert whole == expected
    assert parse(stream, [c % (len(stream) + 1) for c in cuts]) == expected


@settings(max_examples=50, deadline=None)
@given(events=st.lists(_event, min_size=1, max_size=4), eol=st.sampled_from(["\n", "\r\n", "\r"]))
def test_byte_at_a_time_matches_whole(events: list[tuple[list[str], str | None, bool]], eol: str) -> None:
    stream, expected = _serialise(events, eol)
    assert parse(stream, list(range(len(stream)))) == expected


def test_a_long_line_in_many_pieces_is_one_event_and_an_endless_line_is_refused() -> None:
    from slobench.targets.sse import SSELineTooLong

    p = SSEParser(max_line_bytes=1_000_000)
    line = b"data: " + b"x" * 500_000 + b"\n\n"
    got = []
    for i in range(0, len(line), 1000):  # 500 pieces: each used to copy the whole tail gathered so far
        got += p.feed(line[i : i + 1000])
    assert [len(e.data) for e in got] == [500_000] and not p.has_pending
    p = SSEParser(max_line_bytes=10_000)
    with pytest.raises(SSELineTooLong, match=r"over the 10000 bytes limit \(--max-body\)"):
        for _ in range(20):
            p.feed(b"data: " + b"y" * 1000)


# ---- the fast path (data_events) agrees with feed ----------------------------------------------------------


def parse_fast(pieces: list[bytes]) -> list[SSEEvent]:
    """As the OpenAI target reads: a piece of whole data events skips `feed` (when all its bytes decode)."""
    p = SSEParser()
    out: list[SSEEvent] = []
    for piece in pieces:
        datas = p.data_events(piece)
        if datas is not None:
            try:
                out += [SSEEvent(d.decode("utf-8"), "message", p._last_id) for d in datas]
                continue
            except UnicodeDecodeError:
                pass
        out += p.feed(piece)
    return out


def test_data_events_takes_only_whole_data_events_with_nothing_pending() -> None:
    p = SSEParser()
    assert p.data_events(b'data: {"a":1}\n\n') == [b'{"a":1}']
    assert p.data_events(b"data: a\n\ndata: [DONE]\n\n") == [b"a", b"[DONE]"]
    for not_only_data in (b"data: a\n", b"data: a\r\n\r\n", b"data:a\n\n", b"event: x\n\n", b"data: a\ndata: b\n\n",
                          b"\xef\xbb\xbfdata: a\n\n", b": hi\n\n", b"data: a\n\n: hi\n\n", b"data: a\n\n\n\n",
                          b"data: a\n\nid: 7\n\n", b"data: a\n\ndata: b"):
        assert p.data_events(not_only_data) is None, not_only_data
    p.feed(b"data: half")  # a line is pending: the next piece must go through feed
    assert p.data_events(b"data: x\n\n") is None
    assert datas(p.feed(b"\n\n")) == ["half"]
    p.feed(b"event: e\n")  # an event name is pending
    assert p.data_events(b"data: x\n\n") is None
    assert p.feed(b"data: x\n\n") == [SSEEvent("x", "e")]
    p.feed(b"data: y\r")  # a \n may still come to finish this \r
    assert p.data_events(b"data: z\n\n") is None


@settings(max_examples=300, deadline=None)
@given(
    events=st.lists(_event, max_size=6),
    eol=st.sampled_from(["\n", "\r\n", "\r"]),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8),
    is_event_per_piece=st.booleans(),
    events_per_piece=st.integers(min_value=1, max_value=3),
    junk=st.one_of(st.none(), st.binary(max_size=12)),
)
def test_the_fast_path_yields_what_feed_yields(
    events: list[tuple[list[str], str | None, bool]], eol: str, cuts: list[int], is_event_per_piece: bool,
    events_per_piece: int, junk: bytes | None,
) -> None:
    stream, _ = _serialise(events, eol)
    if is_event_per_piece:  # reads at event boundaries, as servers write them: one event a read, or a few
        ends = [i + 2 for i in range(len(stream)) if stream[i : i + 2] == b"\n\n"]
        cuts = ends[::events_per_piece]
    bounds = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    pieces = [stream[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    if junk is not None:  # bytes that may not be UTF-8 or SSE at all, as a piece of their own
        pieces.insert(len(pieces) // 2, b"data: " + junk + b"\n\n")
    try:
        expected = parse(b"".join(pieces), [sum(map(len, pieces[:i])) for i in range(1, len(pieces))])
    except SSEDecodeError:
        with pytest.raises(SSEDecodeError):
            parse_fast(pieces)
        return
    assert parse_fast(pieces) == expected
