"""What a submitted run config may name in a deployment (:mod:`fedsys.confine`): paths
under the operator's roots, plugins from the operator's allow-list, refusals naming the
key; and the apps apply it everywhere, fedsys's own simulation under the policy of its
own config."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

from fedsys import confine
from fedsys import protocol as proto
from fedsys.config import ConfigError, RunConfig
from fedsys.data import DEBIAN_FMNIST
from fedsys_launch.apps import client_app, server_app
from fedsys_launch.config_schema import build, from_run_config, schema

BASE = {"dataset": "synthetic", "model": "mlp", "num-clients": 2, "clients-per-round": 2,
        "partition": "iid", "strategy": "fedavg"}


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """An allowed root and a directory outside it; this process's policy: that root, no
    plugins, no FEDSYS_DATA, the working directory ``tmp_path/cwd``."""
    root, outside, cwd = tmp_path / "root", tmp_path / "outside", tmp_path / "cwd"
    for d in (root, outside, cwd):
        d.mkdir()
    monkeypatch.setenv(confine.ROOTS_ENV, str(root))
    monkeypatch.delenv(confine.PLUGINS_ENV, raising=False)
    monkeypatch.delenv(confine.DENY_ENV, raising=False)
    monkeypatch.delenv("FEDSYS_DATA", raising=False)
    monkeypatch.chdir(cwd)
    return {"root": root, "outside": outside, "cwd": cwd}


def _policy(root: Path, plugins: str = "") -> confine.Policy:
    return confine.policy_from_env({confine.ROOTS_ENV: str(root),
                                    confine.PLUGINS_ENV: plugins}, root)


def _cfg(**kw: object) -> RunConfig:
    return build({**BASE, **kw})


# ------------------------------------------------------------------ paths


@pytest.mark.parametrize("key", confine.PATH_KEYS)
def test_each_path_key_outside_the_roots_is_refused_naming_the_key(key, dirs):
    refusals = confine.check_paths(_cfg(**{key: str(dirs["outside"] / "x")}),
                                   _policy(dirs["root"]))
    assert len(refusals) == 1 and refusals[0].startswith(f"config key '{key}': "), refusals
    assert str(dirs["root"]) in refusals[0] and "FEDSYS_ROOTS" in refusals[0]
    with pytest.raises(ConfigError, match=f"config key '{key}'") as exc:
        confine.enforce(refusals)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("key", confine.PATH_KEYS)
def test_each_path_key_inside_the_roots_is_allowed(key, dirs):
    cfg = _cfg(**{key: str(dirs["root"] / "a" / "b"), "output-dir": str(dirs["root"])})
    assert confine.check_paths(cfg, _policy(dirs["root"])) == []


def test_dotdot_and_symlink_escapes_are_refused(dirs):
    root, outside = dirs["root"], dirs["outside"]
    (root / "link").symlink_to(outside, target_is_directory=True)
    policy = _policy(root)
    for value in (f"{root}/../outside", f"{root}/a/../../outside/runs", f"{root}/link",
                  f"{root}/link/runs", f"{root}/missing/../../outside"):
        refusals = confine.check_paths(_cfg(**{"output-dir": value}), policy)
        assert refusals and refusals[0].startswith("config key 'output-dir'"), value
    # a symlink inside the root to the root's own subdirectory stays inside
    (root / "runs").mkdir()
    (root / "inner").symlink_to(root / "runs", target_is_directory=True)
    assert confine.check_paths(_cfg(**{"output-dir": f"{root}/inner"}), policy) == []


def test_relative_and_home_paths_resolve_as_the_apps_use_them(dirs, monkeypatch):
    root = dirs["root"]
    policy = confine.policy_from_env({confine.ROOTS_ENV: str(root)}, root)
    assert confine.check_paths(_cfg(**{"output-dir": "runs"}), policy) == []  # <root>/runs
    assert confine.check_paths(_cfg(**{"output-dir": "../outside"}), policy)
    monkeypatch.setenv("HOME", str(root))
    assert confine.check_paths(_cfg(**{"output-dir": "~/runs"}), policy) == []
    monkeypatch.setenv("HOME", str(dirs["outside"]))
    assert confine.check_paths(_cfg(**{"output-dir": "~/runs"}), policy)


def test_a_strategy_variant_cannot_name_a_path_or_a_directory_outside(dirs):
    root, outside = dirs["root"], dirs["outside"]
    policy = _policy(root)
    cda = _cfg(**{"output-dir": str(root),
                  "strategy": f"fedavg,fedcda[fedcda.cache-dir={outside}] as cda"})
    refusals = confine.check_paths(cda, policy)
    assert len(refusals) == 1, refusals
    assert refusals[0].startswith("config key 'fedcda.cache-dir' (strategy 'cda'): ")
    # a label made of a variant's overrides may hold '/': its results must stay inside too
    escape = "a" + "/.." * 8 + str(outside)
    label = _cfg(**{"output-dir": str(root), "strategy": f"fedavg[init-reinit={escape}]"})
    refusals = confine.check_paths(label, policy)
    assert len(refusals) == 1 and refusals[0].startswith("config key 'strategy': label "), refusals


def test_empty_paths_name_nothing_and_the_keys_a_site_reads_are_its_own(dirs):
    policy = _policy(dirs["root"])
    assert confine.check_paths(_cfg(**{"output-dir": str(dirs["root"])}), policy) == []
    far = _cfg(**{"output-dir": str(dirs["outside"]), "data-dir": str(dirs["outside"])})
    refused = confine.check_paths(far, policy, confine.CLIENT_KEYS)
    assert len(refused) == 1 and refused[0].startswith("config key 'data-dir'")  # not output-dir
    assert confine.check_paths(far, policy.reading(str(dirs["outside"])), confine.CLIENT_KEYS) == []


def test_every_key_that_names_a_file_or_directory_is_confined():
    """A new key whose name or help says it is a path fails here until it is listed."""
    words = ("dir", "path", "file", "from", "out")
    not_paths = {"name", "about", "plugins", "strategy", "seeds", "init-reinit",
                 "pretrain.labels", "chain.order-list"}
    looks = {o.key for o in schema().options if o.type is str and not o.choices
             and (any(w in o.key for w in words) or "directory" in o.help.lower())}
    assert looks - not_paths == set(confine.PATH_KEYS), looks - not_paths


# ------------------------------------------------------------------ the deployment

#: What a run config named in issue 75 (item 5), one place of the deployment per path key.
INTO_DEPLOYMENT = {"output-dir": "keys", "fedcda.cache-dir": "certs", "pretrain.out": "cli/m.pt",
                   "init-from": "ca/ca.key", "branch-from": "superlink.db", "data-dir": "keys"}


@pytest.fixture
def deployment(dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> Path:
    """A deployment directory inside the allowed root, as ``runs/deploy`` lay inside the
    default root ``./runs``, with ``$FEDSYS_DATA`` holding it too, and this process's
    ``FEDSYS_DENY`` naming it, as ``fedsys deploy`` sets it for the apps' SuperExecs."""
    dep = dirs["root"] / "deploy"
    for sub in ("keys", "certs", "ca", "cli"):
        (dep / sub).mkdir(parents=True)
    (dep / "ca" / "ca.key").write_text("not for runs\n")
    (dep / "superlink.db").write_text("")
    monkeypatch.setenv(confine.DENY_ENV, str(dep))
    monkeypatch.setenv("FEDSYS_DATA", str(dirs["root"]))
    return dep


