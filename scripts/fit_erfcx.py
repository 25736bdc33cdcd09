"""Fit the rational approximation of erfcx(z) = e^(z²) erfc(z) on [0, 10] that seqlab's float32 GELU kernel
uses (``src/seqlab/kernels/activations.cpp``, struct Erf16): erfcx(z) ≈ P(z) / Q(z), P of degree 4, Q of
degree 5 with Q(0) = 1 (erfcx falls like 1 / (z √π), so Q is one degree above P).

Method: linearized least squares, P(z) − f(z) Q(z) = 0 weighted by 1 / (f |Q|) from the previous iterate
(Loeb's iteration, which converges to the rational fit of least relative error), then reweighted toward the
points of largest error to approach the minimax fit; the iterate with the smallest maximum relative error is
kept. erfcx comes from mpmath at 30 digits. Prints the coefficients (highest degree first, as the kernel's
Horner loops take them) and the maximum relative error on a fine grid.

    python scripts/fit_erfcx.py
"""

from __future__ import annotations

import mpmath
import numpy as np

DEG_P, Z_MAX = 4, 10.0


def erfcx(z: np.ndarray) -> np.ndarray:
    mpmath.mp.dps = 30
    return np.array(
        [float(mpmath.erfc(mpmath.mpf(float(v))) * mpmath.exp(mpmath.mpf(float(v)) ** 2)) for v in z]
    )


def fit(deg_p: int = DEG_P, z_max: float = Z_MAX, rounds: int = 60) -> tuple[np.ndarray, np.ndarray, float]:
    """(p, q, max relative error): coefficients lowest degree first, q[0] = 1."""
    z = np.concatenate([np.linspace(0.0, 2.0, 4000), np.linspace(2.0, z_max, 4000)])
    f = erfcx(z)
    powers_p = np.vstack([z**k for k in range(deg_p + 1)]).T
    powers_q = np.vstack([z**k for k in range(1, deg_p + 2)]).T
    weights, best = np.ones_like(z), None
    for i in range(rounds):
        a = np.hstack([powers_p, -f[:, None] * powers_q])
        w = weights / f
        sol, *_ = np.linalg.lstsq(a * w[:, None], f * w, rcond=None)
        p, q = sol[: deg_p + 1], np.concatenate([[1.0], sol[deg_p + 1 :]])
        q_z = np.polyval(q[::-1], z)
        err = np.abs(np.polyval(p[::-1], z) / q_z - f) / f
        if best is None or err.max() < best[2]:
            best = (p, q, err.max())
        weights = 1.0 / np.abs(q_z)
        if i > 3:
            weights = weights * (1.0 + 20.0 * err / err.max())
    return best


def main() -> None:
    p, q, err = fit()
    z = np.linspace(0.0, Z_MAX, 20001)
    fine = np.abs(np.polyval(p[::-1], z) / np.polyval(q[::-1], z) / erfcx(z) - 1).max()
    print(
        f"erfcx on [0, {Z_MAX:g}]: P degree {DEG_P}, Q degree {DEG_P + 1}; max relative error {err:.2e} "
        f"(fit grid), {fine:.2e} (a finer grid)"
    )
    print("P, highest degree first:", ", ".join(f"{c:.17g}" for c in p[::-1]))
    print("Q, highest degree first:", ", ".join(f"{c:.17g}" for c in q[::-1]))


if __name__ == "__main__":
    main()
