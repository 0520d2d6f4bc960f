"""Attacks from authenticated clients, to measure the defences against them (issue 42 item 4).

A robustness experiment sets ``attack.kind`` and ``attack.clients``: that many partitions,
drawn by the run seed (:func:`attackers`), reply as the attack says from
``attack.start-round`` on, through fedsys's own ClientApp, in simulation and in deployment
alike.  Everything else about them is honest: they receive the same instructions and train
the same way (except ``label-flip``, which trains on flipped labels).  The kinds:

``scaled``
    The honest update times ``attack.scale`` (100): the boosted update of model replacement
    (Bagdasaryan et al., "How To Backdoor Federated Learning", AISTATS 2020, Eq. 3).
``sign-flip``
    The honest update negated (Li et al., "RSA", AAAI 2019; the sign-flipping attack).
``noise``
    The received model plus N(0, ``attack.noise-std``^2) on every weight: the update is
    Gaussian noise (Blanchard et al., "Machine Learning with Adversaries" (Krum), NeurIPS
    2017, the Gaussian Byzantine worker).
``inflated-count``
    A freshly initialised, untrained model claiming ``attack.count-factor`` (20) times its
    examples, the size it also declares to the server's partition query (a consistent liar:
    the declared-size check passes it): the update of issue 42 that took 95 % of FedAvg's
    weight.
``label-flip``
    Honest training on flipped labels ``c -> C - 1 - c`` (Tolpegin et al., "Data Poisoning
    Attacks Against Federated Learning Systems", ESORICS 2020).

The maths is small pure functions on :data:`~fedsys.params.Params` (golden tests in
``tests/unit/test_attacks.py``); the ClientApp applies them.  Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fedsys.options import option
from fedsys.params import Params, flatten, unflatten
from fedsys.seeding import derive_seed

#: The attacks, ``none`` first (the default: every client honest).
KINDS = ("none", "scaled", "sign-flip", "noise", "inflated-count", "label-flip")
#: The attacks that rewrite the reply's model (the others change the claim or the data).
UPDATE_KINDS = ("scaled", "sign-flip", "noise")
#: :func:`~fedsys.seeding.derive_seed` tags: which partitions attack, and the noise.
_WHO, _NOISE = 0xA7AC, 0xA7AD


@dataclass(frozen=True)
class AttackOptions:
    """The ``attack.*`` keys: an experiment's attackers (none by default)."""

    kind: str = option("none", "What the attacking clients do (none: every client is honest); "
                       "see fedsys/attacks.py.", choices=KINDS)
    clients: int = option(0, "How many partitions attack, drawn by the run seed "
                          "(at most num-clients).", bounds=">= 0")
    scale: float = option(100.0, "attack.kind scaled: the factor on the honest update.")
    noise_std: float = option(1.0, "attack.kind noise: the standard deviation of the noise "
                              "that replaces the update.", bounds="> 0")
    count_factor: float = option(20.0, "attack.kind inflated-count: the claimed examples as "
                                 "a multiple of the true ones.", bounds=">= 1")
    start_round: int = option(1, "The first round the attackers attack.", bounds="> 0")


def attackers(seed: int, clients: int, num_partitions: int) -> frozenset[int]:
    """The partitions that attack: the first ``clients`` of a permutation of
    ``0..num_partitions-1`` drawn by ``seed`` (the same on every node and the server; one
    attacker of a seed is among its three).

    Raises
    ------
    ValueError
        When ``clients`` exceeds ``num_partitions``.
    """
    if not 0 <= clients <= num_partitions:
        raise ValueError(f"attack.clients {clients} must be in 0..{num_partitions} "
                         "(the number of partitions)")
    rng = np.random.default_rng(derive_seed(seed, _WHO))
    return frozenset(int(i) for i in rng.permutation(num_partitions)[:clients])


def active(options: AttackOptions, seed: int, partition: int, num_partitions: int,
           server_round: int) -> bool:
    """Whether ``partition`` attacks in ``server_round``."""
    return (options.kind != "none" and server_round >= options.start_round
            and partition in attackers(seed, options.clients, num_partitions))


def scaled_update(model: Params, sent: Params, factor: float) -> Params:
    r"""``sent + factor * (model - sent)`` over the floating-point entries (integer buffers
    as ``model``'s): ``factor`` 100 is the scaled attack, -1 the sign flip."""
    ref = flatten(sent)
    return unflatten(ref + factor * (flatten(model) - ref), model)


def noise_update(sent: Params, std: float, seed: int) -> Params:
    """``sent`` plus N(0, ``std``^2) on every floating-point entry, drawn from ``seed``."""
    ref = flatten(sent)
    rng = np.random.default_rng(derive_seed(seed, _NOISE))
    return unflatten(ref + rng.normal(0.0, std, ref.shape), sent)


def flip_labels(y: NDArray[np.integer], num_classes: int) -> NDArray[np.integer]:
    """``num_classes - 1 - y``: every class mapped to another (for an even number of
    classes none stays itself)."""
    return (num_classes - 1 - np.asarray(y)).astype(np.asarray(y).dtype)


def claimed_examples(num_examples: int, factor: float) -> int:
    """The inflated claim: ``round(factor * num_examples)``."""
    return round(factor * num_examples)


__all__ = ["KINDS", "UPDATE_KINDS", "AttackOptions", "active", "attackers", "claimed_examples",
           "flip_labels", "noise_update", "scaled_update"]