@pytest.mark.parametrize("key", confine.PATH_KEYS)
def test_each_path_key_into_the_deployment_is_refused_whatever_the_roots(
        key, deployment, dirs, monkeypatch, caplog):
    assert set(INTO_DEPLOYMENT) == set(confine.PATH_KEYS)
    value = str(deployment / INTO_DEPLOYMENT[key])
    ctx = _context({**BASE, "output-dir": str(dirs["root"]), key: value})
    says = (f"config key '{key}': '{value}' is inside the deployment ({deployment}: its keys, "
            f"certificates, database and logs; FEDSYS_DENY), which no run may name")
    with pytest.raises(ConfigError) as exc:
        server_app.run_config(ctx)
    assert str(exc.value) == says
    assert f"run refused: {says}" in caplog.text
    # a file that is not there is refused alike: the refusal tells nothing of what exists
    missing = _context({**BASE, "output-dir": str(dirs["root"]),
                        key: str(deployment / "ca" / "no-such.key")})
    with pytest.raises(ConfigError, match="is inside the deployment"):
        server_app.run_config(missing)
    # the roots (and $FEDSYS_DATA) hold the deployment: FEDSYS_DENY alone refuses it
    monkeypatch.delenv(confine.DENY_ENV)
    assert server_app.run_config(ctx).get(key) == value


