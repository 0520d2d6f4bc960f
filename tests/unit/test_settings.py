"""A strategy's settings: Flower's keywords and fedsys's, one value declared and documented
once (``strategies.settings.RoundSettings``), read as Flower's strategies read them and fixed
once the strategy is built (issue 66 item 1)."""

from __future__ import annotations

import dataclasses
import inspect
import re

import numpy as np
import pytest

from strategies import REGISTRY
from strategies.base import FedsysStrategy
from strategies.settings import RoundSettings


def test_every_setting_is_documented_once_on_the_settings() -> None:
    doc = inspect.getdoc(RoundSettings) or ""
    params = doc.split("Parameters")[1]
    for name in RoundSettings.names():
        assert name in params, name
    # the strategy's own docs point there, not a second copy of the list
    base_doc = inspect.getdoc(FedsysStrategy) or ""
    assert "RoundSettings" in base_doc
    assert not [n for n in RoundSettings.names() if f"{n} :" in base_doc]


def test_a_strategy_takes_the_settings_and_its_options_and_nothing_else() -> None:
    s = REGISTRY["fedcda"](fraction_train=0.5, min_available_nodes=3, seed="7", memory=4)
    assert s.settings == RoundSettings(fraction_train=0.5, min_available_nodes=3, seed=7)
    assert s.options.memory == 4
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'fraction_trian'.*fraction_train"):
        REGISTRY["fedavg"](fraction_trian=0.5)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'memroy'.*memory"):
        REGISTRY["fedcda"](memroy=4)


def test_flowers_attributes_read_as_on_flowers_strategies_and_are_fixed_once_built() -> None:
    """Flower's FedAvg keeps its keywords as attributes; fedsys's strategies read the same
    names as declared read-only properties (no attribute forwarding): the values of
    ``strategy.settings``, which the parts were built from.  fedsys's own settings are read
    on ``strategy.settings`` only."""
    from flwr.serverapp.strategy import FedAvg

    from strategies.rounds import RoundEngine

    s = REGISTRY["fedavg"](fraction_train=0.25, fraction_evaluate=0.0, min_train_nodes=3, seed=5)
    assert (s.fraction_train, s.fraction_evaluate, s.min_train_nodes) == (0.25, 0.0, 3)
    assert s.weighted_by_key == "num-examples" and s.arrayrecord_key == "arrays"
    assert s.train_metrics_aggr_fn is None and s.settings.seed == 5
    # an assignment would change the attribute and not the parts built from it: refused
    with pytest.raises(AttributeError, match="property 'fraction_train' of 'FedAvgStrategy'"):
        s.fraction_train = 0.5
    assert s.settings.fraction_train == 0.25
    with pytest.raises(AttributeError, match="no attribute 'seed'"):
        _ = s.seed
    with pytest.raises(AttributeError, match="no attribute 'fraction_trian'"):
        _ = s.fraction_trian
    # the parts were built from the same value
    assert s.nodes.fraction_train == 0.25 and s.nodes.min_train_nodes == 3
    assert s.replies.weighted_by_key == s.settings.weighted_by_key
    # a new value is a new settings object, as the tests' own loops do
    s.settings = dataclasses.replace(s.settings, fraction_evaluate=0.5)
    assert s.fraction_evaluate == 0.5
    # the properties are Flower's FedAvg's keywords, each one of the settings
    flowers = [p for p in inspect.signature(FedAvg).parameters]
    mine = [n for n, v in vars(RoundEngine).items() if isinstance(v, property)]
    assert mine == flowers and set(mine) <= set(RoundSettings.names())
    for cls in FedsysStrategy.__mro__[:-1]:  # object has its own
        assert "__getattr__" not in vars(cls) and "__setattr__" not in vars(cls), cls


def test_fraction_zero_skips_training_and_samples_none() -> None:
    s = REGISTRY["fedavg"](fraction_train=0.0)
    assert s.settings.skips_training and s.settings.min_train == 0 and s.nodes.min_train_nodes == 0
    fixed = REGISTRY["fedavg"](fraction_train=0.0, clients_per_round=2)
    assert not fixed.settings.skips_training and fixed.settings.min_train == 2


STRATEGIES = sorted(n for n, c in REGISTRY.items() if issubclass(c, FedsysStrategy))


def test_the_settings_keywords_are_the_settings() -> None:
    """``**settings: Unpack[RoundSettingsKw]`` types what :class:`RoundSettings` declares:
    the same names, in order, of the same types."""
    from strategies.settings import RoundSettingsKw

    kw = {n: getattr(t, "__forward_arg__", t) for n, t in RoundSettingsKw.__annotations__.items()}
    assert kw == {f.name: f.type for f in dataclasses.fields(RoundSettings)}
    assert not RoundSettingsKw.__required_keys__


