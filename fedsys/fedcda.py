"""FedCDA selection maths (Wang et al., "FedCDA: Federated Learning with Cross-Round
Divergence-Aware Aggregation", ICLR 2024), as pure typed functions.

Every client ``n`` has a cache of up to K local models from its most recent rounds.
The server picks one cached model per client so that the bound of Eq. 5 is small,

.. math::

    J = \\frac{1}{M}\\sum_n F_n(w^n) + \\frac{L}{2M}\\sum_n \\lVert w^n - \\bar w\\rVert^2,
    \\qquad \\bar w = \\frac{1}{M}\\sum_n w^n,

and the new global model is the uniform mean of the selected models (Alg. 1, last
line).  Eq. 6 rewrites the divergence with cached squared norms
``s_n = ||w^n||^2``::

    J = (1/M) sum_n F_n + (L/2) [ (1/M) sum_n s_n - ||(1/M) sum_n w^n||^2 ].

For one greedy batch (Eq. 8) let ``S``, ``Q``, ``F`` be the sums of vector, squared
norm and loss over the clients whose models are fixed, and ``x_c`` the candidates
of the batch.  With ``a_c = <S, x_c>`` and the Gram matrix ``G`` of the candidates
(one matrix product), a combination ``(c_1..c_m)`` costs

    ||S + sum_i x_{c_i}||^2 = ||S||^2 + sum_i (2 a_{c_i} + G_{c_i c_i})
                              + 2 sum_{i<j} G_{c_i c_j},

so :func:`search_batch` evaluates every combination with vector operations on
these precomputed numbers and never copies a model per combination.  Everything is
float64, and the search works about the candidates' mean (the divergence does not
change under translation), because mean||w||^2 - ||mean w||^2 cancels when the
models are close.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from threadpoolctl import threadpool_limits

from fedsys.params import Params, is_float

F64 = NDArray[np.float64]

#: State entries left out of the divergence (BatchNorm statistics, counters): the
#: objective is over trainable parameters only (spec §6 item 11).
BUFFER_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")

#: Largest number of combinations one exhaustive search may evaluate.
MAX_COMBINATIONS = 150_000_000

GRAM_BLOCK = 1 << 18

#: BLAS threads for :func:`centred_gram`.  Its products are thin (K x |batch| rows)
#: and memory-bound: one thread is as fast as two on an idle 2-core machine and
#: 7-15 times faster when another process uses the cores (OpenBLAS threads spin;
#: docs/performance.md, "Reading the FedCDA numbers").
GRAM_THREADS = 1


class SearchTooLargeError(ValueError):
    """An exhaustive search would evaluate more than :data:`MAX_COMBINATIONS`."""


# ---------------------------------------------------------------------- layout


@dataclass(frozen=True)
class Layout:
    """How a model's state maps onto one flat vector.

    Floating-point entries are concatenated with the trainable ones first, so the
    objective's part of every packed vector is ``vec[:d_obj]``; integer entries are
    kept apart (they are never averaged).
    """

    float_keys: tuple[str, ...]
    int_keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    d_obj: int
    dim: int
    storage: str

    @classmethod
    def of(cls, params: Params) -> Layout:
        """Derive the layout of ``params`` (key order: trainable, buffers)."""
        floats = [k for k, v in params.items() if is_float(v)]
        trainable = [k for k in floats if not k.endswith(BUFFER_SUFFIXES)]
        buffers = [k for k in floats if k.endswith(BUFFER_SUFFIXES)]
        keys = tuple(trainable + buffers)
        d_obj = int(sum(params[k].size for k in trainable))
        dim = int(sum(params[k].size for k in keys))
        storage = np.result_type(*[params[k].dtype for k in keys]) if keys else np.float32
        return cls(
            float_keys=keys,
            int_keys=tuple(k for k, v in params.items() if not is_float(v)),
            shapes=tuple(tuple(params[k].shape) for k in keys),
            dtypes=tuple(str(params[k].dtype) for k in keys),
            d_obj=d_obj,
            dim=dim,
            storage=str(np.dtype(storage)),
        )

    def to_state(self) -> dict[str, Any]:
        """The layout as plain values, for a checkpoint (which holds no fedsys objects:
        :mod:`fedsys.checkpoint`)."""
        return asdict(self)

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> Layout:
        """The layout :meth:`to_state` wrote."""
        return cls(
            float_keys=tuple(str(k) for k in state["float_keys"]),
            int_keys=tuple(str(k) for k in state["int_keys"]),
            shapes=tuple(tuple(int(n) for n in s) for s in state["shapes"]),
            dtypes=tuple(str(d) for d in state["dtypes"]),
            d_obj=int(state["d_obj"]),
            dim=int(state["dim"]),
            storage=str(state["storage"]),
        )

    def pack(self, params: Params) -> tuple[NDArray[np.floating], Params]:
        """Return the flat float vector (storage dtype) and the integer entries."""
        vec = np.empty(self.dim, dtype=self.storage)
        at = 0
        for k in self.float_keys:
            a = params[k].ravel()
            vec[at : at + a.size] = a
            at += a.size
        return vec, {k: params[k].copy() for k in self.int_keys}

    def unpack(self, vec: NDArray[np.floating], ints: Params, order: Sequence[str]) -> Params:
        """Rebuild a model (entries in ``order``, original dtypes) from a vector."""
        out: Params = {}
        at = 0
        for k, shape, dt in zip(self.float_keys, self.shapes, self.dtypes, strict=True):
            n = int(np.prod(shape, dtype=np.int64))
            out[k] = np.asarray(vec[at : at + n]).reshape(shape).astype(dt)
            at += n
        out.update({k: v.copy() for k, v in ints.items()})
        return {k: out[k] for k in order}


# ---------------------------------------------------------------------- objective


def sq_norm(vec: NDArray[np.floating]) -> float:
    """``||vec||^2`` in float64."""
    return float(np.einsum("i,i->", vec, vec, dtype=np.float64))


def objective(loss_sum: float, sq_sum: float, vec_sum: F64, count: int, smoothness: float) -> float:
    """Eq. 6 from running sums: ``F/M + (L/2) (Q/M - ||S/M||^2)``.

    Parameters
    ----------
    loss_sum, sq_sum : float
        Sums of the selected models' losses ``F_n`` and squared norms ``||w^n||^2``.
    vec_sum : ndarray
        Sum of the selected models (objective part), float64.
    count : int
        Number of selected models M.
    smoothness : float
        The smoothness constant L.
    """
    if count <= 0:
        raise ValueError("objective needs at least one model")
    mean_sq = float(vec_sum @ vec_sum) / count**2
    return loss_sum / count + 0.5 * smoothness * (sq_sum / count - mean_sq)


def objective_terms(
    loss_sum: float, sq_sum: float, vec_sum: F64, count: int, smoothness: float
) -> tuple[float, float]:
    """The two parts of Eq. 6: mean loss and ``(L/2)``-scaled divergence."""
    loss = loss_sum / count
    return loss, objective(loss_sum, sq_sum, vec_sum, count, smoothness) - loss


def eq5_objective(models: F64, losses: F64, smoothness: float) -> float:
    """Eq. 5 computed directly: mean loss + (L/2) mean squared distance to the mean.

    The reference the cached form (:func:`objective`, :func:`search_batch`) is
    tested against; it copies and subtracts the models, so it is not used in runs.
    """
    models = np.asarray(models, dtype=np.float64)
    mean = models.mean(axis=0)
    div = float(np.mean(np.sum((models - mean) ** 2, axis=1)))
    return float(np.mean(losses)) + 0.5 * smoothness * div


@dataclass(frozen=True)
class CentredGram:
    """Gram matrix of a batch's candidates about the mean ``c`` of the fixed models.

    The divergence does not change under translation, so the search works on
    ``x - c``: norms are then of the size of the differences between models and
    nothing cancels (spec §6 item 10).  Centring on ``c = S / count`` also makes the
    fixed sum vanish (``S - count*c = 0``), so no inner products with ``S`` are
    needed.  With nothing fixed, ``c`` is the first candidate.
    """

    g: F64  # Gram matrix of the centred candidates
    c_sq: float  # ||c||^2, only to report J's value


def centred_gram(vectors: Sequence[NDArray[np.floating]], fixed_sum: F64, count: int) -> CentredGram:
    """One blocked pass over the candidates: :class:`CentredGram` in float64.

    Block by block over the coordinates (memory ``len(vectors) * GRAM_BLOCK``
    doubles even for memory-mapped ResNet-sized models); each block is converted and
    centred in one pass and multiplied in one matrix product.
    """
    k = len(vectors)
    dim = int(vectors[0].shape[0])
    g = np.zeros((k, k))
    c_sq = 0.0
    buf = np.empty((k, min(dim, GRAM_BLOCK)))
    with threadpool_limits(GRAM_THREADS, user_api="blas"):
        for lo in range(0, dim, GRAM_BLOCK):
            hi = min(dim, lo + GRAM_BLOCK)
            xb = buf[:, : hi - lo]
            cb = fixed_sum[lo:hi] / count if count > 0 else np.asarray(vectors[0][lo:hi], np.float64)
            for i, v in enumerate(vectors):
                xb[i] = v[lo:hi]
            xb -= cb
            g += xb @ xb.T
            c_sq += float(cb @ cb)
    return CentredGram(g, c_sq)


@dataclass(frozen=True)
class BatchChoice:
    """Result of one exhaustive batch search."""

    choice: tuple[int, ...]  # per client of the batch, the index of its chosen candidate
    value: float  # J of Eq. 8 at the choice
    combinations: int


def search_batch(
    fixed_sum: F64,
    fixed_sq: float,
    fixed_loss: float,
    fixed_count: int,
    candidates: Sequence[Sequence[NDArray[np.floating]]],
    losses: Sequence[Sequence[float]],
    rounds: Sequence[Sequence[int]],
    smoothness: float,
) -> BatchChoice:
    """Exhaustive minimisation of Eq. 8 over one batch of clients.

    Clients in the fixed set contribute their running sums; for each client ``i`` of
    the batch one of ``candidates[i]`` is chosen so that Eq. 6 over the fixed set
    plus the batch is smallest.  Ties go to the combination of newer models (larger
    sum of ``rounds``), then to the first one enumerated (spec §6 item 9).

    With the candidates centred on the fixed models' mean (:class:`CentredGram`,
    ``M = fixed_count + m``, the fixed sum then vanishes)::

        J = const + sum_i lin[c_i] + sum_{i<j} pair[c_i, c_j]
        lin[c]     = F_c/M + (L/2) (G_cc/M - G_cc/M^2)
        pair[c,c'] = -L G_cc' / M^2

    evaluated for all combinations at once, level by level (one broadcast add per
    pair of clients).

    Parameters
    ----------
    fixed_sum : ndarray
        Sum of the fixed clients' selected models (objective part), float64.
    fixed_sq, fixed_loss : float
        Sums of their squared norms and losses (they only shift the value).
    fixed_count : int
        How many clients are fixed.
    candidates : list of list of ndarray
        Per client of the batch, its cached models (objective part), any dtype.
    losses, rounds : list of list
        Per candidate: the loss ``F_n`` reported with it and its round.
    smoothness : float
        L.

    Returns
    -------
    BatchChoice
    """
    sizes = [len(c) for c in candidates]
    if not sizes or min(sizes) == 0:
        raise ValueError("every client of a batch needs at least one candidate")
    combos = int(np.prod(sizes, dtype=np.float64))
    if combos > MAX_COMBINATIONS:
        raise SearchTooLargeError(
            f"{combos:,} combinations exceed the limit of {MAX_COMBINATIONS:,}"
        )
    flat = [v for c in candidates for v in c]
    cg = centred_gram(flat, fixed_sum, fixed_count)
    m = fixed_count + len(candidates)
    lam = smoothness
    f = np.array([x for c in losses for x in c], dtype=np.float64)
    s = np.diag(cg.g)
    # Sum of the fixed models' ||w - c||^2 (S = count*c); it only shifts J.
    fixed_sq_c = fixed_sq - fixed_count * cg.c_sq
    const = fixed_loss / m + 0.5 * lam * fixed_sq_c / m
    lin = f / m + 0.5 * lam * (s / m - s / m**2)
    pair = -lam * cg.g / m**2
    offs = np.cumsum([0, *sizes])
    idx = [np.arange(offs[i], offs[i + 1]) for i in range(len(sizes))]
    # Level by level: tensor of shape sizes[:j+1], J of every partial combination
    # (without const, which is added once at the end).
    total = np.zeros(())
    for j, ij in enumerate(idx):
        total = total[..., None] + lin[ij]
        for i in range(j):
            shape = [1] * (j + 1)
            shape[i], shape[j] = sizes[i], sizes[j]
            total += pair[np.ix_(idx[i], ij)].reshape(shape)
    flat_j = total.ravel()
    best = float(flat_j.min())
    ties = np.flatnonzero(flat_j == best)
    if ties.size > 1:
        pos = np.unravel_index(ties, sizes)
        age = np.sum([np.asarray(rounds[i])[pos[i]] for i in range(len(sizes))], axis=0)
        ties = ties[np.flatnonzero(age == age.max())]
    choice = tuple(int(x) for x in np.unravel_index(int(ties[0]), sizes))
    return BatchChoice(choice, const + best, combos)


def split_batches(clients: Sequence[int], num_batches: int, rng: np.random.Generator) -> list[list[int]]:
    """Eq. 8's random split into ``min(B, P)`` near-equal batches.

    ``np.array_split`` of a seeded permutation: sizes differ by at most one
    (spec §6 item 8; B is the number of batches, not their size).
    """
    if not clients:
        return []
    # permute positions, not the ids (node ids do not fit numpy's int64); the same draw
    perm = rng.permutation(len(clients))
    return [[int(clients[i]) for i in b]
            for b in np.array_split(perm, min(num_batches, len(clients)))]


def adaptive_batches(participants: int, memory: int, min_batches: int, budget: int) -> int:
    """The number of Eq. 8 batches: the paper's B, raised until every batch's search fits.

    Eq. 8 searches each batch exhaustively, ``K^b`` combinations for a batch of ``b``
    clients, so a fixed B makes one round's cost exponential in the clients per round
    (``K^(P/B)``).  B is therefore the minimum (the paper's setting, Sec. 4.2), and the
    smallest ``B' >= B`` with ``K^max_batch <= budget`` is used; at most P batches of
    one client each (``K`` combinations, the cheapest search there is).

    Parameters
    ----------
    participants : int
        P, clients selected this round.
    memory : int
        K, models cached per client (candidates per client in the search).
    min_batches : int
        The configured B.
    budget : int
        Largest number of combinations one batch's search may evaluate; at least K.

    Returns
    -------
    int
        The batch count, between ``min(B, P)`` and ``P``.
    """
    if budget < memory:
        raise ValueError(f"a search budget of {budget} combinations cannot hold even one "
                         f"client's {memory} candidates")
    if participants <= 0:
        return min_batches
    b = min(min_batches, participants)
    while b < participants and float(memory) ** max(batch_sizes(participants, b)) > budget:
        b += 1
    return b


def search_refusal(selection: str, memory: int, budget: int, clients: int | None) -> str | None:
    """Why FedCDA's selection cannot search (one sentence naming the keys), else ``None``:
    ``approximate`` (Eq. 8) with a budget below one client's ``memory`` = K candidates
    (the batch count adapts to the rest), or ``optimal`` (Eq. 6 over every client jointly)
    over more than :data:`MAX_COMBINATIONS` = K^``clients`` combinations."""
    if selection == "approximate" and budget < memory:
        return (f"fedcda.search-budget={budget} is below K = fedcda.memory = {memory}: not "
                "even one client's candidates fit")
    n = clients or 0
    combos = math.inf if n * math.log(max(memory, 1)) > 700 else float(memory) ** n
    if selection == "optimal" and combos > MAX_COMBINATIONS:
        return (f"fedcda.selection=optimal would search K^{clients} = {combos:.3g} combinations "
                f"per batch (limit {MAX_COMBINATIONS:.3g}); lower 'num-clients' or "
                "'fedcda.memory' ('optimal' is for small federations)")
    return None


def batch_sizes(participants: int, num_batches: int) -> list[int]:
    """Sizes of the batches :func:`split_batches` makes for ``participants`` clients."""
    if participants <= 0:
        return []
    return [len(b) for b in np.array_split(np.arange(participants), min(num_batches, participants))]
