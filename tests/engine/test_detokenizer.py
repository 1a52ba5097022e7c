import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedllm.engine.detokenizer import IncrementalDetokenizer, direct_decoder
from pagedllm.sampling_params import SamplingParams

GGUF = Path.home() / ".cache" / "pagedllm" / "SmolLM2-135M-Instruct.Q4_1.gguf"

TEXTS = [
    "Hello wörld! Ça va? naïve façade, Ærøskøbing.",
    "Emoji: 😀🎉👩‍👩‍👧 and flags 🇫🇷🇯🇵 done",
    "中文测试：你好，世界。日本語のテキスト、한국어 텍스트.",
    "def f(x):\n    return {'a': x ** 2}  # ü → ∑\n\tprint(f(3))",
    "   leading spaces and trailing   ",
    "mixed: a😀b中c\u00e9d\n\n end",
]


@pytest.fixture(scope="module")
def tokenizer():
    if not GGUF.exists():
        pytest.skip("default model not fetched (pagedllm fetch-default-model)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name)


def stream(tokenizer, ids: list[int], params: SamplingParams, prompt: list[int] = (), stop_ids=frozenset()):
    detok = IncrementalDetokenizer(tokenizer, params, list(prompt), stop_ids)
    deltas = []
    for t in ids:
        deltas.append(detok.append(t))
        if detok.finished:
            break
    deltas.append(detok.finish())
    return detok, deltas


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_concatenate_to_full_decode(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    prompt = tokenizer.encode("Say something:", add_special_tokens=False)
    detok, deltas = stream(tokenizer, ids, SamplingParams(), prompt)
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert detok.text == text and detok.stop_reason is None
    assert not any("\ufffd" in d for d in deltas)


def test_split_character_is_held_until_complete(tokenizer):
    ids = tokenizer.encode(" 😀", add_special_tokens=False)
    assert len(ids) > 1  # byte-level pieces of one character
    detok = IncrementalDetokenizer(tokenizer, SamplingParams(), [])
    deltas = [detok.append(t) for t in ids]
    assert deltas[:-1] == [""] * (len(ids) - 1) and deltas[-1] == " 😀"


def test_special_tokens_skipped_or_kept(tokenizer):
    ids = tokenizer.encode("Hi<|im_end|>", add_special_tokens=False)
    _, deltas = stream(tokenizer, ids, SamplingParams())
    assert "".join(deltas) == "Hi"
    _, deltas = stream(tokenizer, ids, SamplingParams(skip_special_tokens=False))
    assert "".join(deltas) == "Hi<|im_end|>"


def test_stop_token_adds_no_text(tokenizer):
    eos = tokenizer.eos_token_id
    ids = tokenizer.encode("Done", add_special_tokens=False) + [eos]
    params = SamplingParams(skip_special_tokens=False)
    _, deltas = stream(tokenizer, ids, params, stop_ids={eos})
    assert "".join(deltas) == "Done"


@pytest.mark.parametrize(
    "text, stop, expected, reason",
    [
        ("The answer is 42. END OF ANSWER and more", ["END OF ANSWER"], "The answer is 42. ", "END OF ANSWER"),
        ("Line one\n\nLine two", ["\n\n"], "Line one", "\n\n"),
        ("emoji 😀🎉 stop here", ["🎉 st"], "emoji 😀", "🎉 st"),
        ("abc ENDX ENDING", ["ENDING", "ENDX"], "abc ", "ENDX"),  # earliest match wins
        ("no stop in here", ["zzz"], "no stop in here", None),
    ],
)
def test_stop_strings_cut_and_never_leak(tokenizer, text, stop, expected, reason):
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok, deltas = stream(tokenizer, ids, SamplingParams(stop=stop))
    # emitted text cannot be taken back: any leaked stop text would make the join longer
    assert "".join(deltas) == detok.text == expected
    assert detok.stop_reason == reason


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    text=st.text(st.characters(exclude_categories=("Cs",)), max_size=40),
    stop=st.text(alphabet="ab 😀é", min_size=1, max_size=3),
)
def test_random_text_streams_like_full_decode(tokenizer, text, stop):
    ids = tokenizer.encode(text + " ab😀é a", add_special_tokens=False)
    full = tokenizer.decode(ids)
    detok, deltas = stream(tokenizer, ids, SamplingParams(stop=[stop]))
    cut = full.find(stop)
    assert "".join(deltas) == (full if cut < 0 else full[:cut])
    assert all("\ufffd" not in d for d in deltas) or "\ufffd" in full


def test_partial_stop_text_is_held_back(tokenizer):
    text = "Result: STOP"
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, SamplingParams(stop=["STOP"]), [])
    out = ""
    for t in ids:
        out += detok.append(t)
        assert "S" not in out.replace("Result", "")  # not even the first letter of STOP
    assert out == "Result: " and detok.stop_reason == "STOP" and detok.finished
    assert detok.append(tokenizer.encode(" more", add_special_tokens=False)[0]) == ""


