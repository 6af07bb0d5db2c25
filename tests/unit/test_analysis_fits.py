"""Fits on synthetic data with a known answer."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.method.fits import fit_recompute, fit_transfer, nnls, quality

pytestmark = pytest.mark.unit


def test_nnls_matches_least_squares_when_positive_and_clamps_otherwise():
    a = np.column_stack([np.ones(4), np.arange(4.0)])
    assert nnls(a, 2.0 + 3.0 * np.arange(4.0)) == pytest.approx([2.0, 3.0])
    # y = -1 + 2x: the unconstrained intercept is negative -> 0, slope refitted alone
    x = np.array([1.0, 2.0, 3.0])
    coef = nnls(np.column_stack([np.ones(3), x]), -1.0 + 2.0 * x)
    assert coef[0] == 0.0 and coef[1] > 0
    assert coef[1] == pytest.approx(np.dot(x, -1.0 + 2.0 * x) / np.dot(x, x))


def test_recompute_fit_recovers_known_coefficients():
    n = np.array([64, 256, 1024, 4096, 16384, 32768], dtype=float)
    c0, c1, c2 = 0.030, 5e-5, 2e-10
    fit = fit_recompute(n, c0 + c1 * n + c2 * n**2)
    assert fit is not None and fit.quadratic
    assert fit.c0_s == pytest.approx(c0, rel=1e-6)
    assert fit.c1_s_per_token == pytest.approx(c1, rel=1e-6)
    assert fit.c2_s_per_token2 == pytest.approx(c2, rel=1e-6)
    assert fit.quality.r2 == pytest.approx(1.0)
    assert max(abs(r) for r in fit.quality.residuals) < 1e-9
    assert fit.tokens_per_s == pytest.approx(1 / c1)
    assert fit.seconds(1000.0) == pytest.approx(c0 + c1 * 1000 + c2 * 1e6)


def test_recompute_fit_is_non_negative_and_linear_with_two_lengths():
    # TTFT falling with length: no negative cost per token is reported
    fit = fit_recompute([100, 200, 300], [0.05, 0.04, 0.03])
    assert fit.c1_s_per_token >= 0 and fit.c2_s_per_token2 >= 0 and fit.c0_s >= 0
    two = fit_recompute([100, 200, 100, 200], [0.02, 0.03, 0.02, 0.03])
    assert not two.quadratic and two.c2_s_per_token2 == 0.0
    assert two.c1_s_per_token == pytest.approx(1e-4)
    assert fit_recompute([100, 100], [0.1, 0.2]) is None  # one length: nothing to fit
    assert fit_recompute([], []) is None


def test_transfer_fit_recovers_alpha_and_beta():
    nbytes = np.array([2**k for k in range(12, 28, 2)], dtype=float)
    alpha, beta = 20e-6, 12.5e9
    fit = fit_transfer(nbytes, alpha + nbytes / beta, source="bench")
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert fit.beta_bytes_per_s == pytest.approx(beta, rel=1e-6)
    assert fit.gb_s == pytest.approx(12.5)
    assert fit.quality.r2 == pytest.approx(1.0) and fit.source == "bench"


def test_transfer_fit_with_noise_keeps_alpha_from_small_transfers():
    rng = np.random.default_rng(0)
    nbytes = np.repeat(np.geomspace(4e3, 4e8, 9), 5)
    seconds = (1e-3 + nbytes / 1e9) * (1 + rng.uniform(-0.05, 0.05, len(nbytes)))
    fit = fit_transfer(nbytes, seconds)
    assert fit.alpha_s == pytest.approx(1e-3, rel=0.05)
    assert fit.gb_s == pytest.approx(1.0, rel=0.05)
    assert 0.95 < fit.quality.r2 <= 1.0


def test_transfer_fit_without_size_dependence_has_infinite_bandwidth():
    fit = fit_transfer([1e3, 1e4, 1e5], [0.01, 0.01, 0.01])
    assert math.isinf(fit.beta_bytes_per_s) and fit.alpha_s == pytest.approx(0.01)
    assert fit_transfer([1e3, 1e3], [0.1, 0.2]) is None


def test_quality_numbers():
    q = quality(np.array([1.0, 2.0, 3.0]), np.array([1.0, 2.0, 4.0]))
    assert q.n == 3 and q.residuals == [0.0, 0.0, -1.0]
    assert q.r2 == pytest.approx(1 - 1 / 2)
    assert q.rmse == pytest.approx(math.sqrt(1 / 3)) and q.max_abs_residual == 1.0


def test_a_transfer_fit_without_a_time_per_byte_says_the_bandwidth_is_not_resolved():
    """Pulls of a few MB that all take the fixed cost: no 'inf GB/s', but what is known
    (alpha, and the bandwidth's lower bound at 95%)."""
    from types import SimpleNamespace

    from analysis.method.fits import FitQuality, TransferFit
    from analysis.questions.transfer import TransferAnswer

    quality = FitQuality(n=279, r2=0.0, rmse=1e-4, max_abs_residual=3e-4)

    def text_of(beta_bytes_per_s: float, gb_s_ci: tuple[float, float]) -> str:
        fit = TransferFit(
            alpha_s=0.0039,
            beta_bytes_per_s=beta_bytes_per_s,
            quality=quality,
            bytes_min=6.5e4,
            bytes_max=8.5e6,
            sizes=9,
            df=277,
            alpha_ci_s=(0.003, 0.0048),
            gb_s_ci=gb_s_ci,
        )
        answer = TransferAnswer(SimpleNamespace(transfer_fit=fit, transfer_source="P<-D"))
        return answer.transfer_text()

    flat = text_of(math.inf, (6.79, math.inf))
    assert "inf GB/s" not in flat and "alpha 3.900 ms [3.000, 4.800]" in flat
    assert "bandwidth not resolved" in flat and "at least 6.790 GB/s at 95%" in flat
    assert "5.670 GB/s [1.790, ∞]" in text_of(5.67e9, (1.79, math.inf))
