"""Label-based data partitions for simulated federations.

Every partitioner is a pure function of ``(labels, num_clients, seed, ...)`` that
returns one sorted ``int64`` index array per client.  The same arguments always give
the same split, so the server and every client compute identical partitions without
exchanging them.

References
----------
.. [1] McMahan et al., "Communication-Efficient Learning of Deep Networks from
   Decentralized Data", AISTATS 2017 (label shards).
.. [2] Hsu et al., "Measuring the Effects of Non-Identical Data Distribution for
   Federated Visual Classification", 2019; Lin et al., "Ensemble Distillation for
   Robust Model Fusion in Federated Learning", NeurIPS 2020 (Dirichlet label skew).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from fedsys.metrics import pyplot, save_figure

IndexArray = NDArray[np.int64]

PARTITIONERS = ("iid", "dirichlet", "dirichlet-balanced", "dirichlet-capped", "shards",
                "domain")


class PartitionError(ValueError):
    """Raised when a partition cannot be built from the given arguments."""


def _check(labels: NDArray[np.integer], num_clients: int) -> NDArray[np.int64]:
    y = np.asarray(labels).astype(np.int64).ravel()
    if num_clients < 1:
        raise PartitionError(f"num-clients must be >= 1, got {num_clients}")
    if len(y) < num_clients:
        raise PartitionError(
            f"cannot split {len(y)} samples over {num_clients} clients"
        )
    return y


def iid(labels: NDArray[np.integer], num_clients: int, seed: int) -> list[IndexArray]:
    """Split samples uniformly at random into ``num_clients`` near-equal parts.

    Parameters
    ----------
    labels : ndarray
        Label of every sample (only its length is used).
    num_clients : int
        Number of clients N.
    seed : int
        Seed of the permutation.

    Returns
    -------
    list of ndarray
        N sorted, disjoint index arrays whose sizes differ by at most one.
    """
    y = _check(labels, num_clients)
    perm = np.random.default_rng(seed).permutation(len(y))
    return [np.sort(p).astype(np.int64) for p in np.array_split(perm, num_clients)]


def _check_dirichlet(labels: NDArray[np.integer], num_clients: int, alpha: float,
                     min_size: int) -> NDArray[np.int64]:
    """The labels (:func:`_check`), after refusing a non-positive ``alpha`` and a
    ``min_size`` that all clients together could not hold."""
    if alpha <= 0:
        raise PartitionError(f"dirichlet-alpha must be > 0, got {alpha}")
    y = _check(labels, num_clients)
    if min_size * num_clients > len(y):
        raise PartitionError(
            f"dirichlet-min-size={min_size} x {num_clients} clients exceeds "
            f"{len(y)} samples"
        )
    return y


def dirichlet(
    labels: NDArray[np.integer],
    num_clients: int,
    seed: int,
    alpha: float,
    min_size: int = 10,
    max_tries: int = 1000,
) -> list[IndexArray]:
    """Dirichlet label-skew split (Hsu et al. 2019; Lin et al. 2020).

    For every class c a proportion vector ``p_c ~ Dir(alpha * 1_N)`` is drawn and the
    samples of class c are dealt to the N clients in those proportions.  Draws are
    repeated until every client holds at least ``min_size`` samples.

    Parameters
    ----------
    labels : ndarray
        Label of every sample.
    num_clients : int
        Number of clients N.
    seed : int
        Seed of all draws.
    alpha : float
        Concentration; small values give strong skew.
    min_size : int
        Smallest acceptable client size.
    max_tries : int
        Draws attempted before giving up with :class:`PartitionError`.

    Returns
    -------
    list of ndarray
        N sorted, disjoint index arrays that together cover every sample.
    """
    y = _check_dirichlet(labels, num_clients, alpha, min_size)
    rng = np.random.default_rng(seed)
    classes = np.unique(y)
    by_class = [rng.permutation(np.flatnonzero(y == c)) for c in classes]
    for _ in range(max_tries):
        parts: list[list[NDArray[np.int64]]] = [[] for _ in range(num_clients)]
        for idx in by_class:
            p = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].append(chunk)
        out = [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]
        if min(len(o) for o in out) >= min_size:
            return out
    raise PartitionError(
        f"no Dirichlet(alpha={alpha}) draw gave every client >= {min_size} samples "
        f"in {max_tries} tries; lower dirichlet-min-size or raise dirichlet-alpha"
    )


def dirichlet_balanced(
    labels: NDArray[np.integer],
    num_clients: int,
    seed: int,
    alpha: float,
    group: int = 10,
    max_tries: int = 1000,
) -> list[IndexArray]:
    """Dirichlet label skew with client sizes held near the average, as Lin et al. 2020
    split their data (FedDF's ``partition_data.py``, used by FedCDA's paper).

    The shuffled samples are cut into ``ceil(N / group)`` consecutive blocks, one per
    group of (at most) ``group`` clients.  Within a block, class by class, a proportion
    vector ``p_c ~ Dir(alpha * 1)`` over the group is drawn, the clients that already
    hold the block's average share or more get 0 of it (``p_c`` renormalised), and the
    class's samples are dealt in those proportions.  Draws of a block are repeated until
    its smallest client holds at least half the average.  A client therefore stops
    growing once it reaches the average: it overshoots by at most its part of one class,
    so sizes are near-equal (the coefficient of variation is what ``fedsys partition``
    prints) while each client's label mix follows its draws.

    Parameters
    ----------
    labels : ndarray
        Label of every sample.
    num_clients : int
        Number of clients N.
    seed : int
        Seed of the shuffle and all draws.
    alpha : float
        Concentration; small values give strong skew.
    group : int
        Clients per block (Lin et al.: 10).
    max_tries : int
        Draws of a block attempted before giving up with :class:`PartitionError`.

    Returns
    -------
    list of ndarray
        N sorted, disjoint index arrays that together cover every sample.
    """
    if alpha <= 0:
        raise PartitionError(f"dirichlet-alpha must be > 0, got {alpha}")
    if group < 1:
        raise PartitionError(f"group must be >= 1, got {group}")
    y = _check(labels, num_clients)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(y))
    n_groups = -(-num_clients // group)
    sizes = [min(group, num_clients - g * group) for g in range(n_groups)]
    bounds = np.cumsum([0] + [round(len(y) * k / num_clients) for k in sizes])
    bounds[-1] = len(y)
    out: list[IndexArray] = []
    for g, k in enumerate(sizes):
        block = perm[bounds[g]:bounds[g + 1]]
        out += _capped_dirichlet(block, y[block], k, alpha, rng, max_tries,
                                 0.5 * len(block) / k, "half of the block's average")
    return out


def dirichlet_capped(
    labels: NDArray[np.integer],
    num_clients: int,
    seed: int,
    alpha: float,
    min_size: int = 10,
    max_tries: int = 1000,
) -> list[IndexArray]:
    """Dirichlet label skew in which a client at the average size gets no more: the split
    of FedCross's and IMA's code (FedLab's ``hetero_dir_partition``; specs fedcross.md
    §5, fedima.md "Dirichlet").

    Class by class, over all N clients at once, a proportion vector
    ``p_c ~ Dir(alpha * 1_N)`` is drawn, the clients that already hold the average share
    (``len(labels) / N``) or more get 0 of it (``p_c`` renormalised), and the class's
    samples, shuffled, are dealt in those proportions.  The whole draw is repeated until
    every client holds at least ``min_size`` samples.  Sizes are unequal (a client may
    stop far below the average) but none grows far past it: between :func:`dirichlet`
    (no cap) and :func:`dirichlet_balanced` (blocks of 10, at least half the average).

    Parameters
    ----------
    labels : ndarray
        Label of every sample.
    num_clients : int
        Number of clients N.
    seed : int
        Seed of the shuffle and all draws.
    alpha : float
        Concentration; small values give strong skew.
    min_size : int
        Smallest acceptable client size (the code's ``min_require_size``: 10).
    max_tries : int
        Draws attempted before giving up with :class:`PartitionError`.

    Returns
    -------
    list of ndarray
        N sorted, disjoint index arrays that together cover every sample.
    """
    y = _check_dirichlet(labels, num_clients, alpha, min_size)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(y))
    return _capped_dirichlet(perm, y[perm], num_clients, alpha, rng, max_tries, min_size,
                             "dirichlet-min-size")


def _capped_dirichlet(idx: NDArray[np.int64], y: NDArray[np.int64], k: int, alpha: float,
                      rng: np.random.Generator, max_tries: int, least: float,
                      why: str) -> list[IndexArray]:
    """``idx`` (labels ``y``) over ``k`` clients, class by class, a client at the average
    getting no more, redrawn until every client holds ``least`` samples (``why``: where
    that bound comes from, for the error); one block of :func:`dirichlet_balanced`, all
    of :func:`dirichlet_capped`."""
    avg = len(idx) / k
    for _ in range(max_tries):
        parts: list[list[NDArray[np.int64]]] = [[] for _ in range(k)]
        held = np.zeros(k)
        for c in np.unique(y):
            members = idx[y == c]
            p = rng.dirichlet(np.full(k, alpha)) * (held < avg)
            if p.sum() <= 0:  # every open client drew 0 (tiny alpha): share among them
                p = (held < avg).astype(float)
            p = p / p.sum()
            cuts = (np.cumsum(p)[:-1] * len(members)).astype(np.int64)
            for j, chunk in enumerate(np.split(members, cuts)):
                parts[j].append(chunk)
                held[j] += len(chunk)
        if held.min() >= least:
            return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]
    raise PartitionError(
        f"no capped Dirichlet(alpha={alpha}) draw gave every one of {k} clients at least "
        f"{least:.0f} samples ({why}; the average is {avg:.0f}) in {max_tries} tries; raise "
        "dirichlet-alpha")


def size_spread(parts: list[IndexArray]) -> dict[str, float]:
    """Client sizes of a partition: smallest, largest, mean and coefficient of variation
    (std / mean, population std)."""
    n = np.array([len(p) for p in parts], dtype=float)
    mean = float(n.mean())
    return {"min": float(n.min()), "max": float(n.max()), "mean": mean,
            "cv": float(n.std() / mean) if mean else 0.0}


def shards(
    labels: NDArray[np.integer], num_clients: int, seed: int, shards_per_client: int
) -> list[IndexArray]:
    """Pathological label shards (McMahan et al. 2017).

    Samples are sorted by label (ties broken by a seeded permutation), cut into
    ``num_clients * shards_per_client`` equal shards, and each client receives
    ``shards_per_client`` shards chosen at random.

    Parameters
    ----------
    labels : ndarray
        Label of every sample.
    num_clients : int
        Number of clients N.
    seed : int
        Seed of the tie-break and the deal.
    shards_per_client : int
        Shards S given to each client.

    Returns
    -------
    list of ndarray
        N sorted, disjoint index arrays that together cover every sample.
    """
    if shards_per_client < 1:
        raise PartitionError(f"shards-per-client must be >= 1, got {shards_per_client}")
    y = _check(labels, num_clients)
    n_shards = num_clients * shards_per_client
    if n_shards > len(y):
        raise PartitionError(f"{n_shards} shards exceed {len(y)} samples")
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(y))
    order = perm[np.argsort(y[perm], kind="stable")]
    pieces = np.array_split(order, n_shards)
    deal = rng.permutation(n_shards).reshape(num_clients, shards_per_client)
    return [
        np.sort(np.concatenate([pieces[s] for s in row])).astype(np.int64)
        for row in deal
    ]


def subsample(parts: list[IndexArray], cap: int, seed: int) -> list[IndexArray]:
    """Keep at most ``cap`` samples of every partition, drawn without replacement.

    Each client's draw is uniform over its own partition, so its expected label mix is
    the one the partitioner gave it; clients at or below ``cap`` keep everything.  Used
    for the small-data regime of LSS spec §5.1 (1-2k training images per client).

    Parameters
    ----------
    parts : list of ndarray
        Sorted index arrays, one per client.
    cap : int
        Largest partition kept; 0 keeps every partition whole.
    seed : int
        Seed of the draws (client k draws from ``(seed, k)``).

    Returns
    -------
    list of ndarray
        Sorted index arrays, each a subset of the matching input array.
    """
    if cap < 0:
        raise PartitionError(f"samples-per-client must be >= 0, got {cap}")
    if cap == 0:
        return list(parts)
    out = []
    for k, p in enumerate(parts):
        if len(p) <= cap:
            out.append(p)
            continue
        rng = np.random.default_rng([seed, k, 0x5A])
        out.append(np.sort(rng.choice(p, size=cap, replace=False)).astype(np.int64))
    return out


def class_histogram(
    labels: NDArray[np.integer], parts: list[IndexArray], num_classes: int
) -> NDArray[np.int64]:
    """Return the ``(num_clients, num_classes)`` matrix of per-client class counts."""
    y = np.asarray(labels).astype(np.int64)
    return np.stack([np.bincount(y[p], minlength=num_classes) for p in parts])


def plot_histogram(hist: NDArray[np.int64], path: Path, title: str) -> Path:
    """Save a stacked bar chart of per-client class counts as a PNG."""
    plt = pyplot()

    n, c = hist.shape
    fig, ax = plt.subplots(figsize=(max(6.0, 0.35 * n + 2), 4))
    bottom = np.zeros(n)
    cmap = plt.get_cmap("tab10" if c <= 10 else "tab20")
    for k in range(c):
        ax.bar(np.arange(n), hist[:, k], bottom=bottom, color=cmap(k % cmap.N), label=str(k))
        bottom += hist[:, k]
    ax.set_xlabel("client (partition-id)")
    ax.set_ylabel("samples")
    ax.set_title(title)
    ax.set_xticks(np.arange(n))
    if c <= 20:
        ax.legend(title="class", bbox_to_anchor=(1.01, 1), loc="upper left", fontsize=7)
    return save_figure(fig, path)