def test_a_way_round_into_the_deployment_is_refused(deployment, dirs):
    """A symlink in the root, dot segments, the run directory ``<output-dir>/<name>``
    and a variant's results label: each resolves into the deployment and is refused."""
    root = dirs["root"]
    (root / "link").symlink_to(deployment / "certs", target_is_directory=True)
    policy = confine.policy_from_env(os.environ)
    for value in (f"{root}/link", f"{root}/link/runs", f"{root}/x/../deploy/keys"):
        refusals = confine.check_paths(_cfg(**{"output-dir": value}), policy)
        assert len(refusals) == 1 and "is inside the deployment" in refusals[0], value
        assert refusals[0].startswith("config key 'output-dir': "), refusals
    named = confine.check_paths(_cfg(**{"output-dir": str(root), "name": "deploy"}), policy)
    assert named == [f"config key 'name' (with output-dir): '{deployment}' is inside the "
                     f"deployment ({deployment}: its keys, certificates, database and logs; "
                     f"FEDSYS_DENY), which no run may name"]
    escape = "a" + "/.." * 12 + str(deployment / "keys")
    label = _cfg(**{"output-dir": str(root / "runs"), "strategy": f"fedavg[init-reinit={escape}]"})
    refusals = confine.check_paths(label, policy)
    assert len(refusals) == 1 and refusals[0].startswith("config key 'strategy' (its results): ")
    assert "is inside the deployment" in refusals[0], refusals
    # beside the deployment, in the same root, is allowed
    assert confine.check_paths(_cfg(**{"output-dir": str(root), "name": "deploy2"}), policy) == []


def test_a_site_refuses_a_data_dir_in_the_deployment_its_own_too(deployment, dirs):
    node = {proto.PARTITION_ID: 0, proto.NUM_PARTITIONS: 2}
    ctx = _context({**BASE, "data-dir": str(deployment / "keys")}, node)
    with pytest.raises(ConfigError, match=r"^config key 'data-dir': .* is inside the deployment"):
        client_app.app(proto.query_message(100), ctx)
    ctx = _context(BASE, {**node, "data-dir": str(deployment)})  # node config: the same
    with pytest.raises(ConfigError, match=r"^config key 'data-dir': .* is inside the deployment"):
        client_app.app(proto.query_message(100), ctx)


@pytest.mark.parametrize("text", ["relative/dir", f"/abs{os.pathsep}"])
def test_a_bad_deny_variable_is_one_line_naming_it(text, tmp_path):
    with pytest.raises(ConfigError, match=r"^environment variable FEDSYS_DENY: entry "):
        confine.policy_from_env({confine.DENY_ENV: text}, tmp_path)
    assert confine.policy_from_env({confine.DENY_ENV: ""}, tmp_path).deny == ()


# ------------------------------------------------------------------ plugins