def test_held_back_false_start_is_released(tokenizer):
    text = "a STO b STOP"
    ids = tokenizer.encode(text, add_special_tokens=False)
    detok, deltas = stream(tokenizer, ids, SamplingParams(stop=["STOP"]))
    assert "".join(deltas) == "a STO b "


def test_include_stop_str_in_output(tokenizer):
    ids = tokenizer.encode("x = 1; END; y", add_special_tokens=False)
    detok, deltas = stream(tokenizer, ids, SamplingParams(stop=["END"], include_stop_str_in_output=True))
    assert "".join(deltas) == detok.text == "x = 1; END"


def test_no_stop_string_ends_the_output_before_min_tokens(tokenizer):
    """As for EOS and stop ids: before min_tokens output tokens, a stop string is only text."""
    text = " Paris is the capital. Paris is big."
    ids = tokenizer.encode(text, add_special_tokens=False)
    first = len(tokenizer.encode(" Paris", add_special_tokens=False))
    detok, deltas = stream(tokenizer, ids, SamplingParams(stop=[" Paris"], min_tokens=first + 1))
    assert detok.text == "".join(deltas) == " Paris is the capital."
    assert detok.stop_reason == " Paris"
    detok, _ = stream(tokenizer, ids, SamplingParams(stop=[" Paris"]))
    assert detok.text == ""


def test_finish_flushes_held_stop_prefix(tokenizer):
    ids = tokenizer.encode("ends with ST", add_special_tokens=False)
    detok, deltas = stream(tokenizer, ids, SamplingParams(stop=["STOP"]))
    assert deltas[-1].endswith("ST") and "".join(deltas) == detok.text == "ends with ST"


@pytest.mark.parametrize("text", TEXTS)
def test_direct_decoder_streams_the_same_text(tokenizer, text):
    """The Rust decoder under the transformers tokenizer, where it agrees, gives the same deltas."""
    direct = direct_decoder(tokenizer)
    assert direct is tokenizer.backend_tokenizer  # the default model's tokenizer adds nothing to it
    ids = tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)
    prompt = tokenizer.encode("Say something:", add_special_tokens=False)
    for skip in (True, False):
        params = SamplingParams(skip_special_tokens=skip)
        assert stream(direct, ids, params, prompt)[1] == stream(tokenizer, ids, params, prompt)[1]


def test_direct_decoder_keeps_a_tokenizer_whose_decode_changes_the_text(tokenizer):
    class Wrapper:  # the default model's tokenizer, its decode changed as a clean-up of spaces would
        backend_tokenizer = tokenizer.backend_tokenizer
        all_special_ids = tokenizer.all_special_ids
        clean_up_tokenization_spaces = False

        def __len__(self) -> int:
            return len(tokenizer)

        def encode(self, text, add_special_tokens=False):
            return tokenizer.encode(text, add_special_tokens=add_special_tokens)

        def decode(self, ids, skip_special_tokens=False):
            return tokenizer.decode(ids, skip_special_tokens=skip_special_tokens).replace(" .", ".")

    wrapper = Wrapper()
    assert direct_decoder(wrapper) is wrapper  # the probe decodes differently
    Wrapper.decode = lambda self, ids, skip_special_tokens=False: tokenizer.decode(ids, skip_special_tokens)
    assert direct_decoder(wrapper) is tokenizer.backend_tokenizer  # now the same text
    Wrapper.clean_up_tokenization_spaces = True
    assert direct_decoder(wrapper) is wrapper  # clean-up asked for: never the backend
    assert direct_decoder(tokenizer.backend_tokenizer) is tokenizer.backend_tokenizer  # no wrapper: itself


class Pieces:
    """Token i reads pieces[i]: the text split wherever a test needs."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(self.pieces[i] for i in ids)


@pytest.mark.parametrize("pieces", [["ab", "cd"], ["a", "b", "c", "d"]])
def test_of_overlapping_stop_strings_the_one_completed_first_ends_the_output(pieces):
    """As vLLM: whatever the tokens' split, "bc" completes before "abcd" does."""
    detok, deltas = stream(Pieces(pieces), list(range(len(pieces))), SamplingParams(stop=["abcd", "bc"]))
    assert (detok.text, "".join(deltas), detok.stop_reason) == ("a", "a", "bc")


