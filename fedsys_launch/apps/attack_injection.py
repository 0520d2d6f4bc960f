"""A robustness experiment's attackers inside the fedsys ClientApp (config keys
``attack.*``, :mod:`fedsys.attacks`): which node attacks in a round (:func:`attack_of`),
and what it does instead of the honest thing: flipped labels to train on
(:func:`poisoned_labels`), an inflated size to claim (:func:`claimed_size`), a reply in
place of the honest one (:func:`attacked_reply`)."""

from __future__ import annotations

import functools

import torch
from flwr.app import ArrayRecord, Message

from fedsys import attacks
from fedsys import protocol as proto
from fedsys.config import ConfigError, RunConfig
from fedsys.data import Dataset
from fedsys.models import build_model
from fedsys.options import parse_group
from fedsys_launch.apps.node_model import weights_record


@functools.lru_cache(maxsize=4)
def attack_options(cfg: RunConfig) -> attacks.AttackOptions:
    """The run's ``attack.*`` options, parsed once per config (every node reads them for
    every instruction)."""
    options: attacks.AttackOptions = parse_group(attacks.AttackOptions, "attack", cfg.group("attack"))
    return options


def attack_of(cfg: RunConfig, pid: int, nparts: int, rnd: int) -> attacks.AttackOptions | None:
    """The attack this node makes this round (``attack.*`` keys), or None: it is honest."""
    try:
        options = attack_options(cfg)
        hostile = attacks.active(options, cfg.seed, pid, nparts, rnd)
    except (ConfigError, ValueError) as exc:
        raise ValueError(f"attack options: {exc}") from None
    return options if hostile else None


def poisoned_labels(attack: attacks.AttackOptions | None, y: torch.Tensor,
                    num_classes: int) -> torch.Tensor:
    """The labels the node trains on: flipped for a label-flip attacker, else ``y``."""
    if attack is not None and attack.kind == "label-flip":
        return torch.as_tensor(attacks.flip_labels(y.cpu().numpy(), num_classes))
    return y


def claimed_size(attack: attacks.AttackOptions | None, size: int) -> int:
    """The partition size the node claims: inflated by an ``inflated-count`` attacker."""
    if attack is not None and attack.kind == "inflated-count":
        return attacks.claimed_examples(size, attack.count_factor)
    return size


def attacked_reply(attack: attacks.AttackOptions, cfg: RunConfig, ds: Dataset, msg: Message,
                   weights: ArrayRecord, num_examples: int, seed: int) -> tuple[ArrayRecord, int]:
    """The attacker's reply in place of the honest ``weights`` and ``num_examples``."""
    kind = attack.kind
    if kind not in attacks.UPDATE_KINDS and kind != "inflated-count":
        return weights, num_examples  # label-flip: the training was the attack
    sent = proto.from_record(proto.model_record(msg.content))
    if kind == "inflated-count":
        fresh = build_model(cfg.model, ds.input_shape, ds.num_classes, seed, cfg.model_norm)
        return weights_record(fresh), attacks.claimed_examples(num_examples, attack.count_factor)
    model = proto.from_record(weights)
    if kind == "noise":
        out = attacks.noise_update(sent, attack.noise_std, seed)
    else:
        out = attacks.scaled_update(model, sent, attack.scale if kind == "scaled" else -1.0)
    return proto.to_record(out), num_examples
