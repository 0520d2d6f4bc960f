"""Loss-landscape geometry for the IMA analysis tool (spec ``fedima.md`` §3).

* :func:`plane_basis` and :func:`plane_point`: the 2-D plane through three models
  (Gram–Schmidt, §3.2, as in Garipov et al. 2018 / Izmailov et al. 2018);
* :func:`plane_grid`: the bounding box of the three projected models plus margins;
* :func:`interpolate`: the 1-D line between two models (§3.1);
* :func:`contour_levels`: the log-spaced contour levels of §3.2;
* :func:`distances` and :func:`heldout_loss`: per-round estimators of §3.4.

Models are handled as flat float64 vectors of their floating-point entries
(:func:`fedsys.params.flatten`); integer entries are taken from the first model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fedsys.params import Params, distance

F64 = NDArray[np.float64]


@dataclass(frozen=True)
class Plane:
    """Orthonormal basis of the plane through three models and their coordinates."""

    origin: F64  # theta_1
    u: F64  # unit vector along theta_2 - theta_1
    v: F64  # unit vector, theta_3 - theta_1 with the u part removed
    coords: tuple[tuple[float, float], tuple[float, float], tuple[float, float]]

    @property
    def centroid(self) -> tuple[float, float]:
        """Coordinates of the plain average of the three models (Fig. 1's cross)."""
        xs, ys = zip(*self.coords, strict=True)
        return float(np.mean(xs)), float(np.mean(ys))


def plane_basis(t1: F64, t2: F64, t3: F64) -> Plane:
    """Gram–Schmidt basis of the plane through ``t1, t2, t3`` (§3.2 steps 2-4).

    ``u = t2 - t1``; ``v = (t3 - t1) - <t3 - t1, u>/||u||^2 u``; the models sit at
    ``(0, 0)``, ``(||u||, 0)`` and ``(<t3 - t1, u_hat>, ||v||)``.
    """
    u = t2 - t1
    nu = float(np.linalg.norm(u))
    if nu == 0.0:
        raise ValueError("the first two models are identical: no plane")
    uh = u / nu
    d3 = t3 - t1
    x3 = float(d3 @ uh)
    v = d3 - x3 * uh
    nv = float(np.linalg.norm(v))
    if nv <= 1e-12 * max(nu, 1.0):
        raise ValueError("the three models are collinear: no plane")
    return Plane(t1, uh, v / nv, ((0.0, 0.0), (nu, 0.0), (x3, nv)))


def plane_point(plane: Plane, x: float, y: float) -> F64:
    """The model at plane coordinates ``(x, y)``: ``t1 + x u_hat + y v_hat``."""
    return plane.origin + x * plane.u + y * plane.v


def plane_grid(plane: Plane, size: int = 21, margin: float = 0.25) -> tuple[F64, F64]:
    """Grid axes over the bounding box of the three models plus ``margin`` per side."""
    xs, ys = zip(*plane.coords, strict=True)
    lo_x, hi_x, lo_y, hi_y = min(xs), max(xs), min(ys), max(ys)
    wx, wy = hi_x - lo_x, hi_y - lo_y
    return (np.linspace(lo_x - margin * wx, hi_x + margin * wx, size),
            np.linspace(lo_y - margin * wy, hi_y + margin * wy, size))


def interpolate(a: F64, b: F64, lambdas: Sequence[float]) -> list[F64]:
    """Models ``(1 - l) a + l b`` for each ``l`` (§3.1)."""
    return [(1.0 - lam) * a + lam * b for lam in lambdas]


def contour_levels(values: F64, vmax: float, log_alpha: float, n: int = 7) -> F64:
    """Log-spaced contour levels of §3.2 (values clipped at ``vmax``)."""
    c = np.minimum(np.asarray(values, np.float64), vmax)
    lo, hi = float(c.min()), float(c.max())
    if hi <= lo:
        return np.array([lo, lo + 1e-9, 1e10])
    log_gamma = (np.log(hi - lo) - log_alpha) / n
    levels = lo + np.exp(log_alpha + log_gamma * np.arange(n + 1))
    levels[0], levels[-1] = lo, hi
    return np.append(levels, 1e10)


def distances(clients: Sequence[Params], glob: Params) -> tuple[float, float]:
    """Largest and mean L2 distance of client models to the global model (§3.4)."""
    d = [distance(c, glob) for c in clients]
    return max(d), float(np.mean(d))
