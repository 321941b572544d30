"""Pearson chi-square goodness of fit, for the losslessness tests (no scipy needed)."""

from __future__ import annotations

import torch

MIN_EXPECTED = 5.0


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int, float]:
    """counts [V] observed draws, probs [V] the distribution they should follow.

    Tokens with probability 0 must never be drawn (asserted). Bins with expected count < 5 are
    pooled. Returns (statistic, degrees of freedom, p-value).
    """
    counts = counts.double()
    probs = probs.double() / probs.sum()
    impossible = probs == 0
    assert counts[impossible].sum() == 0, (
        f"drew tokens of probability 0: {impossible.nonzero().flatten().tolist()}"
    )
    n = counts.sum()
    expected = probs * n
    big = expected >= MIN_EXPECTED
    obs_bins = counts[big].tolist()
    exp_bins = expected[big].tolist()
    rest_exp = float(expected[~big & ~impossible].sum())
    rest_obs = float(counts[~big & ~impossible].sum())
    if rest_exp >= MIN_EXPECTED:
        obs_bins.append(rest_obs)
        exp_bins.append(rest_exp)
    elif rest_exp > 0:  # too small for its own bin: fold into the smallest one
        i = min(range(len(exp_bins)), key=lambda j: exp_bins[j])
        obs_bins[i] += rest_obs
        exp_bins[i] += rest_exp
    obs, exp = torch.tensor(obs_bins), torch.tensor(exp_bins)
    stat = float(((obs - exp) ** 2 / exp).sum())
    df = len(obs_bins) - 1
    p_value = float(torch.special.gammaincc(torch.tensor(df / 2.0), torch.tensor(stat / 2.0)))
    return stat, df, p_value


def critical_value(df: int, alpha: float) -> float:
    """Smallest statistic whose p-value is below alpha (bisection on the chi-square tail)."""
    lo, hi = 0.0, 10.0 * (df + 10)
    for _ in range(100):
        mid = (lo + hi) / 2
        tail = float(torch.special.gammaincc(torch.tensor(df / 2.0), torch.tensor(mid / 2.0)))
        lo, hi = (mid, hi) if tail > alpha else (lo, mid)
    return hi


def detectable(probs: torch.Tensor, wrong: torch.Tensor, n: int, alpha: float) -> bool:
    """Would n draws from `wrong` fail a chi-square test against `probs` (expected statistic,
    i.e. n * sum((wrong - probs)^2 / probs) + df, well above the critical value)?"""
    probs = probs.double() / probs.sum()
    wrong = wrong.double() / wrong.sum()
    if (wrong[probs == 0] > 0).any():
        return True  # would draw impossible tokens
    support = probs > 0
    df = int(support.sum()) - 1
    noncentrality = n * float(((wrong[support] - probs[support]) ** 2 / probs[support]).sum())
    return noncentrality + df > 2.0 * critical_value(df, alpha)
