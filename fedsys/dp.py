"""Differential privacy at the client level (issue 42 item 3): updates clipped to an L2 norm
C, Gaussian noise of standard deviation z * C * s on each released model (s: the largest
weight one clipped update has in it, 1/m for the mean of m), and the privacy spent,
(epsilon, delta), from Google's ``dp_accounting`` (its RDP accountant; not hand-written).

McMahan et al., "Learning Differentially Private Recurrent Language Models", ICLR 2018
(DP-FedAvg, Alg. 1 with fixed clipping), the mechanism of Flower's
``DifferentialPrivacyServerSideFixedClipping`` / ``...ClientSideFixedClipping``.
"""

from __future__ import annotations

import numpy as np

from fedsys.params import Params, flatten, is_float, unflatten


def clip_update(model: Params, reference: Params, clipping_norm: float) -> tuple[Params, float]:
    r"""``reference + Δ min(1, C / ||Δ||)`` with :math:`\Delta` = ``model - reference`` over
    the floating-point entries (integer buffers as ``model``'s), and :math:`\lVert\Delta\rVert`."""
    ref = flatten(reference)
    delta = flatten(model) - ref
    norm = float(np.linalg.norm(delta))
    if norm <= clipping_norm:
        return model, norm
    out = unflatten(ref + delta * (clipping_norm / norm), model)
    return out, norm


def add_noise(model: Params, std: float, rng: np.random.Generator) -> Params:
    """``model`` with N(0, std^2) added to every floating-point entry (in key order)."""
    if std <= 0:
        return model
    return {k: (np.asarray(v, np.float64) + rng.normal(0.0, std, np.shape(v))).astype(v.dtype)
            if is_float(v) else v for k, v in model.items()}


def epsilon(noise_multiplier: float, releases: int, delta: float, population: int = 0,
            sample: int = 0) -> float:
    """The epsilon at ``delta`` after ``releases`` Gaussian releases of noise multiplier
    ``noise_multiplier`` (std / sensitivity), each on ``sample`` clients drawn without
    replacement from ``population`` (amplification by sampling; ``sample`` 0: every
    release sees the client, no amplification), composed with the RDP accountant of
    ``dp_accounting`` (replace-one neighbouring, the relation sampling without replacement
    is analysed under)."""
    if releases <= 0:
        return 0.0
    if noise_multiplier <= 0:
        return float("inf")
    from dp_accounting import dp_event, rdp

    gauss = dp_event.GaussianDpEvent(noise_multiplier)
    if 0 < sample < population:
        one: dp_event.DpEvent = dp_event.SampledWithoutReplacementDpEvent(population, sample, gauss)
        relation = rdp.rdp_privacy_accountant.NeighborRel.REPLACE_ONE
    else:
        one = gauss
        relation = rdp.rdp_privacy_accountant.NeighborRel.ADD_OR_REMOVE_ONE
    acc = rdp.RdpAccountant(neighboring_relation=relation)
    acc.compose(dp_event.SelfComposedDpEvent(one, releases))
    return float(acc.get_epsilon(delta))


__all__ = ["add_noise", "clip_update", "epsilon"]