@pytest.fixture
def probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A plugin module on ``sys.path`` that is not imported yet."""
    name = "fedsys_confine_probe_plugin"
    (tmp_path / f"{name}.py").write_text('"""Registers nothing."""\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def test_plugins_are_refused_unless_allow_listed_and_never_imported_then(dirs, probe):
    rc = {**BASE, "output-dir": str(dirs["root"]), "plugins": f"{probe}, other.mod"}
    with pytest.raises(ConfigError) as exc:
        confine.admit(rc, _policy(dirs["root"], probe), from_run_config)
    msg = str(exc.value)
    assert msg.startswith("config key 'plugins': 'other.mod' not allowed here (allowed: "
                          f"{probe}; FEDSYS_PLUGINS)"), msg
    assert probe not in sys.modules
    with pytest.raises(ConfigError, match=r"config key 'plugins': .* \(allowed: none"):
        confine.admit({**rc, "plugins": probe}, _policy(dirs["root"]), from_run_config)
    assert probe not in sys.modules
    cfg = confine.admit({**rc, "plugins": probe}, _policy(dirs["root"], f"{probe},x"),
                        from_run_config)
    assert cfg.plugins == probe and probe in sys.modules


def test_plugin_names_read_a_string_or_a_list():
    assert confine.plugin_names({"plugins": " a.b, ,c "}) == ["a.b", "c"]
    assert confine.plugin_names({"plugins": ["a", "b"]}) == ["a", "b"]
    assert confine.plugin_names({}) == []


# ------------------------------------------------------------------ the environment


@pytest.mark.parametrize("text, says", [
    ("", "is set but empty"), ("  ", "is set but empty"),
    ("relative/dir", "entry 'relative/dir' is not an absolute directory"),
    (f"/srv/a{os.pathsep}{os.pathsep}/srv/b", "entry '' is not an absolute directory"),
    ("~/runs", "entry '~/runs' is not an absolute directory"),
])
def test_a_bad_roots_variable_is_one_line_naming_it(text, says, tmp_path):
    with pytest.raises(ConfigError) as exc:
        confine.policy_from_env({confine.ROOTS_ENV: text}, tmp_path)
    msg = str(exc.value)
    assert msg.startswith("environment variable FEDSYS_ROOTS") and says in msg, msg
    assert "\n" not in msg


def test_a_bad_plugins_variable_is_one_line_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"^environment variable FEDSYS_PLUGINS: 'a b' is not a "
                                          r"module name"):
        confine.policy_from_env({confine.PLUGINS_ENV: "good.mod,a b"}, tmp_path)
    assert confine.policy_from_env({confine.PLUGINS_ENV: " a.b , c "}, tmp_path).plugins == \
        frozenset({"a.b", "c"})


def test_with_nothing_set_the_policy_fails_closed(tmp_path):
    policy = confine.policy_from_env({}, tmp_path)
    assert policy.roots == ((tmp_path / "runs").resolve(),)
    assert policy.plugins == frozenset()
    assert "FEDSYS_ROOTS unset" in policy.source
    with_default = from_run_config({**BASE})  # output-dir: runs, relative to the app
    assert confine.check_paths(with_default, policy) == []
    assert confine.check_paths(with_default.replace(**{"output-dir": "/tmp"}), policy)
    assert confine.check_paths(with_default.replace(**{"output-dir": str(tmp_path)}), policy)
    assert confine.check_plugins(["anything"], policy)
    # the data directories fedsys reads anyway may be named for reading, not for writing
    assert confine.check_paths(with_default.replace(**{"data-dir": str(DEBIAN_FMNIST)}),
                               policy) == []
    refused = confine.check_paths(with_default.replace(**{"output-dir": str(DEBIAN_FMNIST)}),
                                  policy)
    assert refused and "may write here" in refused[0]
    data = tmp_path / "data"
    with_data = confine.policy_from_env({"FEDSYS_DATA": str(data)}, tmp_path)
    assert confine.check_paths(with_default.replace(**{"init-from": str(data / "m.pt")}),
                               with_data) == []
    assert confine.check_paths(with_default.replace(**{"fedcda.cache-dir": str(data)}), with_data)


# ------------------------------------------------------------------ the apps


def _context(run_config: dict[str, object], node_config: dict[str, object] | None = None
             ) -> Context:
    return Context(run_id=1, node_id=100, node_config={**(node_config or {})},
                   state=RecordDict(), run_config=dict(build(run_config).to_dict()))


def test_the_server_app_refuses_before_it_runs_and_logs_the_key(dirs, caplog):
    ctx = _context({**BASE, "output-dir": str(dirs["outside"])})
    with pytest.raises(ConfigError, match=r"^config key 'output-dir': "):
        server_app.app(None, ctx)  # type: ignore[arg-type]  # refused before the grid is used
    assert "run refused: config key 'output-dir'" in caplog.text
    assert not any(dirs["outside"].iterdir())  # nothing written
    ok = _context({**BASE, "output-dir": str(dirs["root"])})
    assert server_app.run_config(ok).output_dir == str(dirs["root"])
    # fedsys's own simulation admits it under the policy of the run's own config
    own = confine.own_run_policy(from_run_config(ctx.run_config))
    assert server_app.run_config(ctx, own).output_dir == str(dirs["outside"])
    other = _context({**BASE, "output-dir": str(dirs["outside"].parent / "other")})
    with pytest.raises(ConfigError, match=r"^config key 'output-dir': "):
        server_app.run_config(other, own)  # another config's paths are not the run's own


def test_the_server_app_refuses_a_plugin_before_importing_it(dirs, probe):
    ctx = _context({**BASE, "output-dir": str(dirs["root"])})
    ctx.run_config["plugins"] = probe
    with pytest.raises(ConfigError, match=r"^config key 'plugins'"):
        server_app.run_config(ctx)
    assert probe not in sys.modules


def test_the_client_app_refuses_a_data_dir_outside_its_roots(dirs):
    outside = dirs["outside"]
    node = {proto.PARTITION_ID: 0, proto.NUM_PARTITIONS: 2}
    ctx = _context({**BASE, "data-dir": str(outside), "output-dir": "/anywhere/the/server"},
                   node)
    with pytest.raises(ConfigError, match=r"^config key 'data-dir': ") as exc:
        client_app.app(proto.query_message(100), ctx)
    assert "output-dir" not in str(exc.value)  # a site checks what it reads
    # the site's own node-config data-dir is the operator's: it wins and is allowed
    site = dirs["cwd"] / "site-data"
    site.mkdir()
    ctx = _context({**BASE, "data-dir": str(outside)}, {**node, "data-dir": str(site)})
    assert not client_app.app(proto.query_message(100), ctx).has_error()


def test_the_client_app_refuses_a_plugin_and_the_own_run_app_admits_it(dirs, probe):
    node = {proto.PARTITION_ID: 0, proto.NUM_PARTITIONS: 2}
    ctx = _context(BASE, node)
    ctx.run_config["plugins"] = probe
    with pytest.raises(ConfigError, match=r"^config key 'plugins'"):
        client_app.app(proto.query_message(100), ctx)
    assert probe not in sys.modules
    own = client_app.make_app(confine.own_run_policy(from_run_config(ctx.run_config)))
    assert not own(proto.query_message(100), ctx).has_error()
    assert probe in sys.modules
    sys.modules.pop(probe)
    with pytest.raises(ConfigError, match=r"^config key 'plugins'"):  # the module's app: still
        client_app.app(proto.query_message(100), ctx)


def test_the_own_run_policy_admits_its_config_and_no_other(dirs, probe):
    outside = dirs["outside"]
    cfg = _cfg(**{"output-dir": str(outside / "runs"), "data-dir": str(outside / "data"),
                  "plugins": probe, "strategy": f"fedavg,fedcda[fedcda.cache-dir={outside}/c]"})
    policy = confine.own_run_policy(cfg)
    assert confine.check_paths(cfg, policy) == []
    assert confine.check_plugins(confine.plugin_names(cfg.to_dict()), policy) == []
    assert confine.check_plugins(["another"], policy)
    for key in ("output-dir", "data-dir", "init-from", "fedcda.cache-dir"):
        refused = confine.check_paths(cfg.replace(**{key: str(dirs["root"] / "x")}), policy)
        assert refused and refused[0].startswith(f"config key '{key}'"), key


def test_an_app_built_with_a_policy_survives_pickling_to_an_actor_and_loads_by_no_name(dirs):
    """Ray hands the ClientApp to its actors with cloudpickle; Flower loads a deployment's
    ClientApp by ``module:attribute``: the one there admits under the environment's policy."""
    from flwr.clientapp import ClientApp
    from flwr.serverapp import ServerApp

    ctx = _context({**BASE, "data-dir": str(dirs["outside"])},
                   {proto.PARTITION_ID: 0, proto.NUM_PARTITIONS: 2})
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    own = client_app.make_app(confine.own_run_policy(from_run_config(ctx.run_config)))
    again = cloudpickle.loads(cloudpickle.dumps(own))
    assert not again(proto.query_message(100), ctx).has_error()
    with pytest.raises(ConfigError, match=r"^config key 'data-dir'"):
        client_app.app(proto.query_message(100), ctx)
    apps = [v for v in vars(client_app).values() if isinstance(v, ClientApp)]
    assert apps == [client_app.app] and client_app.app.admission.policy is None
    assert [v for v in vars(server_app).values() if isinstance(v, ServerApp)] == [server_app.app]


