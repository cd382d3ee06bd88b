"""Characters spelled by several tokens stream whole: never as U+FFFD, also when the run is cut
inside one (issue 11 item 2). A byte tokenizer built here, then both real built-in tokenizers
(SentencePiece byte fallback in Gemma 3, byte-level BPE in SmolLM2)."""

from __future__ import annotations

import pytest

from specdemo.core.engine import TextTracker
from specdemo.services.race import TokenPieces

TEXT = "a🦩b ✓ 日本 𝔘!"


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


def check_pieces(tokenizer, ids, want: str) -> None:
    pieces = TokenPieces(tokenizer)
    for token in ids:  # one at a time, as a live pane grows
        pieces.extend([token])
    assert len(pieces.pieces) == len(ids)
    assert not any("\ufffd" in p for p in pieces.pieces), pieces.pieces
    assert "".join(pieces.pieces) == want


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


def test_token_pieces_join_to_the_streamed_text():
    tok = ByteFallbackTokenizer()
    check_pieces(tok, tok.encode(TEXT), TEXT)


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
