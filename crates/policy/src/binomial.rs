//! Exact binomial tails, and the one test of "is this rate higher than that one" built on them,
//! shared by the staged rollout and the 4xx anomaly detector.
//!
//! Why exact and not a normal approximation: the decisions that read these tails are made at the
//! far end of the distribution (p below 0.001) and often on a handful of events (five 400s among
//! a few hundred requests), exactly where the normal approximation is worst. The exact tail costs
//! a sum of terms walked away from the mode, each from the previous one by a ratio, so it stays
//! cheap (a few thousand terms at most for a million trials) and never under- or overflows: the
//! terms are summed relative to the first and only the total is exponentiated.
//!
//! Precision: `ln_choose` sums logarithms directly when one side of the coefficient is small and
//! goes through `ln_gamma` (Lanczos, g = 7) otherwise, so tails are accurate to about 1e-12
//! relative for small counts and to about 1e-9 relative at a million trials, where the
//! subtraction of three log-gammas near 1e7 loses digits (the tests hold them to 1e-8 against
//! values computed in rational arithmetic). Both are far below what a threshold of 0.001 can tell
//! apart.

/// `ln Γ(x)` for `x > 0`: the Lanczos approximation (g = 7, nine coefficients), accurate to about
/// 1e-15 relative.
pub(crate) fn ln_gamma(x: f64) -> f64 {
    const G: f64 = 7.0;
    const COEFFICIENTS: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // The series is written for x >= 0.5; Γ(x) = Γ(x + 1) / x below it.
        return ln_gamma(x + 1.0) - x.ln();
    }
    let x = x - 1.0;
    let sum = COEFFICIENTS[1..]
        .iter()
        .enumerate()
        .fold(COEFFICIENTS[0], |sum, (i, c)| {
            sum + c / (x + i as f64 + 1.0)
        });
    let t = x + G + 0.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

/// `ln C(n, k)`, for `k <= n`.
pub(crate) fn ln_choose(n: u64, k: u64) -> f64 {
    debug_assert!(k <= n);
    let small = k.min(n - k);
    if small < 64 {
        // A direct sum is exact to rounding, where three log-gammas near ln(n!) would cancel.
        return (0..small)
            .map(|i| ((n - i) as f64).ln() - ((i + 1) as f64).ln())
            .sum();
    }
    ln_gamma(n as f64 + 1.0) - ln_gamma(k as f64 + 1.0) - ln_gamma((n - k) as f64 + 1.0)
}

/// `ln P(X = k)` for `X ~ Binomial(n, p)`, `0 < p < 1`.
fn ln_pmf(n: u64, k: u64, p: f64) -> f64 {
    ln_choose(n, k) + k as f64 * p.ln() + (n - k) as f64 * (-p).ln_1p()
}

/// Terms below this share of the running sum no longer change it.
const NEGLIGIBLE: f64 = 1e-17;

/// `P(X >= x)` for `X ~ Binomial(n, p)`.
///
/// Above the mode the tail is summed upward from `x`; at or below it, the lower tail
/// `P(X <= x - 1)` is summed downward and subtracted from 1 (the upper tail then holds at least the
/// mode and the terms above it, so it is not small and the subtraction loses nothing that
/// matters). Either way each term is the previous
/// one times a ratio, and the walk stops once the terms are negligible.
pub(crate) fn upper_tail(n: u64, x: u64, p: f64) -> f64 {
    if x == 0 {
        return 1.0;
    }
    if x > n || p.is_nan() || p <= 0.0 {
        return 0.0;
    }
    if p >= 1.0 {
        return 1.0;
    }
    let odds = p / (1.0 - p);
    let mode = ((n as f64 + 1.0) * p).floor() as u64;
    if x > mode {
        let (mut term, mut sum) = (1.0_f64, 1.0_f64);
        for i in x..n {
            term *= (n - i) as f64 / (i + 1) as f64 * odds;
            sum += term;
            if term < sum * NEGLIGIBLE {
                break;
            }
        }
        (ln_pmf(n, x, p) + sum.ln()).exp().min(1.0)
    } else {
        let top = x - 1;
        let (mut term, mut sum) = (1.0_f64, 1.0_f64);
        for i in (1..=top).rev() {
            term *= i as f64 / (n - i + 1) as f64 / odds;
            sum += term;
            if term < sum * NEGLIGIBLE {
                break;
            }
        }
        (1.0 - (ln_pmf(n, top, p) + sum.ln()).exp()).clamp(0.0, 1.0)
    }
}

/// One-sided p-value that the rate behind `x_a` events in `n_a` trials exceeds the rate behind
/// `x_b` in `n_b`: the exact conditional test for two Poisson rates with exposures. Under equal
/// rates, `x_a` given `k = x_a + x_b` is `Binomial(k, n_a / (n_a + n_b))`, and the p-value is
/// `P(X >= x_a)`.
///
/// For per-request events (each request fails or not), the exact law of `x_a` given `k` is
/// hypergeometric (Fisher's exact test), which is narrower than this binomial: the p-value is
/// then conservative, never smaller than the exact one. With `n_b = 0` there is nothing to
/// compare with, and the p-value is 1; with `n_a = 0`, too.
pub(crate) fn rate_excess_p(x_a: u64, n_a: u64, x_b: u64, n_b: u64) -> f64 {
    if n_a == 0 || n_b == 0 {
        return 1.0;
    }
    let share = n_a as f64 / (n_a as f64 + n_b as f64);
    upper_tail(x_a.saturating_add(x_b), x_a, share)
}

#[cfg(test)]
mod tests;
