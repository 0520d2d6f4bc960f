"""A strategy's state between rounds, as a checkpoint holds it: the round, the global
model, the record of the rounds so far, the update norms the bounds compare with, the
traffic and each wrapper's state.  :func:`engine_state` takes it out of a strategy,
:func:`load_engine_state` puts it back; a method adds its own under its name
(``state_dict`` / ``load_state_dict`` of :class:`strategies.base.FedsysStrategy`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fedsys.params import copy

if TYPE_CHECKING:
    from strategies.rounds import RoundEngine


def engine_state(s: RoundEngine) -> dict[str, Any]:
    """Everything of ``s`` but the method's own state needed to continue the run exactly."""
    return {
        "name": s.composition,
        "round": s.round,
        "params": copy(s.params) if s.params is not None else None,
        "history": [dict(h) for h in s.history],
        "usable_rounds": s.usable_rounds,
        "update_norms": list(s.update_norms),
        **s.traffic.state(),
        "wrappers": s.wrappers.state(),
    }


def load_engine_state(s: RoundEngine, state: dict[str, Any]) -> None:
    """Restore :func:`engine_state` output into ``s`` (also a checkpoint written before
    wrappers existed, where IMA was a strategy named ``ima`` with its windows under
    ``ima``); a checkpoint of another strategy is a ValueError."""
    name = state.get("name")
    wrapped = state.get("wrappers")
    if wrapped is None and name == "ima" and [w.name for w in s.wrappers] == ["ima"]:
        name, wrapped = s.composition, {"ima": state["ima"]}
    if name != s.composition:
        raise ValueError(f"checkpoint is for strategy {state.get('name')!r}, not "
                         f"{s.composition!r}")
    s.round = int(state["round"])
    s.params = copy(state["params"]) if state["params"] is not None else None
    s.history = [dict(h) for h in state["history"]]
    s.usable_rounds = int(state.get("usable_rounds", s.round))
    s.update_norms = [float(v) for v in state.get("update_norms", [])]
    s.traffic.load(state)
    s.wrappers.load(wrapped or {})
