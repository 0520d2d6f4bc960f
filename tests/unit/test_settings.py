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


def test_settings_read_as_flowers_attributes_and_are_fixed_once_built() -> None:
    s = REGISTRY["fedavg"](fraction_train=0.25, fraction_evaluate=0.0, min_train_nodes=3)
    assert (s.fraction_train, s.fraction_evaluate, s.min_train_nodes) == (0.25, 0.0, 3)
    assert s.weighted_by_key == "num-examples" and s.arrayrecord_key == "arrays"
    # an assignment would change the attribute and not the parts built from it: refused
    with pytest.raises(AttributeError, match="fraction_train is one of the strategy's settings"):
        s.fraction_train = 0.5
    assert s.settings.fraction_train == 0.25
    with pytest.raises(AttributeError, match="no attribute 'fraction_trian'"):
        _ = s.fraction_trian
    # the parts were built from the same value
    assert s.nodes.fraction_train == 0.25 and s.nodes.min_train_nodes == 3
    assert s.replies.weighted_by_key == s.settings.weighted_by_key
    # a new value is a new settings object, as the tests' own loops do
    s.settings = dataclasses.replace(s.settings, fraction_evaluate=0.5)
    assert s.fraction_evaluate == 0.5


def test_fraction_zero_skips_training_and_samples_none() -> None:
    s = REGISTRY["fedavg"](fraction_train=0.0)
    assert s.settings.skips_training and s.settings.min_train == 0 and s.nodes.min_train_nodes == 0
    fixed = REGISTRY["fedavg"](fraction_train=0.0, clients_per_round=2)
    assert not fixed.settings.skips_training and fixed.settings.min_train == 2


def test_help_lists_every_keyword_with_its_default() -> None:
    """``help(FedCDAStrategy)`` / ``inspect.signature`` show what the class takes, as a
    Flower strategy's signature does: its own keywords, the settings, its options."""
    params = inspect.signature(REGISTRY["fedcda"]).parameters
    assert params["fraction_train"].default == 1.0 and params["memory"].default == 3
    assert params["evaluate_metrics_aggr_fn"].default is None
    assert list(params)[: len(RoundSettings.names())] == RoundSettings.names()
    adam = inspect.signature(REGISTRY["fedadam"]).parameters
    assert "eta_l" in adam and adam["bias_correction"].default == "auto"  # Flower's way (issue 77)
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())


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
