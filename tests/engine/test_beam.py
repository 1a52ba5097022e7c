import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from pagedllm.engine.beam import BeamSearch, BeamStep
from pagedllm.engine.sampler import BeamCandidates
from pagedllm.sampling_params import SamplingParams

PROMPT = [5, 17, 42, 9]
MAX_NEW = 12


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    cfg = LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        initializer_range=0.3,  # peaky distributions: no near-ties between beams
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    # float64 so cached (HF) and uncached (ours) forwards give the same float32 logits
    return LlamaForCausalLM(cfg).double().eval()


def beam_params(width: int, length_penalty: float, early_stopping) -> SamplingParams:
    return SamplingParams(n=width, use_beam_search=True, temperature=0.0, max_tokens=MAX_NEW,
                          length_penalty=length_penalty, early_stopping=early_stopping)


class FakeKV:
    """What the engine does with a BeamStep: fork, then free, then append; checks the contract."""

    def __init__(self, root_id: int) -> None:
        self.seqs: dict[int, list[int]] = {root_id: []}

    def apply(self, step: BeamStep) -> None:
        for parent, child in step.forks:
            assert parent in self.seqs and child not in self.seqs
            self.seqs[child] = list(self.seqs[parent])
        for beam_id in step.freed:
            del self.seqs[beam_id]
        for beam in step.live:
            self.seqs[beam.beam_id].append(beam.token_ids[-1])
            assert self.seqs[beam.beam_id] == beam.token_ids
        assert set(self.seqs) == {b.beam_id for b in step.live}


@torch.no_grad()
def run_ours(model, params: SamplingParams, eos: int) -> list[list[int]]:
    search = BeamSearch(params, {eos}, max_tokens=MAX_NEW, root_id=100)
    kv = FakeKV(100)
    while not search.done:
        seqs = torch.tensor([PROMPT + b.token_ids for b in search.live])
        kv.apply(search.step(model(seqs).logits[:, -1, :].float()))
    assert kv.seqs == {}  # everything freed at the end
    return [h.token_ids for h in search.best()]


@torch.no_grad()
def run_hf(model, params: SamplingParams, eos: int) -> torch.Tensor:
    out = model.generate(
        torch.tensor([PROMPT]), num_beams=params.beam_width, num_return_sequences=params.n,
        do_sample=False, max_new_tokens=MAX_NEW, length_penalty=params.length_penalty,
        early_stopping=params.early_stopping, eos_token_id=eos, pad_token_id=eos,
    )
    return out[:, len(PROMPT):]


# eos 26 / 61 / 108: tokens the model likes at different depths, so hypotheses finish early and late
@pytest.mark.parametrize(
    "width, length_penalty, early_stopping, eos",
    [
        (3, 1.0, False, 26),
        (3, 1.0, True, 61),
        (2, 0.0, "never", 61),
        (4, 2.0, "never", 26),
        (3, -1.0, False, 108),
        (4, 0.5, True, 26),
        (2, 1.0, False, 127),  # rarely chosen: beams run to max_tokens
    ],
)
def test_matches_transformers_beam_search(model, width, length_penalty, early_stopping, eos):
    params = beam_params(width, length_penalty, early_stopping)
    expected = run_hf(model, params, eos)
    ours = run_ours(model, params, eos)
    padded = [h + [eos] * (expected.shape[1] - len(h)) for h in ours]
    assert padded == expected.tolist()


def test_forks_reuse_parent_id_and_free_dropped_beams():
    search = BeamSearch(beam_params(2, 1.0, False), {0}, max_tokens=10, root_id=7)
    # the root (index 0) yields both survivors: one continues as id 7, one is a fork
    step = search.advance(BeamCandidates(parents=[0, 0, 0, 0], token_ids=[4, 5, 6, 8], cum_logprobs=[-1, -2, -3, -4]))
    assert step.forks == [(7, 8)] and step.freed == [] and [b.beam_id for b in step.live] == [7, 8]
    # both survivors come from beam 8: beam 7 is freed, 8 continues and forks
    step = search.advance(BeamCandidates(parents=[1, 1, 0, 0], token_ids=[1, 2, 3, 9], cum_logprobs=[-2.5, -2.6, -3, -4]))
    assert step.forks == [(8, 9)] and step.freed == [7]
    assert [b.token_ids for b in step.live] == [[5, 1], [5, 2]]


def test_eos_candidate_becomes_hypothesis_with_length_penalty():
    params = SamplingParams(n=1, beam_width=2, use_beam_search=True, temperature=0, length_penalty=2.0, max_tokens=10)
    search = BeamSearch(params, {0}, max_tokens=10)
    search.advance(BeamCandidates([0, 0, 0, 0], [4, 5, 6, 8], [-1, -2, -3, -4]))
    step = search.advance(BeamCandidates([0, 1, 0, 1], [0, 3, 7, 9], [-1.2, -2.1, -2.5, -3]))
    assert [b.token_ids for b in step.live] == [[5, 3], [4, 7]]
    (hyp,) = search.hypotheses
    assert hyp.token_ids == [4, 0] and hyp.finish_reason == "stop"
    assert hyp.score == pytest.approx(-1.2 / 2**2)


def test_min_tokens_blocks_eos_and_leaves_the_beams_logprobs_the_models_own(model):
    """Stop tokens are left out before min_tokens, but a beam's logprobs stay the model's log-softmax (as
    transformers scores them), not renormalised over the tokens still allowed."""
    params = SamplingParams(n=2, use_beam_search=True, temperature=0, max_tokens=4, min_tokens=3)
    search = BeamSearch(params, {108}, max_tokens=4)  # 108 is the top first token
    while not search.done:
        seqs = torch.tensor([PROMPT + b.token_ids for b in search.live])
        with torch.no_grad():
            search.step(model(seqs).logits[:, -1, :].float())
    for hyp in search.best():
        assert 108 not in hyp.token_ids[:3]
        with torch.no_grad():
            logprobs = torch.log_softmax(model(torch.tensor([PROMPT + hyp.token_ids])).logits[0].float(), -1)
        model_sum = sum(logprobs[len(PROMPT) - 1 + i, t].item() for i, t in enumerate(hyp.token_ids))
        assert hyp.cum_logprob == pytest.approx(model_sum, abs=1e-4)


def test_only_width_hypotheses_are_kept_and_the_worst_kept_one_decides_the_stop():
    search = BeamSearch(beam_params(2, 1.0, False), {0}, max_tokens=10)
    search.advance(BeamCandidates([0, 0, 0, 0], [0, 4, 5, 6], [-0.5, -1, -2, -3]))  # [0] finishes: -0.5
    step = search.advance(BeamCandidates([0, 0, 1, 1], [7, 0, 0, 8], [-1.3, -1.4, -2.3, -3]))  # [4, 0]: -0.7
    assert not step.done  # the best live beam scores -1.3 / 2 = -0.65, better than -0.7
    step = search.advance(BeamCandidates([0, 0, 1, 1], [0, 9, 0, 10], [-1.8, -1.95, -3.5, -4]))  # [4, 7, 0]: -0.6
    assert [h.token_ids for h in search.hypotheses] == [[0], [4, 7, 0]]  # [4, 0] fell out
    assert step.done  # -1.95 / 3 = -0.65 cannot beat the worst kept hypothesis, -0.6
    assert [h.token_ids for h in search.best()] == [[0], [4, 7, 0]]
