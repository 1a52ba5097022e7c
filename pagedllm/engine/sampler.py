"""Sampler: turns one step's logits into one token per row (plus beam-search candidates).

Order per row: grammar (structured outputs) -> allowed tokens -> logit bias -> penalties -> bad words ->
min_tokens masking -> a forced token (a thinking budget's end: every other token -inf) -> (greedy argmax) or
temperature -> min-p -> top-k -> top-p (renormalised among what min-p and top-k leave, as vLLM orders them) ->
inverse-CDF draw.

Logprobs (the chosen token's and the top-k alternatives) come from the
log-softmax of the raw model logits, before penalties, temperature and
truncation — what vLLM returns by default; under a grammar, of the logits it leaves (vLLM masks them first too).

Reproducibility: a row with its own generator draws all of its randomness
from it (one uniform per step), and every op is row-wise, so its tokens
do not depend on which other rows share the batch.

Device: everything runs where the logits are (generators must be on that
device: make_generator takes it). Row indices and per-row parameters go to
the device through pagedllm.engine.device.to_device; one copy brings the
sampled ids and their logprobs back, a second the top logprobs when asked.
"""

import hashlib
from dataclasses import dataclass, field

import torch

from pagedllm.engine.bad_words import ban_bad_words
from pagedllm.engine.device import to_device, to_host
from pagedllm.engine.grammar import mask_disallowed
from pagedllm.kernels import load_cpu_kernels
from pagedllm.sampling_params import SamplingParams


@dataclass(slots=True)
class SamplingRow:
    params: SamplingParams
    generator: torch.Generator | None  # None: draws from torch's default generator
    prompt_ids: list[int]
    output_ids: list[int]
    bad_word_spellings: list[list[int]] = field(default_factory=list)  # engine/bad_words.py
    grammar: object | None = None  # structured outputs: the completion's matcher (engine/grammar.py)
    forced_token: int | None = None  # the token this step must write (a thinking budget's end: thinking_budget.py)


@dataclass(slots=True)
class SampleResult:
    token_id: int
    logprob: float  # raw model log-probability of token_id
    top_logprobs: dict[int, float] | None  # top-k raw logprobs when params.logprobs is set
    rank: int | None = None  # token_id's rank in the vocabulary by raw logprob, when params.logprobs is set


@dataclass(slots=True)
class BeamCandidates:
    """The best continuations across all live beams, best first."""

    parents: list[int]  # index of the live beam (row of the logits) each extends
    token_ids: list[int]
    cum_logprobs: list[float]  # parent's cumulative logprob + the token's logprob


def make_generator(seed: int | None, index: int = 0, device: str | torch.device = "cpu") -> torch.Generator | None:
    """A generator for completion `index` of a seeded request; None when unseeded.

    Each of the n completions gets its own stream, so n > 1 with a seed
    gives n different yet reproducible samples.
    """
    if seed is None:
        return None
    digest = hashlib.sha256(f"{seed}:{index}".encode()).digest()
    gen = torch.Generator(device=device)
    gen.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    return gen


def sample(logits: torch.Tensor, rows: list[SamplingRow], eos_token_ids: set[int]) -> list[SampleResult]:
    """Pick one token per row. logits: [N, V] float32, one row per entry of `rows`."""
    raw = logits = _grammar_masked(logits.float(), rows)
    log_z, picks = _log_normaliser(raw)  # [N, 1]: raw logprob = raw logit - log_z
    if any(changes_logits(r) for r in rows):
        logits = apply_penalties(apply_logit_bias(keep_allowed_tokens(logits.clone(), rows), rows), rows)
        ban_bad_words(logits, [r.bad_word_spellings for r in rows], [r.output_ids for r in rows])
        mask_stop_tokens(logits, rows, eos_token_ids)
        force_tokens(logits, rows)
        picks = None  # the raw logits' argmax no longer holds
    tokens = torch.empty(len(rows), dtype=torch.long, device=logits.device)
    greedy = [i for i, r in enumerate(rows) if r.params.greedy]
    randoms = [i for i, r in enumerate(rows) if not r.params.greedy]
    if len(greedy) == len(rows):  # the common case: no row index to send
        tokens = picks if picks is not None else logits.argmax(dim=-1)
    elif greedy:
        picked = _index(greedy, logits)
        tokens[picked] = picks[picked] if picks is not None else logits[picked].argmax(dim=-1)
    if len(randoms) == len(rows):  # no copy of the logits' rows (6 MB for 32 rows of 49152)
        tokens = _sample_random(logits, rows)
    elif randoms:
        picked = _index(randoms, logits)
        tokens[picked] = _sample_random(logits[picked], [rows[i] for i in randoms])
    return _results(raw, log_z, tokens, rows)


