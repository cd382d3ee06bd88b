"""Characters spelled by several tokens stream whole: never as U+FFFD, also when the run is cut
inside one (issue 11 item 2). A byte tokenizer built here, then both real built-in tokenizers
(SentencePiece byte fallback in Gemma 3, byte-level BPE in SmolLM2)."""

from __future__ import annotations

import os

import pytest

from specdemo.core.engine import TextTracker

TEXT = "a🦩b ✓ 日本 𝔘!"
CHINESE = "推测解码先由小模型起草，再由大模型一次验证：快了，输出不变。𠀋𪚥"  # rare: split in Gemma too


class ByteFallbackTokenizer:
    """One token per UTF-8 byte; decodes like SentencePiece's byte fallback: whole characters
    where the bytes form one, else one U+FFFD per byte (so a half-sent emoji shows two or three)."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        data, out, i = bytes(ids), [], 0
        while i < len(data):
            for n in (1, 2, 3, 4):
                try:
                    out.append(data[i:i + n].decode("utf-8"))
                    i += n
                    break
                except UnicodeDecodeError:
                    pass
            else:
                out.append("\ufffd")
                i += 1
        return "".join(out)


def stream(tokenizer, ids, stop_strings=()) -> list[str]:
    """Feed ``ids`` one at a time as the engine does; the deltas, the last one final."""
    tracker = TextTracker(tokenizer, stop_strings)
    deltas = []
    for token in ids:
        tracker.add(token)
        deltas.append(tracker.delta())
    deltas.append(tracker.delta(final=True))
    return deltas


def check_stream(tokenizer, ids, want: str, stop_strings=()) -> None:
    deltas = stream(tokenizer, ids, stop_strings)
    assert not any("\ufffd" in d for d in deltas), deltas
    assert "".join(deltas) == want


def prefix_pieces(tokenizer, ids) -> list[str]:
    """The reference: each token's piece from the whole decode of every prefix, what it adds to
    the pieces so far (a decoder taking characters back adds nothing until it passes them)."""
    pieces, shown = [], ""
    for i in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:i], skip_special_tokens=True).rstrip("\ufffd")
        if text.startswith(shown):
            pieces.append(text[len(shown):])
            shown = text
        elif shown.startswith(text):
            pieces.append("")
        else:
            pieces.append(text[len(os.path.commonprefix([text, shown])):])
            shown = text
    return pieces


def tracked(tokenizer, ids, rounds, stop_strings=()) -> tuple[list[str], str]:
    """The pieces and the streamed text when the engine emits ``ids`` in rounds of the given
    sizes (cycled), as a speculative decode does: add each token, then pieces() and delta()."""
    tracker, pieces, deltas, i, r = TextTracker(tokenizer, stop_strings), [], [], 0, 0
    while i < len(ids):
        size = rounds[r % len(rounds)]
        for token in ids[i:i + size]:
            tracker.add(token)
        got = tracker.pieces()
        assert len(got) == len(ids[i:i + size])
        pieces += got
        deltas.append(tracker.delta())
        i, r = i + size, r + 1
    deltas.append(tracker.delta(final=True))
    assert tracker.pieces() == []
    return pieces, "".join(deltas)


ROUNDS = [(1,), (4,), (3, 1, 5, 2), (7, 1)]


def check_pieces(tokenizer, ids, want: str) -> None:
    """Whatever the rounds, the pieces are the prefix decodes' pieces and join to the text
    streamed (byte for byte, incl. characters split across tokens)."""
    reference = prefix_pieces(tokenizer, ids)
    for rounds in ROUNDS:
        pieces, streamed = tracked(tokenizer, ids, rounds)
        assert pieces == reference, rounds
        assert not any("\ufffd" in p for p in pieces), pieces
        assert "".join(pieces) == streamed == want


@pytest.mark.parametrize("stop_strings", [(), ("zz",)])
def test_multibyte_characters_stream_whole(stop_strings):
    tok = ByteFallbackTokenizer()
    check_stream(tok, tok.encode(TEXT), TEXT, stop_strings)


@pytest.mark.parametrize("stop_strings", [(), ("zz",)])
def test_a_character_cut_at_the_end_is_not_shown_broken(stop_strings):
    """max_new_tokens or Stop after two of the four bytes of the flamingo: the text ends before it."""
    tok = ByteFallbackTokenizer()
    ids = tok.encode("a🦩")[:3]
    check_stream(tok, ids, "a", stop_strings)
    check_pieces(tok, ids, "a")


@pytest.mark.parametrize("text", [TEXT, CHINESE])
def test_token_pieces_join_to_the_streamed_text(text):
    tok = ByteFallbackTokenizer()
    check_pieces(tok, tok.encode(text), text)


class TakesBackTokenizer(ByteFallbackTokenizer):
    """One token per UTF-8 byte; a run of byte tokens that does not decode whole decodes as one
    U+FFFD per byte, finished characters in it too (Gemma 3's byte fallback: ``。𠀋`` then
    ``。�����`` once the first byte of the next rare character follows)."""

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        try:
            return bytes(ids).decode("utf-8")
        except UnicodeDecodeError:
            data = bytes(ids)
            cut = len(data)
            while cut and data[cut - 1] >= 0x80:  # the trailing run of non-ASCII bytes
                cut -= 1
            return data[:cut].decode("utf-8") + "\ufffd" * (len(data) - cut)


def test_a_character_taken_back_by_the_decoder_is_shown_once():
    """Two rare characters in a row: the first reads as U+FFFD again while the second is
    incomplete; its piece is not handed out a second time (the race's old second decode
    showed it twice in the page's pane)."""
    tok, text = TakesBackTokenizer(), "a𠀋𪚥b"
    ids = tok.encode(text)
    assert tok.decode(ids[:5]) == "a𠀋" and tok.decode(ids[:6]).rstrip("\ufffd") == "a"
    for rounds in ROUNDS:
        pieces, streamed = tracked(tok, ids, rounds)
        assert "".join(pieces) == streamed == text, rounds
        assert pieces.count("𠀋") == 1 and len(pieces) == len(ids)


def test_with_stop_strings_the_pieces_come_with_each_token():
    """With stop strings each token is decoded whole anyway: its piece is that decode's; the
    pieces go on past the stop string (the streamed text ends before it)."""
    tok = ByteFallbackTokenizer()
    ids = tok.encode("日本zz語")
    pieces, streamed = tracked(tok, ids, (3, 2), stop_strings=("zz",))
    assert pieces == prefix_pieces(tok, ids) and "".join(pieces) == "日本zz語"
    assert streamed == "日本"


@pytest.fixture(scope="module", params=["builtin:gemma3-270m", "builtin:smollm2-135m"])
def real_tokenizer(request):
    from specdemo.models.loading import load_tokenizer
    return load_tokenizer(request.param)


@pytest.mark.slow
def test_real_tokenizers_stream_split_characters_whole(real_tokenizer):
    ids = real_tokenizer.encode(TEXT, add_special_tokens=False)
    whole = real_tokenizer.decode(ids, skip_special_tokens=True)
    assert whole == TEXT
    split = [i for i in range(1, len(ids)) if "\ufffd" in real_tokenizer.decode(ids[:i])]
    assert split, "the text must contain a character spelled by several tokens"
    check_stream(real_tokenizer, ids, TEXT)
    check_pieces(real_tokenizer, ids, TEXT)
    chinese = real_tokenizer.encode(CHINESE * 3, add_special_tokens=False)
    assert any("\ufffd" in real_tokenizer.decode(chinese[:i]) for i in range(1, len(chinese)))
    check_pieces(real_tokenizer, chinese, CHINESE * 3)  # past the tracker's window
    for cut in split:  # a run that ends inside a character: everything before it, nothing broken
        want = real_tokenizer.decode(ids[:cut]).rstrip("\ufffd")
        check_stream(real_tokenizer, ids[:cut], want)
        check_pieces(real_tokenizer, ids[:cut], want)


@pytest.mark.slow
def test_gemma_flamingo_byte_fallback_ids():
    """The ids from the report: 🦩 = <0xF0> <0x9F> <0xA6> <0xA9> in Gemma 3's tokenizer."""
    from specdemo.models.loading import load_tokenizer
    tok = load_tokenizer("builtin:gemma3-270m")
    assert stream(tok, [478, 397, 404, 407]) == ["", "", "", "🦩", ""]
