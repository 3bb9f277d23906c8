"""Inverse-CDF next-token sampling: the distribution, the nucleus and the returned log-probs."""

from __future__ import annotations

import torch

from replayrl.rollout.generation.sampling import sample_next, top_p_keep

N = 40_000


def _freqs(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.bincount(tokens, minlength=vocab).float() / tokens.numel()


def test_samples_follow_the_tempered_softmax():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, -30.0])
    g = torch.Generator().manual_seed(0)
    for temperature in (1.0, 0.5, 2.0):
        tokens, logps = sample_next(logits.expand(N, -1), temperature, generator=g)
        expected = torch.softmax(logits / temperature, -1)
        # binomial std <= 0.0025 at N = 40,000: 0.01 is four of them
        assert torch.allclose(_freqs(tokens, 5), expected, atol=0.01)
        assert torch.allclose(logps, torch.log(expected)[tokens], atol=1e-6)
    # a token with (numerically) zero probability is never drawn
    tokens, _ = sample_next(torch.tensor([[0.0, -200.0, 0.0]]).expand(N, -1), generator=g)
    assert int((tokens == 1).sum()) == 0


def test_top_p_samples_the_renormalised_nucleus_and_stores_untruncated_logprobs():
    probs = torch.tensor([0.1, 0.4, 0.2, 0.3])  # sorted: 0.4 (tok 1), 0.3 (tok 3), 0.2, 0.1
    logits = probs.log()
    g = torch.Generator().manual_seed(1)
    tokens, logps = sample_next(logits.expand(N, -1), 1.0, top_p=0.5, generator=g)
    # mass before tok 3 is 0.4 < 0.5: kept; before tok 2 it is 0.7: dropped
    freqs = _freqs(tokens, 4)
    assert freqs[0] == 0 and freqs[2] == 0
    assert abs(float(freqs[1]) - 0.4 / 0.7) < 0.01
    assert torch.allclose(logps, probs.log()[tokens], atol=1e-6)  # not renormalised
    # top_p below the first token's mass keeps only it
    tokens, _ = sample_next(logits.expand(1000, -1), 1.0, top_p=0.35, generator=g)
    assert set(tokens.tolist()) == {1}


def test_top_p_keep_mask():
    sorted_probs = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.97, 0.01, 0.01, 0.01]])
    assert top_p_keep(sorted_probs, 0.8).tolist() == [
        [True, True, False, False],
        [True, False, False, False],
    ]
    assert top_p_keep(sorted_probs, 1e-9)[:, 0].all()  # the top token always stays


def test_greedy_takes_the_argmax_with_its_untempered_logprob():
    logits = torch.tensor([[0.0, 3.0, 1.0], [5.0, 4.0, 0.0]])
    tokens, logps = sample_next(logits, temperature=0.3, greedy=True)
    assert tokens.tolist() == [1, 0]
    assert torch.allclose(logps, torch.log_softmax(logits, -1)[[0, 1], [1, 0]])


def test_bf16_logits_are_sampled_in_fp32():
    logits = torch.randn(8, 1000).bfloat16()
    tokens, logps = sample_next(logits, 1.0)
    assert logps.dtype == torch.float32
    want = torch.log_softmax(logits.float(), -1).gather(-1, tokens[:, None]).squeeze(-1)
    assert torch.allclose(logps, want)


def test_a_seeded_generator_makes_sampling_reproducible_whatever_the_global_rng():
    logits = torch.randn(64, 7)
    for top_p in (1.0, 0.8):
        torch.manual_seed(1)
        a, _ = sample_next(logits, 1.0, top_p, generator=torch.Generator().manual_seed(5))
        torch.manual_seed(2)  # the global stream must not matter
        b, _ = sample_next(logits, 1.0, top_p, generator=torch.Generator().manual_seed(5))
        assert torch.equal(a, b)


def test_top_p_one_draws_by_inverse_cdf_over_the_unsorted_vocabulary():
    # the token for uniform u is the first index whose cumulative probability exceeds u
    # (vocabulary order, no sort): computed here by hand from the same uniforms
    logits = torch.tensor([[0.0, 2.0, -1.0, 1.0]]).expand(500, -1)
    tokens, _ = sample_next(logits, 1.0, 1.0, generator=torch.Generator().manual_seed(3))
    probs = torch.softmax(logits[0], -1)
    u = torch.rand((500, 1), generator=torch.Generator().manual_seed(3)) * probs.cumsum(-1)[-1]
    expected = (u >= probs.cumsum(-1)).sum(-1)
    assert torch.equal(tokens, expected)


def test_defaults_are_temperature_one_and_no_nucleus():
    logits = torch.tensor([[1.0, 0.0, -1.0]])
    tokens, logp = sample_next(logits, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(logp, torch.log_softmax(logits, -1)[0, tokens], atol=1e-6)


def test_top_p_keep_stops_at_exactly_top_p():
    # sorted [0.5, 0.25, 0.25]: the mass before each token is [0, 0.5, 0.75]; a token stays
    # when that mass is strictly below top_p (0.5 keeps one, 0.75 two, 0.76 all three)
    p = torch.tensor([[0.5, 0.25, 0.25]])
    assert top_p_keep(p, 0.5).tolist() == [[True, False, False]]
    assert top_p_keep(p, 0.75).tolist() == [[True, True, False]]
    assert top_p_keep(p, 0.76).tolist() == [[True, True, True]]


def test_a_draw_on_a_cdf_boundary_never_picks_a_zero_probability_token(monkeypatch):
    # index i is chosen when cdf[i-1] <= u < cdf[i]: u = 0 (torch.rand can return exactly 0)
    # must skip a leading zero-probability token, u = cdf[1] must skip the zero one after it,
    # and a rounding u == cdf[-1] stays in range
    from replayrl.rollout.generation import sampling

    probs = torch.tensor([[0.0, 1.0, 0.0, 2.0], [1.0, 0.0, 0.0, 0.0]])
    for draw, want in ((0.0, [1, 0]), (1 / 3, [3, 0]), (1.0, [3, 0])):

        def fixed(size, *args, draw=draw, **kwargs):
            return torch.full(size, draw, dtype=kwargs.get("dtype") or torch.float32)

        monkeypatch.setattr(torch, "rand", fixed)
        assert sampling._inverse_cdf(probs, None).tolist() == want, draw


def test_a_nan_row_still_yields_a_valid_token_and_top_p_stays_in_its_nucleus(monkeypatch):
    # damaged weights give NaN logits: sampling must return an index inside the vocabulary
    # (the learner's non-finite check then ends the run with its own message), never one
    # that crashes a gather; and a top-p draw is bounded by its nucleus whatever the cdf's
    # rounding (a draw forced to the very end of the cdf lands on the nucleus's last token)
    from replayrl.rollout.generation import sampling

    nan = torch.full((2, 5), float("nan"))
    tokens, _ = sample_next(nan)
    assert tokens.shape == (2,) and bool(((tokens >= 0) & (tokens < 5)).all())
    tokens, _ = sample_next(nan, top_p=0.5)
    assert bool(((tokens >= 0) & (tokens < 5)).all())

    def at_the_end(size, *args, **kwargs):
        return torch.full(size, 1.0, dtype=kwargs.get("dtype") or torch.float32)

    monkeypatch.setattr(torch, "rand", at_the_end)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.1, 0.1]]))
    assert sampling.sample_next(logits, top_p=0.7)[0].tolist() == [1]  # nucleus {0, 1}