@pytest.mark.parametrize("name", STRATEGIES)
def test_the_signature_is_the_constructors_own_with_its_options_and_the_settings(name) -> None:
    """``help(FedCDAStrategy)``, ``inspect.signature`` and mypy read one signature, the
    constructor's as written (none is generated): the method's options as keywords, each
    with the type and default its ``Options`` field declares (the config keys), then
    ``**settings``."""
    cls = REGISTRY[name]
    assert not [c for c in cls.__mro__ if "__signature__" in vars(c)]
    params = list(inspect.signature(cls).parameters.values())
    *own, rest = params
    assert (rest.name, rest.kind, rest.annotation) == (
        "settings", inspect.Parameter.VAR_KEYWORD, "Unpack[RoundSettingsKw]")
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in own)
    fields = {f.name: (f.type, f.default) for f in dataclasses.fields(cls.Options)}
    mine = {p.name: (p.annotation, p.default) for p in own}
    if name in ("fedadam", "fedyogi"):  # Flower's names; the config's 0 and auto: the default
        from flwr.serverapp import strategy as flower

        theirs = inspect.signature(getattr(flower, cls.__name__.removesuffix("Strategy")))
        for kw, field in cls.CONFIG_NAMES.items():
            assert mine[kw][0] == ("bool" if kw == "bias_correction" else fields[field][0])
            assert fields[field][1] in (0.0, "auto", mine[kw][1]), kw
            if kw in theirs.parameters:
                assert theirs.parameters[kw].default == mine[kw][1], kw
        assert set(mine) == {*cls.CONFIG_NAMES, "eta_l"}
    elif name == "fedprox":  # Flower's proximal_mu; fedprox.mu is its trainer's key
        assert fields == {} and mine == {"proximal_mu": ("float | None", None)}
    else:
        assert mine == fields


def test_the_signatures_are_what_mypy_checks_a_call_against() -> None:
    """``tests/unit/typed_strategies.py`` calls the constructors right and wrong; mypy checks
    it (pyproject's ``files``), and its ``type: ignore`` comments on the wrong calls would be
    unused, an error under ``strict``, if mypy did not see the keywords."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    files = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["mypy"]["files"]
    assert "tests/unit/typed_strategies.py" in files
    text = (root / "tests/unit/typed_strategies.py").read_text()
    assert text.count("# type: ignore[call-arg]") >= 2 and "# type: ignore[arg-type]" in text


@pytest.mark.parametrize(("kw", "why"), [
    ({"fraction_train": "abc"}, "fraction_train='abc': not a value of type float"),
    ({"query_partitions": "false"}, "query_partitions='false': not a value of type bool"),
    ({"min_train_nodes": 2.5}, "min_train_nodes=2.5: not a value of type int"),
    ({"arrayrecord_key": "model.x"}, "arrayrecord_key='model.x': a record name"),
])
def test_a_wrong_value_is_a_config_error_naming_the_class_and_keyword(kw, why) -> None:
    from fedsys.options import ConfigError

    with pytest.raises(ConfigError, match=f"^FedAvgStrategy: {re.escape(why)}"):
        REGISTRY["fedavg"](**kw)


def test_values_of_another_type_that_mean_the_same_are_taken() -> None:
    s = REGISTRY["fedavg"](fraction_train=1, min_train_nodes="3", seed=np.int64(7),
                           min_evaluate_nodes=2.0, query_partitions=1)
    assert s.settings.fraction_train == 1.0 and isinstance(s.settings.fraction_train, float)
    assert (s.settings.min_train_nodes, s.settings.seed, s.settings.min_evaluate_nodes) == (3, 7, 2)
    assert s.settings.query_partitions is True


def test_a_method_written_before_aggregate_returned_an_aggregate_still_runs(caplog) -> None:
    """A plug-in method whose ``aggregate`` returns the model itself (as the docs taught
    before ``Aggregate``) or Flower's ``(model, metrics)`` pair is taken so, said once."""
    from fedsys import protocol
    from fedsys.validation import ClientUpdate
    from strategies.fedavg import FedAvgStrategy
    from strategies.model import Aggregate
    from strategies.replies import Verdict

    class Old(FedAvgStrategy):
        def aggregate(self, server_round, updates):  # type: ignore[override]
            return super().aggregate(server_round, updates).model

    class Pair(FedAvgStrategy):
        def aggregate(self, server_round, updates):  # type: ignore[override]
            return super().aggregate(server_round, updates).model, {"mine": 1.0}

    ups = [ClientUpdate(n, n, {"w": np.full(2, float(n), np.float32)}, 10) for n in (1, 3)]
    for cls, mine in ((Old, None), (Pair, 1.0)):
        s = cls()
        s.params = {"w": np.zeros(2, np.float32)}
        s.validate = lambda replies, ex=None: Verdict(updates=ups)  # type: ignore[method-assign]
        with caplog.at_level("WARNING"):
            arrays, metrics = s.aggregate_train(1, [])
            s.aggregate_train(2, [])
        assert arrays is not None and np.allclose(protocol.from_record(arrays)["w"], 2.0)
        assert (metrics or {}).get("mine") == mine
    assert caplog.text.count("not strategies.base.Aggregate") == 2  # once per strategy
    assert isinstance(FedAvgStrategy().aggregate(1, ups), Aggregate)
