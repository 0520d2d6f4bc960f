"""FedCross cross-aggregation maths (Hu et al., "FedCross: Towards Accurate Federated
Learning via Multi-Model Cross-Aggregation", ICDE 2024), as pure typed functions.

The server keeps K middleware models.  After local training the uploaded models
``V = [v_0 .. v_{n-1}]`` (the slots that reported back this round) are mixed
(Algorithm 1, ``CrossAggr``; spec ``fedcross.md`` §2.5)::

    w_i = alpha * v_i + (1 - alpha) * v_c(i)        i.e.   W' = A V,
    A = alpha I + (1 - alpha) P_c,

where ``c(i) != i`` is the collaborator chosen by ``CoModelSel`` (§2.4: in order,
highest or lowest cosine similarity) and ``P_c`` is its 0/1 selection matrix.  The
acceleration variants of §2.6 are other mixing matrices: propeller models
(:func:`propeller_matrix`) and the warm-up reset to the uploads' mean (every row
``1/n``).  The deployment model is the uniform mean of the K slots
(``GlobalModelGen``, :func:`uniform_mean`).

Similarities come from one K x K Gram matrix, accumulated in float64 over column
blocks of the stacked models with one BLAS product per block (:func:`gram`).  The
product is taken on the models minus the first one (row 0 kept raw), so the
distances between models, which decide the cosine ranking of close models, keep
full precision even in float32; see :class:`Gram`.

Threads: the Gram products use numpy's BLAS (OpenBLAS: every core unless
``OPENBLAS_NUM_THREADS`` says otherwise); the mixing uses torch with
:data:`MIX_THREADS` threads.  On cores shared with other busy processes one thread
is much faster than several spinning ones.

Floating-point entries are mixed and averaged, BatchNorm running statistics
included; integer entries (``num_batches_tracked``) are never averaged: a mixed
slot keeps its own upload's value and a mean takes the element-wise maximum.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np
from numpy.typing import NDArray

from fedsys.params import Params, is_float

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]

#: State entries left out of the "flat" similarity (BatchNorm statistics, counters):
#: the paper's cosine is over the trainable parameters.
BUFFER_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")

#: Collaborator-selection rules (§2.4) and similarity forms (§2.4, §7).
SELECTION_RULES = ("lowest", "highest", "in-order")
SIMILARITIES = ("flat", "layer-pairs")

#: Bytes of one gathered column block of the K models (32 MB was fastest at K = 100, ResNet-18).
BLOCK_BYTES = 32 << 20

#: float32 models summed in float32 before each float64 add (:func:`uniform_mean`).
MEAN_GROUP = 8

#: Elements of one entry mixed and averaged at a time by :func:`cross_aggregate`: a
#: slot's chunk is still in cache when it is added to the mean (256 KB of float32).
MIX_CHUNK = 1 << 16

#: torch threads while mixing: the element-wise mixing is memory-bound, and on cores
#: shared with busy processes several OpenMP threads spin-wait (many times slower).
MIX_THREADS = 1

#: ``torch.nn.functional.cosine_similarity``'s guard against zero norms.
COS_EPS = 1e-8


# ---------------------------------------------------------------------- layout


def trainable_keys(model: Params) -> list[str]:
    """Floating-point entries that are trained (not BatchNorm buffers), in order.

    Falls back to every floating-point entry if all of them are buffers.
    """
    floats = [k for k, v in model.items() if is_float(v)]
    trained = [k for k in floats if not k.endswith(BUFFER_SUFFIXES)]
    return trained or floats


def _work_dtype(model: Params, keys: Sequence[str]) -> np.dtype[np.floating]:
    """float64 if any entry in ``keys`` is float64, else float32."""
    dts = [model[k].dtype for k in keys if is_float(model[k])]
    return np.dtype(np.result_type(np.float32, *dts))


def stack(models: Sequence[Params], keys: Sequence[str] | None = None) -> NDArray[np.floating]:
    """The (K, D) matrix of ``models``, one row per model.

    Parameters
    ----------
    models : sequence of Params
        K models with identical keys, shapes and dtypes.
    keys : sequence of str, optional
        Entries to concatenate, in this order; default: every floating-point entry.
        Integer entries asked for are converted to the float dtype.

    Returns
    -------
    ndarray
        float32, or float64 when an entry is float64.
    """
    if not models:
        raise ValueError("stack needs at least one model")
    keys = [k for k, v in models[0].items() if is_float(v)] if keys is None else list(keys)
    dtype = _work_dtype(models[0], keys)
    dim = sum(int(models[0][k].size) for k in keys)
    out = np.empty((len(models), dim), dtype)
    for j, m in enumerate(models):
        off = 0
        for k in keys:
            v = np.ravel(m[k])
            out[j, off : off + v.size] = v
            off += v.size
    return out


def _anchored_blocks(
    models: Sequence[Params], keys: Sequence[str], block_bytes: int
) -> Iterator[NDArray[np.floating]]:
    """Yield (K, b) column blocks of ``[z_0; z_1 - z_0; ...]`` over ``keys``.

    Row 0 is model 0, row j its difference to model 0, written straight into a
    reused buffer (no (K, D) matrix); small entries share a block.  A yielded block
    is valid until the next is asked for.
    """
    k_models = len(models)
    dtype = _work_dtype(models[0], keys)
    floats = {key: is_float(models[0][key]) for key in keys}
    width = max(1024, block_bytes // (k_models * dtype.itemsize))
    buf = np.empty(k_models * width, dtype)
    segs: list[tuple[str, int, int]] = []
    used = 0

    def gather() -> NDArray[np.floating]:
        x = buf[: k_models * used].reshape(k_models, used)
        off = 0
        for key, s, e in segs:
            cols = slice(off, off + e - s)
            ref = np.ravel(models[0][key])[s:e]
            x[0, cols] = ref
            floating = floats[key]
            for j in range(1, k_models):
                if floating:
                    np.subtract(np.ravel(models[j][key])[s:e], ref, out=x[j, cols])
                else:  # integer entries (layer-pairs similarity): convert first
                    x[j, cols] = np.ravel(models[j][key])[s:e]
                    x[j, cols] -= x[0, cols]
            off += e - s
        return x

    for key in keys:
        size, start = int(models[0][key].size), 0
        while start < size:
            take = min(size - start, width - used)
            segs.append((key, start, start + take))
            used += take
            start += take
            if used == width:
                yield gather()
                segs, used = [], 0
    if used:
        yield gather()


# ---------------------------------------------------------------------- similarity


class Gram(NamedTuple):
    r"""Inner products of K models :math:`z_0 .. z_{K-1}` over some entries.

    ``raw`` is :math:`G = Z Z^\top`; ``shifted`` is the Gram matrix of the models
    minus the first, :math:`C_{ij} = (z_i - z_0)\cdot(z_j - z_0)`.  Both come from the
    same block products: row 0 is kept raw and rows 1.. are shifted, so
    :math:`G_{ij} = G_{00} + a_i + a_j + C_{ij}` with :math:`a_i = z_0\cdot(z_i - z_0)`.
    Distances, spreads and the ranking of close models depend on ``shifted``,
    whose rounding error is relative to the (small) distances, not to the norms.
    """

    raw: F64
    shifted: F64


def _anchored(models: Sequence[Params], keys: Sequence[str], block_bytes: int) -> F64:
    """Sum over column blocks of ``Y Y^T`` with ``Y = [z_0; z_1 - z_0; ...]``, float64."""
    m = np.zeros((len(models), len(models)))
    for x in _anchored_blocks(models, keys, block_bytes):
        m += x @ x.T  # one BLAS product per block (numpy uses syrk for x @ x.T)
    return m


def _gram_of_anchored(m: F64) -> Gram:
    a = m[0].copy()
    a[0] = 0.0
    c = m.copy()
    c[0, :] = 0.0
    c[:, 0] = 0.0
    return Gram(m[0, 0] + a[:, None] + a[None, :] + c, c)


def gram(
    models: Sequence[Params], keys: Sequence[str] | None = None, block_bytes: int = BLOCK_BYTES
) -> Gram:
    """Gram matrices of ``models`` over ``keys`` (default :func:`trainable_keys`).

    One ``(K, b) @ (b, K)`` product per column block, accumulated in float64; no
    loop over pairs.
    """
    if not models:
        raise ValueError("gram needs at least one model")
    keys = trainable_keys(models[0]) if keys is None else keys
    return _gram_of_anchored(_anchored(models, keys, block_bytes))


def cosine(g: F64, eps: float = COS_EPS) -> F64:
    r"""All pairwise cosine similarities from a Gram matrix (§2.4).

    :math:`\cos_{ij} = G_{ij} / \sqrt{\max(G_{ii} G_{jj}, \epsilon^2)}`, the guard of
    ``torch.nn.functional.cosine_similarity``.
    """
    d = np.diag(g)
    return g / np.sqrt(np.maximum(np.outer(d, d), eps * eps))


def layer_pair_groups(keys: Sequence[str]) -> list[tuple[list[str], float]]:
    """State entries in consecutive pairs, with the weight the authors' code gives each.

    ``sim()`` in the authors' ``Training_FedCross.py`` adds the cosine of every pair
    ``(k_0, k_1), (k_2, k_3), ...`` of ``state_dict`` tensors and, after the loop,
    the last group once more: a last *pair* is counted twice, a trailing single
    tensor once (spec §7, §6 item 10).
    """
    keys = list(keys)
    groups = [keys[i : i + 2] for i in range(0, len(keys), 2)]
    weights = [1.0] * len(groups)
    if groups and len(groups[-1]) == 2:
        weights[-1] = 2.0
    return list(zip(groups, weights, strict=True))


def similarity(
    models: Sequence[Params], mode: str = "flat", block_bytes: int = BLOCK_BYTES
) -> tuple[F64, Gram]:
    """Pairwise similarities of ``models`` for ``CoModelSel`` (§2.4).

    Parameters
    ----------
    models : sequence of Params
        The K models, in slot order.
    mode : {"flat", "layer-pairs"}
        ``flat``: the paper's cosine of the flattened trainable parameters.
        ``layer-pairs``: the authors' code, the sum of cosines over consecutive pairs
        of *all* state entries (buffers and counters included, see
        :func:`layer_pair_groups`).

    Returns
    -------
    sim : ndarray (K, K)
        Similarities; only the order within a row matters.
    trainable : Gram
        The Gram matrices over the trainable parameters (for spreads).
    """
    if mode not in SIMILARITIES:
        raise ValueError(f"similarity must be one of {SIMILARITIES}, got {mode!r}")
    train = trainable_keys(models[0])
    if mode == "flat":
        g = gram(models, train, block_bytes)
        return cosine(g.raw), g
    per_key = {k: _anchored(models, [k], block_bytes) for k in models[0]}

    def total(keys: Sequence[str]) -> F64:
        m = np.zeros((len(models), len(models)))
        for k in keys:
            m += per_key[k]
        return m

    sim = np.zeros((len(models), len(models)))
    for group, weight in layer_pair_groups(list(models[0])):
        sim += weight * cosine(_gram_of_anchored(total(group)).raw)
    return sim, _gram_of_anchored(total(train))


def spread(shifted: F64, weights: F64) -> F64:
    r"""Distance of each combination ``y_i = sum_j weights[i, j] z_j`` to their mean.

    ``weights`` rows must sum to 1 (affine combinations, as every mixing matrix
    here).  With :math:`e_i = w_i - \bar w` (rows summing to 0),
    :math:`\lVert y_i - \bar y\rVert^2 = e_i C e_i^\top` for the ``shifted`` Gram
    matrix :math:`C`, so no model is touched.

    Returns
    -------
    ndarray
        One distance per row of ``weights``.
    """
    e = weights - weights.mean(axis=0, keepdims=True)
    sq = np.einsum("ij,jk,ik->i", e, shifted, e)
    return np.asarray(np.sqrt(np.maximum(sq, 0.0)), dtype=np.float64)


# ---------------------------------------------------------------------- selection


def in_order_offset(server_round: int, n: int) -> int:
    """In-order collaborator offset ``(r mod (n-1)) + 1`` with ``r = server_round - 1``.

    The authors' code rule (§2.4): it cycles through ``1 .. n-1``, so every ``n-1``
    rounds each model collaborates with every other once, and never with itself.
    """
    if n < 2:
        raise ValueError(f"in-order selection needs at least 2 models, got {n}")
    return (server_round - 1) % (n - 1) + 1


def select_collaborators(sim: F64 | None, rule: str, server_round: int, n: int | None = None) -> I64:
    """``CoModelSel`` (Algorithm 1; spec §2.4) for every model at once.

    Parameters
    ----------
    sim : ndarray (n, n) or None
        Similarities of the n uploaded models (ignored, may be ``None``, for
        ``in-order``).
    rule : {"lowest", "highest", "in-order"}
        ``lowest``: ``argmin_{j != i} sim[i, j]``; ties keep ``(i + 1) mod n`` if it
        is among the minima, else the smallest index (the code starts there and
        replaces on a strict ``<``).  ``highest``: ``argmax_{j != i}``, ties to the
        smallest index (self excluded, unlike the code's scan).  ``in-order``:
        ``c(i) = (i + offset) mod n``, :func:`in_order_offset`.
    server_round : int
        Flower's 1-based round.
    n : int, optional
        Number of models when ``sim`` is ``None``.

    Returns
    -------
    ndarray of int
        ``c`` with ``c[i] != i``; positions, not slot ids.
    """
    if rule not in SELECTION_RULES:
        raise ValueError(f"selection rule must be one of {SELECTION_RULES}, got {rule!r}")
    size = sim.shape[0] if sim is not None else n
    if size is None or size < 2:
        raise ValueError(f"collaborator selection needs at least 2 models, got {size}")
    idx = np.arange(size)
    if rule == "in-order":
        return np.asarray((idx + in_order_offset(server_round, size)) % size, dtype=np.int64)
    if sim is None or sim.shape != (size, size):
        raise ValueError(f"rule {rule!r} needs an (n, n) similarity matrix")
    s = np.array(sim, dtype=np.float64)
    if not np.all(np.isfinite(s[~np.eye(size, dtype=bool)])):
        raise ValueError("similarities must be finite")
    if rule == "highest":
        np.fill_diagonal(s, -np.inf)
        return np.asarray(s.argmax(axis=1), dtype=np.int64)
    np.fill_diagonal(s, np.inf)
    ties = s == s.min(axis=1, keepdims=True)
    nxt = (idx + 1) % size
    return np.asarray(np.where(ties[idx, nxt], nxt, ties.argmax(axis=1)), dtype=np.int64)


# ---------------------------------------------------------------------- mixing matrices


def cross_matrix(collab: I64, alpha: float) -> F64:
    r"""Mixing matrix of ``CrossAggr`` (§2.5): :math:`A = \alpha I + (1-\alpha) P_c`.

    Row i puts ``alpha`` on model i and ``1 - alpha`` on its collaborator ``c[i]``.
    """
    n = len(collab)
    if np.any(collab == np.arange(n)):
        raise ValueError("a model cannot be its own collaborator")
    a = alpha * np.eye(n)
    a[np.arange(n), collab] += 1.0 - alpha
    return a


def propeller_offsets(server_round: int, n: int, propellers: int) -> list[int]:
    """In-order offsets of the propeller models, ``o_p = ((r + p - 1) mod (n-1)) + 1``.

    ``p = 1 .. P`` with P capped at ``n - 1`` (more would repeat offsets); spec §2.6
    item 2.
    """
    if n < 2:
        raise ValueError(f"propeller models need at least 2 models, got {n}")
    r = server_round - 1
    return [(r + p - 1) % (n - 1) + 1 for p in range(1, min(propellers, n - 1) + 1)]


def propeller_matrix(server_round: int, n: int, propellers: int, beta: float | None = None) -> F64:
    r"""Mixing matrix of propeller models (spec §2.6 item 2, the recommended reading).

    :math:`w_i = \beta v_i + \frac{1-\beta}{P} \sum_p v_{(i + o_p) \bmod n}` with
    :func:`propeller_offsets`; ``beta=None`` gives equal weights,
    :math:`\beta = 1/(P+1)`.  With ``P = n - 1`` and ``beta = 1/n`` every row is the
    uploads' mean, the warm-up reset.
    """
    offs = propeller_offsets(server_round, n, propellers)
    b = 1.0 / (len(offs) + 1) if beta is None else beta
    idx = np.arange(n)
    a = b * np.eye(n)
    for o in offs:
        a[idx, (idx + o) % n] += (1.0 - b) / len(offs)
    return a


def dynamic_alpha(server_round: int, alpha_max: float, start: int, rounds: int) -> float:
    r"""Dynamic alpha (spec §2.6 item 3): linear from 0.5 to ``alpha_max``.

    :math:`\alpha_r = 0.5 + (\alpha_{max} - 0.5)\,\mathrm{clip}((r - r_0)/T, 0, 1)`
    with ``r = server_round - 1``, ``r_0 = start`` and ``T = rounds``; ``rounds <= 0``
    turns it off (always ``alpha_max``).
    """
    if rounds <= 0:
        return alpha_max
    frac = min(max((server_round - 1 - start) / rounds, 0.0), 1.0)
    return 0.5 + (alpha_max - 0.5) * frac


# ---------------------------------------------------------------------- applying them


@contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    """Run torch with ``n`` intra-op threads inside the block, then restore."""
    import torch

    old = torch.get_num_threads()
    if n != old:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if n != old:
            torch.set_num_threads(old)


def _starts(models: Iterable[Params], key: str) -> set[int]:
    return {int(m[key].__array_interface__["data"][0]) for m in models if m[key].size}


def _rows(a: F64, n: int) -> tuple[F64, I64]:
    """Check a mixing matrix; return it and, per row, the first row equal to it."""
    a = np.asarray(a, dtype=np.float64)
    if a.shape != (n, n) or not np.all(np.isfinite(a)):
        raise ValueError(f"mixing matrix must be a finite ({n}, {n}) array, got {a.shape}")
    _, first, inverse = np.unique(a, axis=0, return_index=True, return_inverse=True)
    return a, np.asarray(first[np.reshape(inverse, -1)], dtype=np.int64)


class _Row(NamedTuple):
    """One row of a mixing matrix as a recipe: its nonzero terms, own model first."""

    terms: tuple[tuple[int, float], ...]
    kind: str  # "copy" (one term of weight 1), "lerp" (two terms summing to 1), "sum"


def _plan(row: F64, own: int) -> _Row:
    nz = [int(j) for j in np.flatnonzero(row)]
    if own in nz:  # start from the own model: lerp is exact at weight 0
        nz.remove(own)
        nz.insert(0, own)
    terms = tuple((j, float(row[j])) for j in nz)
    if len(nz) == 1 and row[nz[0]] == 1.0:
        return _Row(terms, "copy")
    if len(nz) == 2 and abs(row[nz[0]] + row[nz[1]] - 1.0) < 1e-12:
        return _Row(terms, "lerp")
    return _Row(terms, "sum")


def _apply(plan: _Row, src: Sequence[NDArray[np.generic]], dst: NDArray[np.generic]) -> None:
    """``dst = sum_j w_j * src[j]`` over the plan's terms (one lerp for two-term affine rows)."""
    if plan.kind == "copy":
        np.copyto(dst, src[plan.terms[0][0]])
    elif plan.kind == "lerp":
        import torch  # loaded already by _torch_threads

        (i, _), (j, w) = plan.terms
        torch.lerp(torch.from_numpy(src[i]), torch.from_numpy(src[j]), w, out=torch.from_numpy(dst))
    else:
        acc = np.zeros(dst.shape, dtype=np.float64)
        for j, w in plan.terms:
            acc += w * src[j].astype(np.float64)
        np.copyto(dst, acc, casting="unsafe")


def _combine(models: Sequence[Params], key: str, row: F64, own: int, dst: NDArray[np.generic]) -> None:
    """``dst = sum_j row[j] * models[j][key]`` (one lerp for two-term affine rows)."""
    _apply(_plan(row, own), [m[key] for m in models], dst)


def _mean(arrays: Iterable[NDArray[np.generic]], ref: NDArray[np.generic]) -> NDArray[np.generic]:
    """Uniform mean of ``arrays`` (like ``ref``), in the order given; see :func:`uniform_mean`."""
    if not is_float(ref):
        return np.asarray(np.max(np.stack(list(arrays)), axis=0), dtype=ref.dtype)
    acc = np.zeros(ref.shape, dtype=np.float64)
    part = np.empty(ref.shape, dtype=np.float32) if ref.dtype == np.float32 else None
    count = grouped = 0
    for x in arrays:
        count += 1
        if part is None:
            np.add(acc, x, out=acc)
            continue
        if grouped == 0:
            np.copyto(part, x)
        else:
            np.add(part, x, out=part)
        grouped += 1
        if grouped == MEAN_GROUP:
            np.add(acc, part, out=acc)
            grouped = 0
    if part is not None and grouped:
        np.add(acc, part, out=acc)
    return np.asarray(acc / count, dtype=ref.dtype)


def mix(models: Sequence[Params], a: F64, out: Sequence[Params] | None = None) -> list[Params]:
    """``W' = A V`` for every floating-point entry (``CrossAggr``, §2.5).

    ``A`` is used as a sparse matrix: each output reads only the models its row
    weights.  A row ``(1-t, t)`` on two models is one ``lerp``; longer rows sum in
    float64; identical rows are computed once.  Results are cast to each entry's
    dtype.  Integer entries of output i are model i's own.

    Parameters
    ----------
    models : sequence of Params
        The n uploaded models, V.
    a : ndarray (n, n)
        Mixing matrix.
    out : sequence of Params, optional
        n models with the same layout to write into (no new arrays; they must not
        share memory with ``models``).

    Returns
    -------
    list of Params
        ``out`` if given, else new models.
    """
    n = len(models)
    a, first = _rows(a, n)
    if out is None:
        out = [{k: np.empty_like(v) for k, v in models[0].items()} for _ in range(n)]
    elif len(out) != n:
        raise ValueError(f"out holds {len(out)} models, expected {n}")
    for key in models[0]:
        if _starts(out, key) & _starts(models, key):
            raise ValueError(f"out shares memory with the models (entry {key!r})")
    with _torch_threads(MIX_THREADS):
        for key, ref in models[0].items():
            for i in range(n):
                if not is_float(ref):
                    np.copyto(out[i][key], models[i][key])
                elif first[i] != i:  # an identical row was done already
                    np.copyto(out[i][key], out[first[i]][key])
                else:
                    _combine(models, key, a[i], i, out[i][key])
    return list(out)


def cross_aggregate(slots: Sequence[Params], uploads: Mapping[int, Params], a: F64) -> Params:
    """One FedCross aggregation: mix the uploads into their slots, return the slots' mean.

    Slot ``ok[p]`` (``ok`` = the uploading slots in increasing order) becomes row p of
    ``A V`` (:func:`mix`, written into the slot's own arrays); the other slots keep
    their models.  The result is :func:`uniform_mean` of all slots (bit for bit),
    computed chunk by chunk (:data:`MIX_CHUNK` elements of an entry) right after the
    chunk is mixed, while it is in cache; every element goes through the same
    operations in the same order as in :func:`mix` and :func:`uniform_mean`.

    Parameters
    ----------
    slots : sequence of Params
        The K middleware models, updated in place.
    uploads : mapping of int to Params
        Slot -> its upload this round (must not share memory with the slots).
    a : ndarray (n, n)
        Mixing matrix over the uploads in slot order.

    Returns
    -------
    Params
        The new global model (``GlobalModelGen``).
    """
    ok = sorted(uploads)
    models = [uploads[i] for i in ok]
    a, first = _rows(a, len(ok))
    pos = {slot: p for p, slot in enumerate(ok)}
    out = [slots[i] for i in ok]
    for key in slots[0]:
        if _starts(out, key) & _starts(models, key):
            raise ValueError(f"slots share memory with the uploads (entry {key!r})")
    plans = [_plan(a[p], p) for p in range(len(ok))]

    def produce(src: Sequence[NDArray[np.generic]], dst: Sequence[NDArray[np.generic]],
                floating: bool) -> Iterator[NDArray[np.generic]]:
        """Slot by slot: write the mixed piece of an uploading slot, yield every slot's."""
        for k, piece in enumerate(dst):
            p = pos.get(k)
            if p is not None:
                if not floating:
                    np.copyto(piece, src[p])
                elif first[p] != p:  # an identical row was done already
                    np.copyto(piece, dst[ok[first[p]]])
                else:
                    _apply(plans[p], src, piece)
            yield piece

    glob: Params = {}
    with _torch_threads(MIX_THREADS):
        for key, ref in slots[0].items():
            if not is_float(ref):
                glob[key] = _mean(produce([m[key] for m in models], [s[key] for s in slots], False),
                                  ref)
                continue
            arrays = [m[key] for m in models] + [s[key] for s in slots]
            if not all(x.flags.c_contiguous for x in arrays):  # no flat views: whole entries
                glob[key] = _mean(produce([m[key] for m in models], [s[key] for s in slots],
                                          True), ref)
                continue
            # chunk by chunk: each mixed piece is added to the mean while it is in cache
            src = [m[key].reshape(-1) for m in models]
            dst = [s[key].reshape(-1) for s in slots]
            res = np.empty(ref.size, dtype=ref.dtype)
            for lo in range(0, ref.size, MIX_CHUNK):
                hi = min(ref.size, lo + MIX_CHUNK)
                res[lo:hi] = _mean(produce([x[lo:hi] for x in src], [x[lo:hi] for x in dst], True),
                                   res[lo:hi])
            glob[key] = res.reshape(ref.shape)
    return glob


def uniform_mean(models: Sequence[Params]) -> Params:
    """``GlobalModelGen`` (§2.5): the uniform mean of ``models``.

    Floating-point entries are summed in float64 and cast back; float32 entries are
    first summed in float32 over groups of :data:`MEAN_GROUP` models (a float64 add
    of a float32 array costs about four float32 adds; the group sums add a few float32
    ulps).  Integer entries take the element-wise maximum (they cannot be averaged
    meaningfully).
    """
    if not models:
        raise ValueError("uniform_mean needs at least one model")
    return {key: _mean((m[key] for m in models), ref) for key, ref in models[0].items()}


__all__ = [
    "BUFFER_SUFFIXES", "SELECTION_RULES", "SIMILARITIES", "Gram", "cosine", "cross_aggregate",
    "cross_matrix",
    "dynamic_alpha", "gram", "in_order_offset", "layer_pair_groups", "mix", "propeller_matrix",
    "propeller_offsets", "select_collaborators", "similarity", "spread", "stack",
    "trainable_keys", "uniform_mean",
]
