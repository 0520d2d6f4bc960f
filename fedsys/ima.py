"""IMA maths (Zhou et al., "Mitigating Data Heterogeneity in Federated Learning with
Iterative Moving Averaging of Global Models"), as pure typed functions.

IMA keeps the last P global models the base method produced (never IMA outputs) and,
from round t_s on, broadcasts and evaluates their uniform mean (Eq. 5, computed with
:func:`fedsys.params.mean`).  The client
learning rate decays by gamma per round and, from t_s, by an extra gamma_IMA
(spec ``fedima.md`` §2.3-2.4).  Rounds are 0-indexed here, ``t = server_round - 1``,
as in the paper and the authors' code.
"""

from __future__ import annotations

import numpy as np


def start_round(num_rounds: int, fraction: float, explicit: int = -1) -> int:
    """IMA's first (0-indexed) round t_s: ``explicit`` if >= 0, else ``floor(fraction*T)``.

    With the paper's defaults, T = 300 gives t_s = 225 (active in rounds 225..299,
    Flower rounds 226..300).
    """
    if explicit >= 0:
        return explicit
    return int(np.floor(fraction * num_rounds + 1e-9))


def client_lr(t: int, lr0: float, decay: float, t_s: int | None, ima_decay: float) -> float:
    """Client learning rate of 0-indexed round ``t`` (spec §2.4).

    ``lr0 * decay**t`` before ``t_s`` (and always when ``t_s`` is ``None``);
    ``lr0 * decay**t_s * ima_decay**(t - t_s)`` from ``t_s`` on (computed as
    ``lr0 * decay**t`` when ``ima_decay == decay``, so that IMA without averaging and
    without extra decay is the base strategy bit for bit).
    """
    if t_s is None or t < t_s or ima_decay == decay:  # the same number, bit for bit
        return float(lr0 * decay**t)
    return float(lr0 * decay**t_s * ima_decay ** (t - t_s))


def averaging_active(t: int, t_s: int, window: int, strict_code_rule: bool = False) -> bool:
    """Whether the IMA mean replaces the base model in 0-indexed round ``t``.

    From ``t_s`` on.  The authors' code also waits until ``t >= P`` (a full window
    plus one); fedsys instead averages the ``min(P, t+1)`` models available when
    ``t_s < P`` (spec §6 item 8) unless ``strict_code_rule`` asks for the code's rule.
    """
    if t < t_s:
        return False
    return t >= window if strict_code_rule else True
