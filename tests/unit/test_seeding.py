"""``fedsys.seeding``: derived seeds, and ``seed_torch`` seeding as ``torch.manual_seed`` does."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedsys import seeding


def test_derive_seed_golden() -> None:
    # SeedSequence([seed, *keys]): fixed numbers on every machine, distinct per key
    assert seeding.derive_seed(0, 1, 2) == seeding.derive_seed(0, 1, 2)
    assert len({seeding.derive_seed(0, r, c) for r in range(10) for c in range(10)}) == 100
    ss = np.random.SeedSequence([7, 3])
    assert seeding.derive_seed(7, 3) == int(ss.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))
    assert 0 <= seeding.derive_seed(2**62, 5) < 2**63


@pytest.mark.parametrize("seed", [0, 1, 12345, 2**63 - 1, 0xFFFF_FFFF_FFFF_FFFF, -5])
def test_seed_torch_draws_as_manual_seed(seed: int) -> None:
    torch.manual_seed(seed)
    want = (torch.rand(5), torch.randn(3), torch.randperm(10), torch.initial_seed())
    torch.manual_seed(999)
    seeding.seed_torch(seed)
    got = (torch.rand(5), torch.randn(3), torch.randperm(10), torch.initial_seed())
    assert all(torch.equal(a, b) for a, b in zip(got[:3], want[:3], strict=True))
    assert got[3] == want[3]


def test_seed_torch_refuses_what_manual_seed_refuses() -> None:
    for bad in (2**64, -(2**63) - 1):
        with pytest.raises((RuntimeError, ValueError)) as want:
            torch.manual_seed(bad)
        with pytest.raises((RuntimeError, ValueError)) as got:
            seeding.seed_torch(bad)
        assert type(got.value) is type(want.value) and str(got.value) == str(want.value)


@pytest.mark.parametrize("cpu_only", [True, False])
def test_seed_torch_formats_no_stack_only_where_no_accelerator_can_be_used(monkeypatch, cpu_only):
    import traceback

    torch.default_generator.manual_seed(3)
    want = torch.rand(2)
    formatted: list[int] = []
    real = traceback.format_stack
    monkeypatch.setattr(traceback, "format_stack", lambda *a, **k: formatted.append(1) or real())
    monkeypatch.setattr(seeding, "_cpu_only", lambda: cpu_only)
    seeding.seed_torch(3)
    assert torch.equal(torch.rand(2), want)
    if cpu_only:
        assert formatted == []  # the CPU generator alone
    elif not torch.cuda.is_initialized():
        assert formatted  # torch.manual_seed itself, which keeps the seed for the devices


@pytest.mark.parametrize("available", [None, "cuda", "mps", "xpu"])
def test_cpu_only_is_false_where_torch_has_an_accelerator(monkeypatch, available) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available == "cuda")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: available == "mps")
    monkeypatch.setattr(torch.xpu, "is_available", lambda: available == "xpu")
    if hasattr(torch, "mtia"):
        monkeypatch.setattr(torch.mtia, "is_available", lambda: False)
    seeding._cpu_only.cache_clear()
    try:
        assert seeding._cpu_only() is (available is None)
    finally:
        seeding._cpu_only.cache_clear()
