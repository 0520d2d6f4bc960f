r"""Differential privacy at the client level (issue 42 item 3; issue 65): updates clipped to
an L2 norm C, Gaussian noise on their sum, and the privacy spent, (epsilon, delta), from
Google's ``dp_accounting`` (its RDP accountant; not hand-written).

The mechanism, one round (McMahan et al., "Learning Differentially Private Recurrent
Language Models", ICLR 2018, Alg. 1 with fixed clipping and a fixed denominator):
m of the N clients are sampled (a fixed-size sample without replacement), each update
:math:`\Delta_i = w_i - w` is clipped to norm C, and the released model is

.. math::

    w' = w + \frac{1}{m}\Big(\sum_{i\ \mathrm{accepted}} \mathrm{clip}_C(\Delta_i)
         + \mathcal N(0, z^2 C^2 I)\Big),

a refused or missing update counting as 0 (:func:`fixed_denominator_mean`, then
:func:`add_noise` with std ``z C / m``).  Replacing one client's data moves the sum by up
to 2C (one clipped update of norm <= C replaced by another), so the noise's standard
deviation over the sum's L2 sensitivity, which ``dp_accounting`` calls the noise
multiplier of a ``SampledWithoutReplacementDpEvent`` under ``REPLACE_ONE`` (Wang, Balle,
Kasiviswanathan, "Subsampled Renyi Differential Privacy and Analytical Moments
Accountant", AISTATS 2019, Thm. 27; dp_accounting's ``_compute_rdp_sample_wor_gaussian``:
"the ratio of the standard deviation of the Gaussian noise to the l2-sensitivity"), is
``z / 2`` (:func:`accountant_multiplier`).  Before issue 65 the accountant was given ``z``:
N = 100, m = 10, z = 1, 30 rounds, delta 1e-5 reported 7.57 where the mechanism spends
32.27.

The population a round is accounted over is the pool its sample was drawn from, not the
``num-clients`` the config declares (issue 75 item 7a): rounds from pools of different sizes
compose by adding their RDP (:func:`epsilon_of`).  Integer buffers pass clipping and noise
untouched, so a release carries the sent model's (:func:`reset_integers`).

The noise is drawn from the operating system's entropy (:func:`entropy_rng`), never from
the run's seed, which the config, the checkpoints and the results pages hold: a seeded
noise can be regenerated and subtracted by whoever reads the seed.
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Mapping

import numpy as np

from fedsys.params import Params, flatten, is_float, unflatten

#: What a DP run releases outside its epsilon, to whoever reads its round records or its
#: log: numbers from the clients' raw replies, not noised (the released models are).
OUTSIDE_EPSILON = ("clients-ok", "clients-rejected", "the training loss and the clients' other "
                   "train metrics", "trained-examples", "dp-clipped", "federated evaluation "
                   "(fed-*)", "a chain's hop, client and skip records")


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


def entropy_rng() -> np.random.Generator:
    """A generator seeded with 128 bits of the operating system's entropy
    (:func:`secrets.randbits`): nothing in a run's config, checkpoint or records can
    regenerate its draws."""
    return np.random.default_rng(secrets.randbits(128))


def fixed_denominator_mean(model: Params, reference: Params, accepted: int, sample: int) -> Params:
    r"""The uniform mean ``model`` of ``accepted`` clipped models, all trained from
    ``reference``, as DP-FedAvg's fixed-denominator estimate over the round's ``sample``
    clients: :math:`w + \frac{1}{m}\sum_i \mathrm{clip}(\Delta_i) = w + (\bar w_{acc} - w)
    \frac{a}{m}` (McMahan et al. 2018, Alg. 1, :math:`\tilde f_f` with the round's sample
    size as the denominator), so that a refused or missing client counts as an update of
    0 and the sum's sensitivity stays 2C whoever is refused.  Integer entries as
    ``model``'s; ``model`` itself when ``accepted == sample``."""
    if accepted == sample:
        return model
    scale = accepted / sample
    return {k: (np.asarray(reference[k], np.float64)
                + (np.asarray(v, np.float64) - np.asarray(reference[k], np.float64)) * scale
                ).astype(v.dtype) if is_float(v) else v for k, v in model.items()}


def sum_sensitivity(clipping_norm: float) -> float:
    """The L2 sensitivity of a sum of updates clipped to ``clipping_norm`` when one
    client's data is replaced (``REPLACE_ONE``): ``2 C``."""
    return 2.0 * clipping_norm


def accountant_multiplier(noise_multiplier: float) -> float:
    """What ``dp_accounting`` is given for a mechanism adding N(0, (z C)^2) to a sum of
    C-clipped updates: its noise multiplier is the standard deviation over the L2
    sensitivity (:func:`sum_sensitivity`), ``z C / 2C = z / 2``.  (Its PLD accountant
    under ``REPLACE_ONE`` instead takes the per-client bound and doubles it itself, its
    Gaussian privacy loss shifting by +-sensitivity: there the same mechanism is
    ``GaussianDpEvent(z)``, as ``tests/unit/test_dp.py`` cross-checks.)"""
    return noise_multiplier / 2.0


