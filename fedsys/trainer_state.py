"""A client trainer's state between rounds, kept in the ClientApp's ``context.state``
(Flower keeps it for the run on a SuperNode and in simulation): scalars in a
ConfigRecord, models in ArrayRecords, one scope per strategy of the run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fedsys.protocol import STATE_PREFIX, array_records, config_records, from_record, to_record

State = dict[str, Any]


def _state_key(scope: str) -> str:
    return f"{STATE_PREFIX}[{scope}]"


def state_to_records(state: Mapping[str, Any], into: RecordDict, scope: str) -> None:
    """Store a trainer's state (scalars and :data:`Params`) in ``context.state``.

    Scalars (and lists of them) go into the ConfigRecord ``fedsys.state[<scope>]``,
    each model into an ArrayRecord ``fedsys.state[<scope>].<key>``; what the state no
    longer holds is removed.  ``scope`` keeps the states of the strategies of one run
    (and of their trainers) apart.  A value of another kind raises ``TypeError`` naming
    its key, before anything stored is touched.
    """
    scalar = bool | int | float | str | bytes
    values: dict[str, Any] = {}
    models: dict[str, ArrayRecord] = {}
    for k, v in state.items():
        if isinstance(v, dict) and all(isinstance(a, np.ndarray) for a in v.values()):
            models[k] = to_record(v)
        elif isinstance(v, scalar) or (isinstance(v, list) and all(isinstance(x, scalar)
                                                                   for x in v)):
            values[k] = v
        else:
            raise TypeError(f"trainer state '{k}' is a {type(v).__name__}: a state holds "
                            "scalars, lists of scalars and models ({name: ndarray})")
    base = _state_key(scope)
    for k in [k for k in into.keys() if k == base or k.startswith(base + ".")]:
        del into[k]
    for k, rec in models.items():
        into[f"{base}.{k}"] = rec
    into[base] = ConfigRecord(values)


def state_from_records(records: RecordDict, scope: str) -> State:
    """Read back what :func:`state_to_records` stored (empty on a node's first round)."""
    base = _state_key(scope)
    out: State = {}
    configs = config_records(records)
    if base in configs:
        out.update(dict(configs[base].items()))
    for k, r in array_records(records).items():
        if k.startswith(base + "."):
            out[k[len(base) + 1:]] = from_record(r)
    return out


__all__ = ["State", "state_from_records", "state_to_records"]