@pytest.mark.slow
def test_fedsys_run_is_not_confined(tmp_path, monkeypatch, own_ray_cluster):
    """``fedsys run`` under an environment's policy that would refuse its every path: the
    user is the operator, both apps (the clients in Ray actors, which inherit this
    environment) admit the config under the policy of its own and the run finishes."""
    from fedsys import metrics
    from fedsys_launch.commands.cli import main

    data = tmp_path / "data"
    data.mkdir()
    monkeypatch.setenv(confine.ROOTS_ENV, str(tmp_path / "elsewhere"))
    monkeypatch.delenv(confine.PLUGINS_ENV, raising=False)
    monkeypatch.delenv("FEDSYS_DATA", raising=False)
    code = main(["run", "--set", "dataset=synthetic", "--set", "model=mlp",
                 "--set", "num-clients=2", "--set", "clients-per-round=2",
                 "--set", "num-server-rounds=1", "--set", "strategy=fedavg",
                 "--set", "local-steps=2", "--set", f"data-dir={data}",
                 "--set", f"output-dir={tmp_path / 'runs'}", "--set", "name=open"])
    assert code == 0
    recs = metrics.read_jsonl(tmp_path / "runs" / "open" / "fedavg" / "metrics.jsonl")
    assert [r["round"] for r in recs] == [0, 1] and recs[1]["clients-ok"] == 2