def _grammar_masked(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """The logits with what each row's grammar does not allow at -inf (a copy where a row has one): a row's
    logprobs are then those of its grammar's tokens, renormalised, as vLLM reports them under structured outputs."""
    matchers = [r.grammar for r in rows]
    if all(m is None for m in matchers):
        return logits
    masked = logits.clone()
    mask_disallowed(masked, matchers)
    return masked


def _log_normaliser(raw: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[N, 1] logsumexp of each row, and on the CPU with the compiled kernels [N] the first argmax of each row
    as well, from one compiled pass (2.7 ms where torch's two ops took 12 ms on [64, 49152], docs/engine.md).
    Rows holding a NaN or an infinite maximum keep torch's semantics: the whole batch goes to torch then."""
    kernels = load_cpu_kernels() if raw.device.type == "cpu" and raw.dim() == 2 and raw.stride(1) == 1 else None
    if kernels is not None:
        picks, log_z = kernels.greedy_summary(raw)
        if not torch.isnan(log_z).any():
            return log_z[:, None], picks
    return raw.logsumexp(dim=-1, keepdim=True), None


def changes_logits(row: SamplingRow) -> bool:
    """Whether the row's logits are changed before its pick, past its logprobs: allowed tokens, a logit bias,
    penalties, bad words, stop tokens masked (min_tokens), or a forced token."""
    params = row.params
    return (params.restricts_tokens or params.has_logit_bias or params.has_penalties or bool(row.bad_word_spellings)
            or len(row.output_ids) < params.min_tokens or row.forced_token is not None)


def keep_allowed_tokens(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Every token outside a row's allowed_token_ids gets -inf, in place."""
    for i, row in enumerate(rows):
        if row.params.restricts_tokens:
            allowed = _index(row.params.allowed_token_ids, logits)
            kept = logits[i, allowed]
            logits[i].fill_(float("-inf"))
            logits[i, allowed] = kept
    return logits


def apply_logit_bias(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Each row's logit_bias added to its tokens' logits, in place (one copy of every row's ids and values)."""
    entries = [(i, token, value) for i, r in enumerate(rows) if r.params.has_logit_bias
               for token, value in r.params.logit_bias.items()]  # fmt: skip
    if entries:  # float64 holds the ids exactly
        table = to_device(torch.tensor(entries, dtype=torch.float64), logits.device, "sampling params")
        logits.index_put_((table[:, 0].long(), table[:, 1].long()), table[:, 2].to(logits.dtype), accumulate=True)
    return logits


def apply_penalties(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Repetition (prompt + output), frequency and presence (output) penalties, in place."""
    idx = [i for i, r in enumerate(rows) if r.params.has_penalties]
    if not idx:
        return logits
    vocab = logits.shape[1]
    picked = _index(idx, logits)
    sub = logits[picked]  # [M, V]
    out_counts = _token_counts([rows[i].output_ids for i in idx], vocab, sub.device)
    prompt_seen = _token_counts([rows[i].prompt_ids for i in idx], vocab, sub.device) > 0
    rep, freq, pres = (_column(rows, idx, name, sub) for name in
                       ("repetition_penalty", "frequency_penalty", "presence_penalty"))
    seen = prompt_seen | (out_counts > 0)
    penalized = torch.where(sub > 0, sub / rep, sub * rep)
    sub = torch.where(seen, penalized, sub)
    sub = sub - freq * out_counts - pres * (out_counts > 0).to(sub.dtype)
    logits[picked] = sub
    return logits


def force_tokens(logits: torch.Tensor, rows: list[SamplingRow]) -> None:
    """-inf, in place, for every token but a row's forced one, which any pick then takes."""
    for i, row in enumerate(rows):
        if row.forced_token is not None:
            logits[i].fill_(float("-inf"))
            logits[i, row.forced_token] = 0.0


def mask_stop_tokens(logits: torch.Tensor, rows: list[SamplingRow], eos_token_ids: set[int]) -> None:
    """Forbid EOS / stop tokens for rows that have not yet produced min_tokens, in place."""
    for i, row in enumerate(rows):
        if len(row.output_ids) < row.params.min_tokens:
            banned = list(row.params.min_tokens_banned(eos_token_ids))
            if banned:
                logits[i, _index(banned, logits)] = float("-inf")


def beam_candidates(
    logits: torch.Tensor, cum_logprobs: torch.Tensor, k: int, banned: list[int] | None = None
) -> BeamCandidates:
    """Top-k (beam, token) continuations by cumulative logprob.

    logits: [B, V] for the B live beams; cum_logprobs: [B]. `banned` tokens (stop tokens before min_tokens) are
    left out after the log-softmax, so that every candidate's logprob is the model's own, not renormalised.
    """
    logprobs = torch.log_softmax(logits.float(), dim=-1)  # [B, V]
    if banned:
        logprobs[:, _index(banned, logprobs)] = float("-inf")
    logprobs += cum_logprobs[:, None].float()
    vocab = logprobs.shape[1]
    flat = logprobs.reshape(-1)
    values, indices = torch.topk(flat, k=min(k, flat.numel()))
    # one copy back: float64 holds the ids exactly and the float32 logprobs unchanged
    host = to_host(torch.stack([indices.double(), values.double()]), "beam candidates")
    indices, values = host[0].long(), host[1]
    return BeamCandidates(
        parents=(indices // vocab).tolist(),
        token_ids=(indices % vocab).tolist(),
        cum_logprobs=values.tolist(),
    )


def _token_counts(seqs: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    """[M, V] float counts of each token in each sequence (one scatter_add)."""
    width = max((len(s) for s in seqs), default=0)
    # pad with an extra column `vocab` that is dropped afterwards
    ids = torch.full((len(seqs), width), vocab, dtype=torch.long)
    for j, s in enumerate(seqs):
        ids[j, : len(s)] = torch.tensor(s, dtype=torch.long)
    counts = torch.zeros(len(seqs), vocab + 1, device=device)
    counts.scatter_add_(1, to_device(ids, device, "penalty tokens"), torch.ones(ids.shape, device=device))
    return counts[:, :vocab]


def _column(rows: list[SamplingRow], idx: list[int], name: str, like: torch.Tensor) -> torch.Tensor:
    values = torch.tensor([float(getattr(rows[i].params, name)) for i in idx], dtype=like.dtype)
    return to_device(values, like.device, "sampling params")[:, None]  # [M, 1]


def _index(idx: list[int], like: torch.Tensor) -> torch.Tensor:
    """Row (or token) indices as an int64 tensor on like's device."""
    return to_device(torch.tensor(idx, dtype=torch.long), like.device, "sampling rows")


def _sample_random(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """logits: [M, V] of non-greedy rows -> [M] token ids. Each row draws one uniform and takes its token by
    inverse CDF: in the compiled kernel where it can (_compiled_draws), else with torch's ops."""
    u = _uniforms(rows, logits.device)
    tokens = _compiled_draws(logits, rows, u)
    rest = [i for i, token in enumerate(tokens.tolist()) if token < 0]
    if rest:
        picked, rest_rows = _index(rest, logits), [rows[i] for i in rest]
        scaled = logits[picked] / _column(rest_rows, list(range(len(rest_rows))), "temperature", logits)
        tokens[picked] = _inverse_cdf(_truncated_probs(scaled, rest_rows), u[picked])
    return tokens


def _compiled_draws(logits: torch.Tensor, rows: list[SamplingRow], u: torch.Tensor) -> torch.Tensor:
    """[M] tokens drawn on the CPU by the compiled kernel, temperature, top-k, top-p and min-p included, in one call
    where torch's softmax, float64 cumsum and search took 4-10 ms for [32, 49152] and its sort for top-k or top-p
    75 ms (docs/engine.md); -1 for a row the kernel refuses (a NaN, no finite maximum), for a row whose temperature
    or top-p float32 cannot hold, and everywhere without the kernels. Which path a row takes depends on its own
    params and logits only, so a seeded row's tokens still do not depend on its neighbours."""
    tokens = torch.full((len(rows),), -1, dtype=torch.long, device=logits.device)
    kernels = load_cpu_kernels() if logits.device.type == "cpu" and logits.stride(1) == 1 else None
    if kernels is None:
        return tokens
    params = [r.params for r in rows]
    columns = (torch.tensor([p.temperature for p in params], dtype=torch.float32),
               torch.tensor([p.top_k for p in params], dtype=torch.long),
               torch.tensor([p.top_p for p in params], dtype=torch.float32),
               torch.tensor([p.min_p for p in params], dtype=torch.float32))  # fmt: skip
    # a top-p that float32 rounds to 0 (SamplingParams bounds only the temperature's range) is torch's to handle
    temperature, _, top_p, _ = columns
    fits = (temperature > 0) & temperature.isfinite() & (top_p > 0)
    if bool(fits.all()):
        return kernels.categorical_sample(logits, *columns, u)
    rows_in = fits.nonzero().squeeze(1)
    if rows_in.numel() > 0:
        tokens[rows_in] = kernels.categorical_sample(logits[rows_in], *(c[rows_in] for c in columns), u[rows_in])
    return tokens


def _truncated_probs(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """Softmax after min-p, top-k and top-p truncation.

    Rows without top-k/top-p skip the sort. The path depends only on the row's
    own params, so a seeded row computes the same probs whatever its neighbours.
    """
    sort = [r.params.top_k > 0 or r.params.top_p < 1.0 for r in rows]
    plain = [i for i, s in enumerate(sort) if not s]
    ranked = [i for i, s in enumerate(sort) if s]
    if not ranked:
        return _min_p(logits.softmax(dim=-1), rows)
    if not plain:
        return _sorted_truncation(logits, rows)
    probs = torch.empty_like(logits)
    plain_rows, ranked_rows = _index(plain, logits), _index(ranked, logits)
    probs[plain_rows] = _min_p(logits[plain_rows].softmax(dim=-1), [rows[i] for i in plain])
    probs[ranked_rows] = _sorted_truncation(logits[ranked_rows], [rows[i] for i in ranked])
    return probs


def _min_p(probs: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    if all(r.params.min_p == 0.0 for r in rows):
        return probs
    min_p = _column(rows, list(range(len(rows))), "min_p", probs)
    max_p = probs.max(dim=-1, keepdim=True).values
    return torch.where(probs >= min_p * max_p, probs, torch.zeros_like(probs))


def _sorted_truncation(logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
    """In vLLM's order: min-p on the whole distribution, top-k, then top-p over the probabilities renormalised
    among what those leave; in sorted order, then unsorted."""
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)  # [M, V]
    vocab = logits.shape[1]
    whole = sorted_logits.softmax(dim=-1)
    min_p = _column(rows, list(range(len(rows))), "min_p", whole)
    top_k = to_device(torch.tensor([r.params.top_k or vocab for r in rows]), logits.device, "sampling params")
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    keep = (whole >= min_p * whole[:, :1]) & (ranks < top_k[:, None])
    probs = sorted_logits.masked_fill(~keep, float("-inf")).softmax(dim=-1)
    top_p = _column(rows, list(range(len(rows))), "top_p", probs)
    # drop a token when the mass before it already reaches top_p; top_p=1 must not drop float32-rounding tails
    before = probs.cumsum(dim=-1) - probs
    keep &= (before < top_p) | (top_p >= 1.0)
    keep[:, 0] = True  # the first token always stays, even where top_p rounds to 0 in float32
    probs = torch.where(keep, probs, torch.zeros_like(probs))
    return torch.zeros_like(probs).scatter_(1, order, probs)


def _uniforms(rows: list[SamplingRow], device: torch.device) -> torch.Tensor:
    """[M] float64 draws from U[0, 1): seeded rows one each from their own generator, the rest from the
    default one. One draw per row per step, so a seeded row's stream never depends on its neighbours."""
    u = torch.empty(len(rows), dtype=torch.float64, device=device)
    unseeded = [i for i, r in enumerate(rows) if r.generator is None]
    if unseeded:
        u[_index(unseeded, u)] = torch.rand(len(unseeded), dtype=torch.float64, device=device)
    for i, row in enumerate(rows):
        if row.generator is not None:
            u[i : i + 1] = torch.rand(1, dtype=torch.float64, device=device, generator=row.generator)
    return u


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token whose slice of the cumulative distribution holds u: an exact categorical draw from one
    uniform (an exponential race costs V draws per row, measured at 0.9 ms per row of 49152)."""
    cdf = probs.double().cumsum(dim=-1)  # float64: the running sum stays exact enough over any vocabulary
    total = cdf[:, -1:]
    # strictly below the total, so a slot past it always exists; it has probability > 0 (cdf rises there)
    target = torch.minimum(u[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    # a row holding a NaN has no such slot (every comparison fails): its last token rather than one past the end
    return torch.searchsorted(cdf, target, right=True).squeeze(1).clamp_(max=probs.shape[1] - 1)


def _results(raw: torch.Tensor, log_z: torch.Tensor, tokens: torch.Tensor, rows: list[SamplingRow]) -> list[SampleResult]:
    chosen = (raw.gather(1, tokens[:, None]) - log_z).squeeze(1)
    # one copy back: float64 holds the ids exactly and the float32 logprobs unchanged
    host = to_host(torch.stack([tokens.double(), chosen.double()]), "sampled tokens")
    ids, chosen = host[0].long().tolist(), host[1].tolist()
    top, ranks = _top_logprobs(raw, log_z, tokens, rows)
    return [SampleResult(ids[i], chosen[i], top[i], ranks[i]) for i in range(len(rows))]


def vocabulary_ranks(scores: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """[rows, 1]: how many of each row's scores are at least its chosen token's (ids [rows, 1]), itself included:
    the token's rank as vLLM counts it (1 = the likeliest)."""
    return (scores >= scores.gather(1, chosen)).sum(dim=1, keepdim=True)


def _top_logprobs(
    raw: torch.Tensor, log_z: torch.Tensor, tokens: torch.Tensor, rows: list[SamplingRow]
) -> tuple[list[dict[int, float] | None], list[int | None]]:
    """Per row that asks for logprobs: its top-k (or its logprob_token_ids' logprobs, in their order) and its token's
    rank (vLLM's count: the tokens at least as likely, itself included), in one more copy back; None for the other
    rows."""
    if all(r.params.num_logprobs is None for r in rows):
        return [None] * len(rows), [None] * len(rows)
    wanted = [r.params.logprobs if r.params.logprob_token_ids is None else None for r in rows]
    named = [r.params.logprob_token_ids or [] for r in rows]
    k_max = max((k for k in wanted if k is not None), default=0)
    width = max(map(len, named))
    columns = [vocabulary_ranks(raw, tokens[:, None]).double()]  # every row: no row index to send
    if k_max:
        values, indices = raw.topk(k_max, dim=-1)
        columns += [(values - log_z).double(), indices.double()]
    if width:  # each row's named tokens, padded with token 0 (never read back)
        ids = to_device(torch.tensor([t + [0] * (width - len(t)) for t in named]), raw.device, "logprob token ids")
        columns.append((raw.gather(1, ids) - log_z).double())
    host = to_host(torch.cat(columns, dim=1), "top logprobs")
    top: list[dict[int, float] | None] = []
    ranks: list[int | None] = []
    for row, k, ids, r in zip(host.tolist(), wanted, named, rows):
        if r.params.num_logprobs is None:
            top.append(None)
            ranks.append(None)
            continue
        if ids:
            top.append(dict(zip(ids, row[1 + 2 * k_max : 1 + 2 * k_max + len(ids)])))
        else:
            top.append({int(t): lp for t, lp in zip(row[1 + k_max : 1 + k_max + k], row[1 : 1 + k])})
        ranks.append(int(row[0]))
    return top, ranks
