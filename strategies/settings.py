"""What a fedsys strategy is built with: the settings every strategy takes, Flower's
keywords and fedsys's, declared and documented once as one value (:class:`RoundSettings`)
that the strategy hands to its parts, and typed as its constructor's keywords
(:class:`RoundSettingsKw`, ``**settings: Unpack[RoundSettingsKw]``); a method's own options,
checked against their declaration (:func:`checked_options`); both from a fedsys run config
(:func:`config_settings`, :func:`config_options`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from fedsys import protocol as proto
from fedsys.options import ConfigError, parse_group, suggest
from strategies.nodes import NodeDirectory
from strategies.replies import ReplyPolicy, Tell

if TYPE_CHECKING:
    from fedsys.config import RunConfig
    from strategies.client_metrics import MetricsAggrFn


@dataclass(frozen=True)
class RoundSettings:
    """The keyword arguments every fedsys strategy takes (beside its method's options).

    Parameters
    ----------
    fraction_train : float, default 1.0
        Fraction of the connected nodes sampled for training each round, at least
        ``min_train_nodes`` (Flower's rule); ignored when ``clients_per_round`` is set.
        0.0 without ``clients_per_round``: federated training is skipped (no train
        message is sent), as on Flower's strategies.
    fraction_evaluate : float, default 1.0
        Fraction of the nodes asked for federated evaluation (0: none).
    min_train_nodes, min_evaluate_nodes : int, default 2
        Fewest nodes sampled for training / evaluation.
    min_available_nodes : int, default 2
        Fewest connected nodes a round may start with.  A round waits up to
        ``node_wait_timeout`` seconds for the nodes it wants, then goes on if at least
        this many are connected, else raises :class:`NodesUnavailableError` (it never
        waits forever, unlike Flower's sampler).
    clients_per_round : int, optional
        Sample exactly this many nodes per round (fedsys's ``clients-per-round``).
    seed : int, default 0
        Seeds node sampling (and any draw of the method).
    node_wait_timeout : float, default 120.0
        Seconds to wait for enough nodes.
    lr_decay : float, default 1.0
        Per-round decay of the caller's ``lr`` key: ``lr * lr_decay**(round - 1)``.
    trainer : str, default "auto"
        The fedsys client trainer named in each train instruction (``trainer`` key,
        unless the caller's ``train_config`` names one); ``auto``: the method's, named
        only where its local training is its own (FedELMY's chain), as Flower's
        strategies name none.
    num_partitions : int, optional
        The partitions the nodes should hold; a node declaring another count is
        logged (the federation and the config disagree).
    max_examples_ratio : float, default 100.0
        A reply claiming more ``num-examples`` than its node declared for its partition
        is refused (logged with the numbers), so no reply takes over an aggregate by what
        it claims; a node that declared none may claim up to this many times the median
        of the round's other claims (0: no such bound).
    max_update_ratio : float, default 20.0
        A reply whose update (its model minus the model it was sent) has an L2 norm
        above this many times the median of the round's other updates (three replies or
        more), else of the last updates accepted before (a chain's earlier hops), is
        refused with the numbers (:func:`fedsys.validation.norm_refusals`; 0: no bound).
    max_weight_ratio : float, default 15.0
        From two replies on, a reply claiming more ``num-examples`` than this many times
        the median of the round's other claims is counted as that many times the median,
        and logged (:func:`fedsys.validation.ratio_capped_claims`; 0: no such bound).  It
        binds on outliers only: a site with 10 times the data of the others (50 beside 5
        and 5) keeps its weight, so an honest round is weighted as Flower's ``FedAvg``
        weights it; a claim inflated 20 times (``attack.count-factor``) is cut.
    max_weight_share : float, default 0.0
        From two replies on, the claimed ``num-examples`` that would give a reply more
        than this share of an example-weighted mean are cut to one level at which each
        has this share after every cut (water-filling; below ``1/n`` for n replies, equal
        weights) and logged (:func:`fedsys.validation.capped_claims`; 0 or 1: no cap, the
        default since issue 77: a share cap binds on an honest site that simply holds more
        data than the others together, 30 beside 10; it was 0.5).
    transport_retries : int, default 1
        Times a round sends its instruction again to a node whose reply was lost on
        the way (an error reply with Flower's code 3, 4 or 5), within the round.
    query_partitions : bool, default False
        Before sampling, send every node not seen before one QUERY message asking for
        its ``partition-id`` and its partition's size (the most ``num-examples`` its
        replies may then claim); a node that does not answer is keyed by its node id.
        Off (Flower's way): only train and evaluate messages are sent, and a node's
        partition is the ``partition-id`` its first train reply reports, if any.
        Sampling by partition-id from round 1, the same for a seed whatever node ids
        Flower assigned, needs it on; fedsys's own ServerApp turns it on (its ClientApp
        answers queries, :mod:`fedsys_launch.apps.client_app`).
    train_loss_key : str, default "train_loss"
        The train-reply metric holding the client's training loss (the name Flower's
        app template reports and Flower's ``QFedAvg`` reads; fedsys's own ClientApp
        reports ``train-loss``); the round's example-weighted mean is reported under
        the same name.
    weighted_by_key : str, default "num-examples"
        The train-reply metric holding the number of examples an update is weighted by
        (Flower's ``weighted_by_key``); a reply without it is refused.
    arrayrecord_key, configrecord_key : str, default "arrays", "config"
        Flower's keywords: the names an instruction's model and settings travel under.
        A reply's model is read under ``arrayrecord_key``, else as its one ArrayRecord
        whatever its name (Flower's rule; ``model.<name>`` records are a method's extra
        models), its metrics from its one MetricRecord, whatever its name; its
        ConfigRecords are the client's own and not read.
    train_metrics_aggr_fn, evaluate_metrics_aggr_fn : callable, optional
        Flower's keywords: ``fn(contents, weighted_by_key) -> MetricRecord``, the round's
        client metrics from the used train replies' (the evaluate replies') contents,
        reported beside the round's own (``clients-ok``, the training loss, ...).
        Without one, Flower's default: every metric all used replies report, averaged
        weighted by their examples.
    """

    fraction_train: float = 1.0
    fraction_evaluate: float = 1.0
    min_train_nodes: int = 2
    min_evaluate_nodes: int = 2
    min_available_nodes: int = 2
    clients_per_round: int | None = None
    seed: int = 0
    node_wait_timeout: float = 120.0
    lr_decay: float = 1.0
    trainer: str = "auto"
    num_partitions: int | None = None
    max_examples_ratio: float = 100.0
    max_update_ratio: float = 20.0
    max_weight_ratio: float = 15.0
    max_weight_share: float = 0.0
    transport_retries: int = 1
    query_partitions: bool = False
    train_loss_key: str = proto.FLOWER_TRAIN_LOSS
    weighted_by_key: str = proto.NUM_EXAMPLES
    arrayrecord_key: str = proto.ARRAYS
    configrecord_key: str = proto.CONFIG
    train_metrics_aggr_fn: MetricsAggrFn | None = None
    evaluate_metrics_aggr_fn: MetricsAggrFn | None = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):  # Flower's strategies take 1 for 1.0, "5" for 5
            value, kind = getattr(self, f.name), _KINDS.get(f.name)
            if kind is not None and value is not None:
                object.__setattr__(self, f.name, _as(f.name, kind, value))
        for kw in ("arrayrecord_key", "configrecord_key"):
            name = getattr(self, kw)
            if not name or name.startswith(proto.MODEL_PREFIX):
                raise ConfigError(f"{kw}={name!r}: a record name, not empty and not starting "
                                  f"with {proto.MODEL_PREFIX!r} (a method's extra models "
                                  f"travel under that prefix)")

    @classmethod
    def names(cls) -> list[str]:
        """The keywords, in order."""
        return [f.name for f in dataclasses.fields(cls)]

    @property
    def skips_training(self) -> bool:
        """Whether a round sends no train message: ``fraction_train=0.0`` without a fixed
        ``clients_per_round`` (Flower's strategies skip federated training so)."""
        return self.fraction_train == 0.0 and self.clients_per_round is None

    @property
    def min_train(self) -> int:
        """Fewest nodes a training round samples (none where training is skipped)."""
        return 0 if self.skips_training else self.min_train_nodes

    def node_directory(self, tell: Tell) -> NodeDirectory:
        """The strategy's nodes and which a round samples, under these settings."""
        return NodeDirectory(
            seed=self.seed, fraction_train=self.fraction_train, min_train_nodes=self.min_train,
            min_available_nodes=self.min_available_nodes, wait_timeout=self.node_wait_timeout,
            query=self.query_partitions, num_partitions=self.num_partitions, tell=tell)

    def reply_policy(self, method: str, required: Mapping[str, str], tell: Tell) -> ReplyPolicy:
        """Which train replies the method uses, under these settings (``required``: the
        keyword naming each reply metric the method needs -> why it needs it)."""
        keys = {"train_loss_key": self.train_loss_key, "weighted_by_key": self.weighted_by_key}
        return ReplyPolicy(method, self.weighted_by_key, self.train_loss_key,
                           self.max_examples_ratio, self.max_update_ratio, self.max_weight_share,
                           {keys[kw]: (kw, why) for kw, why in required.items()}, tell,
                           arrays_key=self.arrayrecord_key,
                           max_weight_ratio=self.max_weight_ratio)


class RoundSettingsKw(TypedDict, total=False):
    """:class:`RoundSettings` as a strategy's keyword arguments, every one optional
    (``**settings: Unpack[RoundSettingsKw]``, PEP 692: what mypy checks a call against):
    the same names and types (a unit test holds them equal); each is documented, with its
    default, on :class:`RoundSettings`."""

    fraction_train: float
    fraction_evaluate: float
    min_train_nodes: int
    min_evaluate_nodes: int
    min_available_nodes: int
    clients_per_round: int | None
    seed: int
    node_wait_timeout: float
    lr_decay: float
    trainer: str
    num_partitions: int | None
    max_examples_ratio: float
    max_update_ratio: float
    max_weight_ratio: float
    max_weight_share: float
    transport_retries: int
    query_partitions: bool
    train_loss_key: str
    weighted_by_key: str
    arrayrecord_key: str
    configrecord_key: str
    train_metrics_aggr_fn: MetricsAggrFn | None
    evaluate_metrics_aggr_fn: MetricsAggrFn | None


def _as(name: str, kind: Callable[[Any], Any], value: Any) -> Any:
    """``value`` as a ``kind`` (1 for 1.0, "5" for 5), or a ConfigError naming the keyword:
    no silent truncation (2.5 nodes), no string read as a flag ("false" is not False)."""
    try:
        out = kind(value)
    except (TypeError, ValueError):
        out = None
    exact = (kind is not bool or value in (0, 1)) and (kind is not int or out == value
                                                      or isinstance(value, str))
    if out is None or not exact:
        raise ConfigError(f"{name}={value!r}: not a value of type {kind.__name__}")
    return out


_KINDS: dict[str, Callable[[Any], Any]] = {
    f.name: {"float": float, "int": int, "str": str, "bool": bool}[str(f.type)]
    for f in dataclasses.fields(RoundSettings) if str(f.type) in ("float", "int", "str", "bool")}


def unexpected_keyword(cls: type, name: str, keywords: Iterable[str]) -> TypeError:
    """The TypeError of a keyword ``cls`` does not take, naming the closest of its
    ``keywords`` (Python's own names none)."""
    return TypeError(f"{cls.__name__}() got an unexpected keyword argument {name!r}."
                     f"{suggest(name, keywords).split(' Run')[0]}")


OptionsT = TypeVar("OptionsT")


def checked_options(options: OptionsT, prefix: str) -> OptionsT:
    """``options`` (a method's options dataclass, built from its constructor's keywords)
    with every value coerced and checked against its declaration
    (:func:`fedsys.options.parse_group`): a wrong value is a ConfigError naming its config
    key (``fedcda.memory``)."""
    values: OptionsT = parse_group(type(options), prefix, dict(vars(options)))
    return values


def config_options(cfg: RunConfig, options: type, prefix: str) -> dict[str, Any]:
    """A method's options from a fedsys run config, by field name: the fields of
    ``options`` under ``prefix`` (other keys of the group are its trainer's)."""
    fields = {f.name for f in dataclasses.fields(options)}
    return {f: v for f, v in cfg.fields_of(prefix).items() if f in fields}


def config_settings(cfg: RunConfig) -> dict[str, Any]:
    """The settings a fedsys run config gives (fedsys's own ClientApp answers the query
    and reports fedsys's metric names)."""
    return {
        "clients_per_round": cfg.clients_per_round,
        "min_available_nodes": cfg.min_available_clients,
        "fraction_evaluate": cfg.fraction_evaluate,
        "min_evaluate_nodes": 1,
        "seed": cfg.seed,
        "node_wait_timeout": cfg.node_wait_timeout,
        "lr_decay": cfg.lr_decay,
        "trainer": cfg.trainer,
        "num_partitions": cfg.num_clients,
        "max_examples_ratio": cfg.max_examples_ratio,
        "max_update_ratio": cfg.max_update_ratio,
        "max_weight_ratio": cfg.max_weight_ratio,
        "max_weight_share": cfg.max_weight_share,
        "transport_retries": cfg.transport_retries,
        "query_partitions": cfg.query_partitions,
        "train_loss_key": proto.TRAIN_LOSS,
        "weighted_by_key": proto.NUM_EXAMPLES,
    }