def test_a_stop_string_counts_only_past_the_first_min_tokens_tokens():
    """As vLLM: the text of the first min_tokens tokens is never cut (min_tokens=1 let the first token's stop)."""
    for min_tokens, text in [(0, ""), (1, "Hello"), (2, "HelloHello")]:
        detok, _ = stream(Pieces(["Hello"]), [0] * 4, SamplingParams(stop=["Hello"], min_tokens=min_tokens))
        assert (detok.text, detok.stop_reason) == (text, "Hello")


@pytest.fixture(scope="module")
def byte_fallback():
    """A SentencePiece-style vocabulary (Llama 2, Mistral): characters outside it are spelled as <0xNN> byte
    tokens, and the decoder turns a run of byte tokens that is not valid UTF-8 wholly into U+FFFD."""
    from tokenizers import Tokenizer, decoders, models

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{b:02X}>": 3 + b for b in range(256)}
    for word in ["▁", "▁Reply", "▁emoji", ":", "▁yes"]:
        vocab[word] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Strip(" ", 1, 0)])
    return tokenizer


def balloon(tokenizer) -> list[int]:
    return [tokenizer.token_to_id(f"<0x{b:02X}>") for b in "🎈".encode()]


def test_a_prompt_ending_in_byte_tokens_does_not_spoil_the_output(byte_fallback):
    """The prompt's last five tokens start inside a character: decoded from there as context, the output's own
    byte tokens joined that invalid run."""
    ids = byte_fallback.token_to_id
    prompt = [ids("▁Reply"), ids("▁emoji"), ids(":"), ids("▁")] + balloon(byte_fallback) * 2
    out = balloon(byte_fallback) + [ids("▁yes")]
    detok, deltas = stream(byte_fallback, out, SamplingParams(), prompt)
    assert "".join(deltas) == detok.text == "🎈 yes"


def test_decode_after_reads_the_ids_as_they_follow_the_prompt(byte_fallback):
    from pagedllm.engine.detokenizer import decode_after

    yes = [byte_fallback.token_to_id("▁yes")]
    assert byte_fallback.decode(yes) == "yes"  # alone, the decoder strips a leading space
    assert decode_after(byte_fallback, [byte_fallback.token_to_id("▁Reply")], yes, True) == " yes"


def test_a_character_left_incomplete_at_the_end_is_dropped(tokenizer):
    """As vLLM: the output stops inside a character (max_tokens); its first bytes are not shown as U+FFFD, and
    neither is the space that came in the same token (vLLM shows a token's text only once it is whole)."""
    ids = tokenizer.encode(" ok 😀", add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(ids[1:]) == ["ĠðŁĺ", "Ģ"]  # the space and the emoji's first bytes
    detok, deltas = stream(tokenizer, ids[:-1], SamplingParams())
    assert "".join(deltas) == detok.text == " ok"


def test_text_held_back_for_a_character_is_dropped_whole_at_the_end(tokenizer):
    """Two tokens of text, each ending inside a character, held back together and dropped together."""
    ok, space_and_first_bytes = tokenizer.encode(" ok 😀", add_special_tokens=False)[:2]
    detok, deltas = stream(tokenizer, [ok, space_and_first_bytes, space_and_first_bytes], SamplingParams())
    assert "".join(deltas) == detok.text == " ok"


def test_a_beam_hypothesis_reads_as_it_follows_the_prompt(byte_fallback):
    """A finished beam search's text is decoded after its prompt, as a sampled completion's is: the first word
    keeps its leading space."""
    from types import SimpleNamespace

    from pagedllm.engine.beam import BeamSearch
    from pagedllm.engine.outcome import BeamChoice, StepOutcome
    from pagedllm.engine.sampler import BeamCandidates
    from pagedllm.engine.text_stage import detokenize

    ids = byte_fallback.token_to_id
    params = SamplingParams(use_beam_search=True, n=1, temperature=0.0, max_tokens=1)
    search = BeamSearch(params, {ids("</s>")}, max_tokens=1)
    step = search.advance(BeamCandidates([0, 0], [ids("▁yes"), ids("▁emoji")], [-0.1, -2.0]))
    request = SimpleNamespace(beam=search, params=params, prompt_token_ids=[ids("▁Reply"), ids(":")],
                              final_outputs=None)
    detokenize(StepOutcome(beams=[BeamChoice(request, step)]), byte_fallback)
    (output,) = request.final_outputs
    assert (output.text, output.token_ids, output.finish_reason) == (" yes", [ids("▁yes")], "length")