@functools.lru_cache(maxsize=64)
def rdp_per_release(noise_multiplier: float, population: int = 0, sample: int = 0
                    ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``(orders, rdp)``: the Renyi DP of one release of this module's mechanism (noise of
    std ``z C`` on a sum of C-clipped updates, ``z`` = ``noise_multiplier``) at the RDP
    accountant's default orders, from ``dp_accounting`` under ``REPLACE_ONE`` (the relation
    fixed-size sampling is analysed under; the population is public) with noise multiplier
    :func:`accountant_multiplier`.

    Unsampled: ``GaussianDpEvent(z / 2)``, alpha / (2 (z/2)^2) at order alpha.  With ``0 <
    sample < population``: at every order the smaller of that and
    ``SampledWithoutReplacementDpEvent(population, sample, GaussianDpEvent(z / 2))`` (Wang
    et al. 2019, Thm. 27): both bound the same mechanism's RDP, a sampled mechanism is
    never less private than the same mechanism on every client, and the sampled bound
    exceeds the unsampled one when m is close to N.  Cached: a run asks each round.
    """
    from dp_accounting import dp_event, rdp

    replace_one = rdp.rdp_privacy_accountant.NeighborRel.REPLACE_ONE
    gauss = dp_event.GaussianDpEvent(accountant_multiplier(noise_multiplier))

    def curve(event: dp_event.DpEvent) -> rdp.RdpAccountant:
        acc = rdp.RdpAccountant(neighboring_relation=replace_one)
        acc.compose(event)
        return acc

    every = curve(gauss)
    values = every.rdp
    if 0 < sample < population:
        values = np.minimum(values, curve(dp_event.SampledWithoutReplacementDpEvent(
            population, sample, gauss)).rdp)
    return tuple(float(o) for o in every.orders), tuple(float(v) for v in values)


def reset_integers(model: Params, reference: Params) -> tuple[Params, list[str]]:
    """``model`` with every integer (non-floating-point) entry that ``reference`` holds set
    to ``reference``'s value, and the names of those that differed.

    Clipping and noise act on the floating-point entries only, and fedsys's mean takes the
    element-wise maximum of integer buffers (:func:`fedsys.params.mean`), so a BatchNorm's
    ``num_batches_tracked`` would be released raw: the largest local step count of the
    round's clients, outside any epsilon (issue 75 item 7c).  Under DP the release keeps
    the sent model's values (a post-processing of public data)."""
    changed = [k for k, v in model.items() if not is_float(v) and k in reference
               and not np.array_equal(v, reference[k])]
    if not changed:
        return model, []
    return {k: np.array(reference[k], dtype=np.asarray(v).dtype) if k in changed else v
            for k, v in model.items()}, changed


def epsilon_of(noise_multiplier: float, releases: Mapping[tuple[int, int], int],
               delta: float) -> float:
    """The epsilon at ``delta`` after ``releases[(pool, sample)]`` releases of this module's
    mechanism on ``sample`` clients drawn without replacement from ``pool``, for each
    ``(pool, sample)`` (:func:`rdp_per_release`; ``sample`` 0 or at least ``pool``: no
    amplification).  Renyi DP composes by addition at each order (Mironov, "Renyi
    Differential Privacy", CSF 2017, Prop. 1), so rounds drawn from pools of different
    sizes add their own curves; converted with ``dp_accounting``'s ``compute_epsilon``.
    The rate of a release is that of the pool it was drawn from (issue 75 item 7a), never
    the ``m / N`` the config declares."""
    kinds = [(int(p), int(m), int(n)) for (p, m), n in sorted(releases.items()) if n > 0]
    if not kinds:
        return 0.0
    if noise_multiplier <= 0:
        return float("inf")
    from dp_accounting import rdp

    orders: tuple[float, ...] = ()
    total = np.zeros(0)
    for pool, sample, n in kinds:
        orders, per = rdp_per_release(float(noise_multiplier), pool, sample)
        total = (total if total.size else np.zeros(len(per))) + n * np.asarray(per)
    eps, _ = rdp.rdp_privacy_accountant.compute_epsilon(orders, list(total), delta)
    return float(eps)


def epsilon(noise_multiplier: float, releases: int, delta: float, population: int = 0,
            sample: int = 0) -> float:
    """The epsilon at ``delta`` after ``releases`` releases of this module's mechanism,
    each on ``sample`` clients drawn without replacement from ``population``
    (:func:`rdp_per_release`, composed by adding the RDP of the releases and converted
    with ``dp_accounting``'s ``compute_epsilon``, as its ``RdpAccountant`` does).
    ``sample`` 0 (or >= ``population``): every release sees the client, no
    amplification.  The amplification holds only while the sample is secret (the DP
    wrapper draws it from the operating system's entropy); epsilon never falls when m
    grows."""
    return epsilon_of(noise_multiplier, {(int(population), int(sample)): int(releases)}, delta)


__all__ = ["OUTSIDE_EPSILON", "accountant_multiplier", "add_noise", "clip_update", "entropy_rng", "epsilon",
           "epsilon_of", "fixed_denominator_mean", "rdp_per_release", "reset_integers",
           "sum_sensitivity"]
