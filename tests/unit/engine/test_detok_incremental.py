"""Incremental detokenization with the real SmolLM2 (byte-level BPE) tokenizer."""
from __future__ import annotations

from typing import Any

import pytest

from engine.detokenizer import IncrementalDetokenizer
from engine.model_text import load_tokenizer


@pytest.fixture(scope="module")
def tok() -> Any:
    # From the converted model folder when there is one, else straight from the GGUF (seconds).
    return load_tokenizer("smollm2-135m-instruct")


def stream(tok: Any, text: str, stop: tuple[str, ...] = (), prompt: str = "") -> tuple[list[str], IncrementalDetokenizer]:
    """Feed text's tokens one at a time; returns the deltas (final flush last) and the detokenizer."""
    d = IncrementalDetokenizer(tok, tok.encode(prompt) if prompt else [], stop)
    deltas = []
    for t in tok.encode(text):
        stopped = d.add_token(t)
        deltas.append(d.take_delta())
        if stopped:
            break
    deltas.append(d.take_delta(final=True))
    return deltas, d


@pytest.mark.parametrize("text", ["Hi 👋 there 🎉🚀!", "你好，世界。日本語のテキスト、한국어", "naïve café 🧑‍🚀 done"])
def test_deltas_never_end_inside_a_character(tok: Any, text: str) -> None:
    ids = tok.encode(text)
    # The point of the test: some character really is split across tokens.
    assert any("\ufffd" in tok.decode([t]) for t in ids)
    deltas, _ = stream(tok, text)
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text
    assert "" in deltas[:-1]  # a step whose token only held part of a character emits nothing


def test_stop_string_straddling_tokens_is_cut_and_never_emitted(tok: Any) -> None:
    text = "The answer is 42. Observation: the tool said so."
    stop = "Observation:"
    ids = tok.encode(text)
    # The stop string spans several tokens, so it completes over several steps.
    assert not any(stop in tok.decode([t]) for t in ids)
    deltas, d = stream(tok, text, stop=(stop,))
    assert d.stopped and d.stop_string == stop
    assert "".join(deltas) == "The answer is 42. "
    # No prefix of the stop string ever left before the stop was decided.
    assert all("Obs" not in x for x in deltas)


def test_held_back_prefix_is_released_when_it_is_not_a_stop(tok: Any) -> None:
    text = "It was an Obscure Observatory, quite obscure."
    d = IncrementalDetokenizer(tok, [], ("Observation:",))
    emitted = ""
    held = 0
    for t in tok.encode(text):
        assert not d.add_token(t)
        emitted += d.take_delta()
        # Whatever was not emitted yet is a possible start of the stop string.
        pending = d.text[len(emitted) :]
        assert "Observation:".startswith(pending)
        held += bool(pending)
    assert held > 0  # "Obs", "Observ", ... were held back for a while
    assert emitted + d.take_delta(final=True) == text


def test_earliest_of_several_stop_strings_wins_and_text_inside_one_token_is_cut(tok: Any) -> None:
    text = "alpha\n\nbeta END gamma"
    deltas, d = stream(tok, text, stop=("END", "\n\n"))
    assert d.stopped and d.stop_string == "\n\n"
    assert "".join(deltas) == "alpha"


def test_stop_at_the_very_start_emits_nothing(tok: Any) -> None:
    deltas, d = stream(tok, "User: hi", stop=("User:",))
    assert d.stopped and "".join(deltas) == ""


def test_prompt_context_keeps_leading_spaces_and_special_tokens_are_skipped(tok: Any) -> None:
    d = IncrementalDetokenizer(tok, tok.encode("Hello"), ())
    out = ""
    for t in tok.encode(" world, again") + [tok.eos_token_id]:
        d.add_token(t)
        out += d.take_delta()
    assert out == " world, again"  # leading space kept, <|im_end|> not rendered


def test_final_flush_releases_a_held_back_stop_prefix(tok: Any) -> None:
    d = IncrementalDetokenizer(tok, [], ("STOP NOW",))
    for t in tok.encode("ends with STOP"):
        d.add_token(t)
    assert d.take_delta() == "ends with "
    assert d.take_delta(final=True) == "STOP"
