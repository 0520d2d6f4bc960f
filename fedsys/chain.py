"""Sequential FL: the order of a chain of clients and what a relayed chain sends.

FedELMY (Wang et al., "One-Shot Sequential Federated Learning for Non-IID Data by
Enhancing Local Model Diversity", ACM MM 2024) and FedSeq (Li & Lyu 2024) pass one
model from client to client.  §3.1 of the FedELMY paper draws the order as a random
permutation; its experiments and Alg. 2 use one fixed order for every pass.  Pure
functions of their arguments (no torch, no Flower).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedsys.seeding import derive_seed

#: ``chain.order`` values.
ORDERS = ("index", "permutation", "list")
ORDER_TAG = 0xC4A1


def parse_order_list(text: str) -> list[int]:
    """``"3,1,2"`` -> ``[3, 1, 2]``; a value that is not a list of distinct
    non-negative integers raises ``ValueError`` naming it."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    try:
        out = [int(t) for t in items]
    except ValueError:
        raise ValueError(f"chain.order-list {text!r} is not a comma-separated list of "
                         "partition ids") from None
    if not out:
        raise ValueError("chain.order-list is empty (chain.order: list needs it)")
    if any(v < 0 for v in out) or len(set(out)) != len(out):
        raise ValueError(f"chain.order-list {text!r} must list distinct partition ids >= 0")
    return out


def chain_order(partition_ids: Sequence[int], mode: str, seed: int, pass_index: int = 0,
                reshuffle: bool = False, given: Sequence[int] = ()) -> list[int]:
    """The partition ids in the order the chain visits them in one pass.

    Parameters
    ----------
    partition_ids : sequence of int
        The partitions taking part.
    mode : {"index", "permutation", "list"}
        ``index``: ascending (the paper's experiments and official code);
        ``permutation``: a permutation drawn from ``seed`` (§3.1), the same in every
        pass unless ``reshuffle`` (then drawn anew from ``(seed, pass_index)``);
        ``list``: exactly ``given`` (each must be in ``partition_ids``).
    seed, pass_index : int
        The run seed and the 0-based pass.
    reshuffle : bool
        Draw a new permutation for every pass (``permutation`` only).
    given : sequence of int
        The order for ``list``.
    """
    pids = sorted(int(p) for p in partition_ids)
    if mode == "index":
        return pids
    if mode == "permutation":
        rng = np.random.default_rng(derive_seed(seed, pass_index if reshuffle else 0, ORDER_TAG))
        return [pids[i] for i in rng.permutation(len(pids))]
    if mode == "list":
        unknown = [p for p in given if p not in set(pids)]
        if unknown:
            raise ValueError(f"chain.order-list names partitions {unknown} that no node holds "
                             f"(nodes hold {pids})")
        return [int(p) for p in given]
    raise ValueError(f"chain.order {mode!r}; allowed values: {', '.join(ORDERS)}")


def relay_model_messages(num_hops: int) -> int:
    """Model messages of a chain relayed through a Flower server (spec §3): each hop
    is one model down (server -> client) and one up, ``2 * hops`` (one-shot: 2N)."""
    return 2 * num_hops


def p2p_model_transfers(num_clients: int, passes: int = 1) -> int:
    """Model transfers of the same chain peer to peer (paper §4.3.1): ``T*N - 1``
    (one-shot: N - 1)."""
    return passes * num_clients - 1


__all__ = ["ORDERS", "chain_order", "p2p_model_transfers", "parse_order_list",
           "relay_model_messages"]
