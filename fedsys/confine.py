"""What a submitted run config may name in a deployment: files, directories and plugins.

In a deployment (a SuperLink with SuperNodes: ``fedsys deploy up``, docker-compose)
whoever may submit a run (``flwr run --run-config``) writes the run config, yet the
ServerApp and every site's ClientApp run under the operator's account.  So there the
keys that name a file or directory (:data:`PATH_KEYS`) must resolve under directories
the operator allows, and ``plugins`` (modules imported on the server and on every site)
may name only modules the operator allows.  A refusal is a
:class:`~fedsys.config.ConfigError` naming the key, on one line; the app raises it
before it reads a path or imports a module, and the run fails with it in the log.

The operator's policy is the environment of the app process (the SuperExec that forks
``flwr-serverapp`` / ``flwr-clientapp`` hands on its own: ``fedsys deploy`` sets it per
component, the images with ``ENV`` or compose's ``environment``):

``FEDSYS_ROOTS``
    Absolute directories separated by ``:`` (:data:`os.pathsep`).  A path key's value,
    ``~`` expanded, taken relative to the app's working directory, ``..`` and symlinks
    followed (:meth:`pathlib.Path.resolve`), must be one of them or lie below one.
    Unset: ``<working directory>/runs``, where the default ``output-dir`` puts runs.
    Set but empty, or holding an empty or relative entry: refused (the app fails
    naming the variable), never read as "anywhere".
``FEDSYS_PLUGINS``
    The module names ``plugins`` may list, separated by ``,`` (exact names).  Unset or
    empty: none, so a run config naming any plugin is refused.
``FEDSYS_DENY``
    Absolute directories separated by ``:`` that no path key may name, whatever the
    roots (``fedsys deploy`` sets the deployment directory: its keys, certificates, CA,
    staged apps, database and logs).  A path key resolving at or under one (symlinks
    followed), or a run directory ``<output-dir>/<name>`` there, is refused naming the
    key and saying it is inside the deployment.  Unset or empty: none; a relative entry
    is refused like one of ``FEDSYS_ROOTS``.

The keys only read (:data:`READ_KEYS`: ``data-dir``, ``init-from``, ``branch-from``) may
also lie under ``$FEDSYS_DATA`` (when set) and the Debian package's Fashion-MNIST
directory (:data:`fedsys.data.DEBIAN_FMNIST`): fedsys reads its data there anyway when
``data-dir`` is empty, so naming them grants nothing new.  The keys written
(:data:`WRITE_KEYS`; ``fedcda.cache-dir``'s cache files are also removed) and the
strategies' result directories (``<output-dir>/<name>/<label>``, a label made from a
variant's overrides may hold ``/``) must lie under ``FEDSYS_ROOTS``.  A site's own
``data-dir`` (``--node-config 'data-dir="/data"'``) is the operator's too: that site's
ClientApp adds it to the directories it may read (:meth:`Policy.reading`).

fedsys's own simulation (``fedsys run`` / ``resume`` / ``seeds``,
``fedsys_launch.engines.simulation.simulate``) admits the config as well, under the policy of the
user who writes it and runs the processes: :func:`own_run_policy`, which allows what that
config names.  It hands Flower app objects built with that policy in process, which no
run config can name.  Every other way of running the apps (``flwr run`` against any
SuperLink, Flower's own local simulation included) applies the environment's policy, set
or not.

Plugins registered through a plugin module may declare path keys of their own; they
are not in :data:`PATH_KEYS` and so not confined: allow only plugins you trust.  This
confines the run config only: the apps' code comes from the FAB that ``flwr run``
submits, so a SuperLink open to untrusted submitters must also accept only a FAB it
trusts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fedsys.config import CORE_SCHEMA, ConfigError, RunConfig, flatten
from fedsys.data import DEBIAN_FMNIST

ROOTS_ENV = "FEDSYS_ROOTS"
PLUGINS_ENV = "FEDSYS_PLUGINS"
DENY_ENV = "FEDSYS_DENY"

#: Keys naming a file or directory the apps write (or remove files in); ``pretrain.out``
#: is written by ``fedsys pretrain`` alone, and checked all the same.
WRITE_KEYS = ("output-dir", "fedcda.cache-dir", "pretrain.out")
#: Keys naming a file or directory the apps only read.
READ_KEYS = ("data-dir", "init-from", "branch-from")
#: Every key naming a file or directory (the ServerApp checks them all).
PATH_KEYS = WRITE_KEYS + READ_KEYS
#: The path keys a ClientApp reads (it trains on its partition; it writes nothing).
CLIENT_KEYS = ("data-dir",)

_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


@dataclass(frozen=True)
class Policy:
    """What a run config may name in this process.

    Attributes
    ----------
    roots : tuple of Path
        Resolved directories under which every path key may lie (``FEDSYS_ROOTS``).
    read_roots : tuple of Path
        Resolved directories under which the keys only read may also lie.
    plugins : frozenset of str
        Module names ``plugins`` may list (``FEDSYS_PLUGINS``).
    base : Path
        The working directory relative paths are taken from.
    source : str
        Where ``roots`` came from, for refusals (``"FEDSYS_ROOTS"`` or the default).
    deny : tuple of Path
        Resolved directories no path key may name, whatever the roots (``FEDSYS_DENY``:
        the deployment directory).
    """

    roots: tuple[Path, ...]
    read_roots: tuple[Path, ...] = ()
    plugins: frozenset[str] = frozenset()
    base: Path = Path("/")
    source: str = ROOTS_ENV
    deny: tuple[Path, ...] = ()

    def reading(self, *paths: str) -> Policy:
        """This policy with ``paths`` (resolved from :attr:`base`) also allowed to read."""
        extra = tuple(resolve(p, self.base) for p in paths if p)
        return replace(self, read_roots=self.read_roots + extra)


def resolve(value: str | Path, base: Path) -> Path:
    """``value`` as the apps use it: ``~`` expanded, relative to ``base``, ``..`` and
    symlinks followed (:meth:`pathlib.Path.resolve`; a missing tail is kept as written)."""
    return (base / Path(value).expanduser()).resolve()


def within(path: Path, roots: Iterable[Path]) -> bool:
    """Whether the resolved ``path`` is one of the resolved ``roots`` or lies below one."""
    return any(path.is_relative_to(root) for root in roots)


def parse_roots(text: str, base: Path, variable: str = ROOTS_ENV) -> tuple[Path, ...]:
    """``FEDSYS_ROOTS``'s directories (or ``variable``'s: ``FEDSYS_DENY``), resolved.

    Raises
    ------
    ConfigError
        ``text`` is empty, or an entry is empty or not absolute.
    """
    if not text.strip():
        raise ConfigError(f"environment variable {variable} is set but empty; give absolute "
                          f"directories separated by '{os.pathsep}', or unset it for "
                          f"<working directory>/{default_output_dir()}")
    out = []
    for entry in text.split(os.pathsep):
        if not entry.strip() or not Path(entry.strip()).is_absolute():
            raise ConfigError(f"environment variable {variable}: entry {entry!r} is not an "
                              f"absolute directory; give absolute directories separated by "
                              f"'{os.pathsep}'")
        try:
            out.append(resolve(entry.strip(), base))
        except (OSError, RuntimeError) as exc:  # a symlink loop
            raise ConfigError(f"environment variable {variable}: entry {entry!r} cannot be "
                              f"resolved ({exc})") from None
    return tuple(out)


def parse_plugins(text: str) -> frozenset[str]:
    """``FEDSYS_PLUGINS``'s module names (empty: none).

    Raises
    ------
    ConfigError
        An entry is not a dotted module name.
    """
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if not _MODULE.fullmatch(n)]
    if bad:
        raise ConfigError(f"environment variable {PLUGINS_ENV}: {bad[0]!r} is not a module "
                          "name; give module names separated by ','")
    return frozenset(names)


def default_output_dir() -> str:
    """The ``output-dir`` a run config that sets none gets (``runs``)."""
    return str(CORE_SCHEMA.defaults["output-dir"])


def policy_from_env(environ: Mapping[str, str], cwd: Path | None = None) -> Policy:
    """The operator's policy from an app process's environment (module docstring).

    Parameters
    ----------
    environ : mapping
        The environment (``os.environ``).
    cwd : Path, optional
        The working directory relative paths are taken from (default: this process's).

    Raises
    ------
    ConfigError
        ``FEDSYS_ROOTS``, ``FEDSYS_DENY`` or ``FEDSYS_PLUGINS`` cannot be read
        (:func:`parse_roots`, :func:`parse_plugins`).
    """
    base = (cwd if cwd is not None else Path.cwd()).resolve()
    if ROOTS_ENV in environ:
        roots, source = parse_roots(environ[ROOTS_ENV], base), ROOTS_ENV
    else:
        roots = (resolve(default_output_dir(), base),)
        source = f"the default, {ROOTS_ENV} unset"
    data = environ.get("FEDSYS_DATA", "")
    read = tuple(resolve(d, base) for d in (data, DEBIAN_FMNIST) if d)
    deny_text = environ.get(DENY_ENV, "")
    deny = parse_roots(deny_text, base, DENY_ENV) if deny_text.strip() else ()
    return Policy(roots, read, parse_plugins(environ.get(PLUGINS_ENV, "")), base, source, deny)


def own_run_policy(cfg: RunConfig, cwd: Path | None = None) -> Policy:
    """The policy of a run whose config's author runs the processes (fedsys's own
    simulation): every directory ``cfg`` names to write (its write keys, each strategy's
    result directory), every path it names to read, and the plugins it lists, for every
    strategy variant; nothing denied.  ``cfg`` itself is admitted under it (another
    config naming other paths or plugins is not).

    Parameters
    ----------
    cfg : RunConfig
        The run's config, as the user wrote it.
    cwd : Path, optional
        The working directory relative paths are taken from (default: this process's).
    """
    base = (cwd if cwd is not None else Path.cwd()).resolve()
    write: list[Path] = []
    read: list[Path] = []
    run_dir = Path(cfg.output_dir) / cfg.name
    for label, vcfg in [("", cfg), *cfg.variants()]:
        named = [(k, str(vcfg.get(k))) for k in PATH_KEYS if k in vcfg.schema.by_key]
        if label:
            named.append(("output-dir", str(run_dir / label)))
        for key, value in named:
            if not value:
                continue
            try:
                (read if key in READ_KEYS else write).append(resolve(value, base))
            except (OSError, RuntimeError, ValueError):  # unresolvable: refused by name
                continue
    return Policy(tuple(dict.fromkeys(write)), tuple(dict.fromkeys(read)),
                  frozenset(plugin_names(cfg.to_dict())), base, "the run's own config")


def _denied(path: Path, policy: Policy) -> Path | None:
    """The directory of ``policy.deny`` that holds the resolved ``path``, if any."""
    return next((d for d in policy.deny if path.is_relative_to(d)), None)


def _deny_refusal(key: str, value: str, inside: Path, where: str = "") -> str:
    return (f"config key '{key}'{where}: {value!r} is inside the deployment ({inside}: its "
            f"keys, certificates, database and logs; {DENY_ENV}), which no run may name")


def _allowed(policy: Policy, read: bool) -> str:
    """Which directories a refused key could have named, and whence, for its refusal."""
    text = f"allowed: {os.pathsep.join(map(str, policy.roots))} ({policy.source})"
    if read and policy.read_roots:
        text += f" and the data directories {os.pathsep.join(map(str, policy.read_roots))}"
    return text


def _path_refusal(key: str, value: str, policy: Policy, where: str = "") -> str | None:
    """The refusal of ``key``'s ``value``, or None where it lies under the roots."""
    read = key in READ_KEYS
    roots = policy.roots + policy.read_roots if read else policy.roots
    try:
        path = resolve(value, policy.base)
        if (inside := _denied(path, policy)) is not None:  # whatever the roots
            return _deny_refusal(key, value, inside, where)
        if within(path, roots):
            return None
    except (OSError, RuntimeError, ValueError):  # an unknown ~user, a NUL byte, a loop
        pass
    return (f"config key '{key}'{where}: {value!r} lies outside the directories a run may "
            f"{'read' if read else 'write'} here; {_allowed(policy, read)}")


def check_paths(cfg: RunConfig, policy: Policy, keys: Iterable[str] = PATH_KEYS) -> list[str]:
    """The refusals of ``cfg``'s path keys under ``policy`` (empty: all allowed).

    Every strategy variant is checked too (``fedcda[fedcda.cache-dir=...]`` may set a
    path of its own), and each variant's result directory ``<output-dir>/<name>/<label>``.
    An empty value names nothing and passes.  Whatever the roots, no path and no run
    directory ``<output-dir>/<name>`` may lie under ``policy.deny`` (the deployment).

    Parameters
    ----------
    cfg : RunConfig
        The run's config, built from the submitted run config.
    policy : Policy
        The operator's policy (:func:`policy_from_env`).
    keys : iterable of str
        The keys to check (:data:`PATH_KEYS` on the server, :data:`CLIENT_KEYS` on a site).

    Returns
    -------
    list of str
        One line per refused key, each naming it.
    """
    keys = [k for k in keys if k in cfg.schema.by_key]
    out: list[str] = []
    refused: set[str] = set()
    for label, vcfg in [("", cfg), *cfg.variants()]:
        where = f" (strategy {label!r})" if label else ""
        for key in keys:
            value = str(vcfg.get(key))
            refusal = _path_refusal(key, value, policy, where) if value else None
            if refusal is not None and key not in refused:
                refused.add(key)
                out.append(refusal)
        if "output-dir" not in keys or "output-dir" in refused:
            continue
        run_dir = resolve(cfg.output_dir, policy.base) / cfg.name
        if not label and (inside := _denied(resolve(run_dir, policy.base), policy)):
            refused.add("output-dir")  # '<output-dir>/<name>' is where the run writes
            out.append(_deny_refusal("name", str(run_dir), inside, " (with output-dir)"))
        elif label and (inside := _denied(resolve(run_dir / label, policy.base), policy)):
            out.append(_deny_refusal("strategy", label, inside, " (its results)"))
        elif label and not within(resolve(run_dir / label, policy.base), policy.roots):
            out.append(f"config key 'strategy': label {label!r} puts its results outside "
                       f"the directories a run may write here; {_allowed(policy, False)}")
    return out


def plugin_names(run_config: Mapping[str, Any]) -> list[str]:
    """The modules ``run_config``'s ``plugins`` key lists (a string with ``,`` or a list)."""
    value = flatten(run_config).get("plugins", "")
    items = value if isinstance(value, list | tuple) else str(value).split(",")
    return [n for n in (str(i).strip() for i in items) if n]


def check_plugins(names: Iterable[str], policy: Policy) -> list[str]:
    """The refusal of the plugin modules ``names`` not in ``policy.plugins`` (empty: none)."""
    bad = [n for n in names if n not in policy.plugins]
    if not bad:
        return []
    allowed = ", ".join(sorted(policy.plugins)) or "none"
    return [f"config key 'plugins': {', '.join(map(repr, bad))} not allowed here (allowed: "
            f"{allowed}; {PLUGINS_ENV})"]


def enforce(refusals: Sequence[str]) -> None:
    """Raise :class:`ConfigError` holding ``refusals`` on one line, if there are any."""
    if refusals:
        raise ConfigError("; ".join(refusals))


def admit(run_config: Mapping[str, Any], policy: Policy,
          build: Callable[[Mapping[str, Any]], RunConfig],
          keys: Iterable[str] = PATH_KEYS) -> RunConfig:
    """The config of a submitted ``run_config``, admitted under ``policy``.

    ``plugins`` is checked before ``build`` (which imports them), the path keys ``keys``
    after it.

    Raises
    ------
    ConfigError
        Naming each refused key, on one line.
    """
    enforce(check_plugins(plugin_names(run_config), policy))
    cfg = build(run_config)
    enforce(check_paths(cfg, policy, keys))
    return cfg


__all__ = ["CLIENT_KEYS", "DENY_ENV", "PATH_KEYS", "PLUGINS_ENV", "READ_KEYS", "ROOTS_ENV",
           "WRITE_KEYS", "Policy", "admit", "check_paths", "check_plugins", "default_output_dir", "enforce",
           "own_run_policy", "parse_plugins", "parse_roots", "plugin_names", "policy_from_env", "resolve",
           "within"]
