"""Seeds: every random draw of a run derives from the one ``seed`` key."""

from __future__ import annotations

import numpy as np


def derive_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed derived from the run seed and integer keys (round, client, ...).

    ``np.random.SeedSequence([seed, *keys])``: draws for different rounds, clients or
    purposes (a tag constant) are independent, and the same keys give the same seed on
    every machine.
    """
    ss = np.random.SeedSequence([seed, *keys])
    return int(ss.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))
