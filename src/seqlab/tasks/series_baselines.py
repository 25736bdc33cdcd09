r"""The baselines every forecasting model is measured against (``seqlab.tasks.series_data`` re-exports them):
the naive and seasonal-naive forecasts and a least-squares linear autoregression.

Notation: ``p`` lags, ``H`` horizon, ``m`` the seasonal period, ``n`` forecast origins.
"""

from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger("seqlab.tasks")

__all__ = ["LinearAR", "naive_forecast", "seasonal_naive_forecast"]


def naive_forecast(target: np.ndarray, origins: np.ndarray, horizon: int) -> np.ndarray:
    """(n, H): ŷ_{o+h} = y_{o-1}, the last observed value, for forecast origins o (the first forecast index)."""
    return np.repeat(target[origins - 1][:, None], horizon, axis=1)


def seasonal_naive_forecast(target: np.ndarray, origins: np.ndarray, horizon: int, m: int) -> np.ndarray:
    """(n, H): ŷ_{o+h} = y_{o+h-m(⌊h/m⌋+1)}, the value one season before (h = 0 ... H-1); m = 1 is naive."""
    h = np.arange(horizon)
    lag = m * (h // m + 1)  # (H,)
    return target[origins[:, None] + h[None, :] - lag[None, :]]


class LinearAR:
    r"""Direct linear autoregression fitted by least squares: one linear map from the last p values to all H.

        [ŷ_o, ..., ŷ_{o+H-1}] = [y_{o-p}, ..., y_{o-1}, 1] W,    W (p + 1, H) = argmin Σ_o ‖Y_o - X_o W‖²

    over the training windows' origins. For H = 1 this is an AR(p) with intercept fitted by ordinary least
    squares, which recovers the coefficients of an AR(p) process; ``lag_coefficients[h, k - 1]`` is the
    weight of y_{o-k} in the forecast of step h.
    """

    def __init__(self, order: int, horizon: int):
        self.order, self.horizon = order, horizon
        self.coef: np.ndarray | None = None  # (p + 1, H)

    def _lags(self, target: np.ndarray, origins: np.ndarray) -> np.ndarray:
        idx = origins[:, None] + np.arange(-self.order, 0)[None, :]  # (n, p), oldest first
        return np.concatenate([target[idx], np.ones((len(origins), 1))], axis=1)  # (n, p + 1)

    def fit(self, target: np.ndarray, origins: np.ndarray) -> LinearAR:
        """Least squares on the z-scores of the training outputs (a level of 1e6 or a scale of 1e10 beside the
        intercept's column of ones made lstsq truncate), mapped back to the series' units."""
        if len(origins) <= self.order:
            log.warning("linear baseline: %d training windows for %d lags", len(origins), self.order)
        y = target[origins[:, None] + np.arange(self.horizon)[None, :]]  # (n, H)
        loc, scale = y.mean(), (y.std() or 1.0)
        x = self._lags((target - loc) / scale, origins)  # (n, p + 1), the last column ones
        w = np.linalg.lstsq(x, (y - loc) / scale, rcond=None)[0]  # (p + 1, H) in the z frame
        # y = loc + scale (Σ_k w_k (x_k - loc) / scale + c) = Σ_k w_k x_k + loc (1 - Σ_k w_k) + scale c
        w[-1] = loc * (1.0 - w[:-1].sum(axis=0)) + scale * w[-1]
        self.coef = w
        return self

    def predict(self, target: np.ndarray, origins: np.ndarray) -> np.ndarray:
        return self._lags(target, origins) @ self.coef  # (n, p + 1) x (p + 1, H) -> (n, H)

    @property
    def lag_coefficients(self) -> np.ndarray:
        """(H, p): the weight of y_{o-1}, y_{o-2}, ... (most recent first) in each step's forecast."""
        return self.coef[:-1][::-1].T
