"""Seeds: every random draw of a run derives from the one ``seed`` key."""

from __future__ import annotations

import functools

import numpy as np


def derive_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed derived from the run seed and integer keys (round, client, ...).

    ``np.random.SeedSequence([seed, *keys])``: draws for different rounds, clients or
    purposes (a tag constant) are independent, and the same keys give the same seed on
    every machine.
    """
    ss = np.random.SeedSequence([seed, *keys])
    return int(ss.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def seed_torch(seed: int) -> None:
    """``torch.manual_seed(seed)``: the same generators seeded, without its cost where no
    accelerator can be used.

    ``torch.manual_seed`` also seeds CUDA, XPU, MTIA and a custom device, and for each one
    not yet initialised it keeps the seed for later together with a formatted stack
    trace of the call (``traceback.format_stack``: 0.1 ms from a shallow stack, 0.7 ms
    from a ClientApp's depth, ``benchmarks/message_costs.py``; paid by every client's
    local training, ``clients.base.sgd_loop``).  Where none of them is available
    to this process (:func:`_cpu_only`) none can ever be initialised, the kept seeds are
    never used, and seeding the CPU generator is all ``torch.manual_seed`` does.
    """
    import torch

    if _cpu_only():
        torch.default_generator.manual_seed(int(seed))
    else:
        torch.manual_seed(seed)


@functools.cache
def _cpu_only() -> bool:
    """No accelerator torch's ``manual_seed`` would seed is available to this process
    (asked once: availability is fixed before a device is first used)."""
    import torch

    if torch.cuda.is_available() or torch.backends.mps.is_available():
        return False
    if any(getattr(torch, m).is_available() for m in ("xpu", "mtia") if hasattr(torch, m)):
        return False
    return not hasattr(torch, torch._C._get_privateuse1_backend_name())  # no custom device
