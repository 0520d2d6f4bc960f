"""``fedsys deploy`` without a Flower runtime: commands, state, scripts, errors."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from fedsys_launch.commands import cli
from fedsys_launch.deploy.errors import DeployError
from fedsys_launch.deploy.flwr_cli import CONNECTION, connection_toml, run_config_toml
from fedsys_launch.deploy.local_deployment import (
    PROXY,
    SCRIPTS,
    SERVER_EXEC,
    STATE_FILE,
    SUPERLINK,
    Component,
    LocalDeployment,
    node_exec_name,
    node_name,
)
from fedsys_launch.process.supervision import alive, session_nice, start_time


def test_run_config_toml_is_what_flower_reads() -> None:
    cfg = {"name": 'a "quoted" name', "output-dir": "/tmp/x y", "fedcross.alpha": 0.5,
           "num-server-rounds": 3, "resume": True, "strategy": "fedavg,fedcda[fedcda.memory=2]"}
    data = tomllib.loads(run_config_toml(cfg))
    from flwr.common.config import flatten_dict

    assert flatten_dict(data) == cfg


def test_secure_commands_carry_tls_and_auth(tmp_path: Path) -> None:
    dep = LocalDeployment(tmp_path, num_nodes=2, tls=True, auth=True, port=9999,
                          link_port=9998, node_ports=[1001, 1002], data_dir="/data/site",
                          gpus="3,5")
    link, _ = dep.command(SUPERLINK)
    assert "--insecure" not in link
    for flag in ("--ssl-certfile", "--ssl-keyfile", "--ssl-ca-certfile",
                 "--enable-supernode-auth", "--superexec-auth-secret-file"):
        assert flag in link
    assert link[link.index("--isolation") + 1] == "process"
    assert link[link.index("--host") + 1] == "127.0.0.1"
    assert link[link.index("--port") + 1] == "9998"  # the SuperLink: loopback, behind the proxy
    proxy, _ = dep.command(PROXY)
    assert proxy[proxy.index("-c") + 1] == str(tmp_path / "proxy" / "nginx.conf")
    sx, _ = dep.command(SERVER_EXEC)
    assert sx[sx.index("--root-certificates") + 1] == str(dep.ca_cert)
    assert sx[sx.index("--runtime-api-address") + 1] == "127.0.0.1:9998"
    assert sx[sx.index("--superexec-auth-secret-file") + 1] == str(dep.secret_file)
    node, _ = dep.command(node_name(1))
    assert node[node.index("--auth-supernode-private-key") + 1] == str(dep.key_file(1))
    assert node[node.index("--superlink") + 1] == "127.0.0.1:9999"  # the sites' port
    assert node[node.index("--superexec-auth-secret-file") + 1] == str(dep.site_secret(1))
    assert node[node.index("--node-config") + 1] == (
        'partition-id=1 num-partitions=2 data-dir="/data/site"')
    assert node[node.index("--port") + 1] == "1002"
    ex, env = dep.command(node_exec_name(1))
    assert ex[ex.index("--runtime-api-address") + 1] == "127.0.0.1:1002"
    assert ex[ex.index("--superexec-auth-secret-file") + 1] == str(dep.site_secret(1))
    deny = {"FEDSYS_DENY": str(tmp_path.resolve())}  # the apps name nothing in the deployment
    assert env == {"CUDA_VISIBLE_DEVICES": "5", **deny}
    assert dep.command(node_exec_name(0))[1] == {"CUDA_VISIBLE_DEVICES": "3", **deny}
    assert dep.command(SERVER_EXEC)[1] == deny


def test_insecure_commands(tmp_path: Path) -> None:
    dep = LocalDeployment(tmp_path, num_nodes=1, node_ports=[1001])
    assert dep.names() == [SUPERLINK, PROXY, SERVER_EXEC, node_name(0), node_exec_name(0)]
    for name in (SUPERLINK, SERVER_EXEC, node_name(0), node_exec_name(0)):
        args, env = dep.command(name)
        assert "--insecure" in args
        assert env == ({"FEDSYS_DENY": str(tmp_path.resolve())} if "superexec" in name else {})
        assert not any(a.startswith("--ssl") or "supernode-auth" in a or "private-key" in a
                       for a in args)
    # a site's Runtime API and its SuperExec share a secret with or without --auth
    for name in (node_name(0), node_exec_name(0)):
        args, _ = dep.command(name)
        assert args[args.index("--superexec-auth-secret-file") + 1] == str(dep.site_secret(0))
    assert "--superexec-auth-secret-file" not in dep.command(SUPERLINK)[0]


def test_state_round_trip_and_pid_identity(tmp_path: Path) -> None:
    dep = LocalDeployment(tmp_path, num_nodes=1, tls=True, port=1234, link_port=1235,
                          node_ports=[4321], node_nice=7)
    me = os.getpid()
    dep.components = {SUPERLINK: Component(["x"], me, start_time(me)),
                      SERVER_EXEC: Component(["y"], me, start_time(me) + 1)}
    dep.save()
    back = LocalDeployment.load(tmp_path)
    assert (back.port, back.link_port, back.tls, back.node_ports, back.node_nice) == (
        1234, 1235, True, [4321], 7)
    assert (tmp_path / STATE_FILE).stat().st_mode & 0o077 == 0
    assert back.is_running(SUPERLINK)
    assert not back.is_running(SERVER_EXEC)  # same PID, other start time: a reused PID
    assert not back.is_running(node_name(0))


def test_down_stops_components_and_their_descendants(tmp_path: Path) -> None:
    dep = LocalDeployment(tmp_path, num_nodes=1)
    p = subprocess.Popen(["bash", "-c", "sleep 300 & sleep 300 & wait"], start_new_session=True)
    dep.procs[SUPERLINK] = p
    dep.components[SUPERLINK] = Component(["bash"], p.pid, start_time(p.pid))
    dep.save()
    end = time.monotonic() + 10
    while len(pids := LocalDeployment.load(tmp_path).all_pids()) < 3:
        assert time.monotonic() < end
        time.sleep(0.05)
    assert LocalDeployment.load(tmp_path).down() == 3  # found again from deploy.json
    assert not [q for q in pids if alive(q)]
    p.wait(timeout=10)
    assert not LocalDeployment.load(tmp_path).is_running(SUPERLINK)


def test_node_niceness_is_set_on_the_session_too(tmp_path: Path) -> None:
    p = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        session_nice(p.pid, 13)
        group = Path(f"/proc/{p.pid}/autogroup")
        if group.exists():  # Linux autogroup: sessions share the CPU first
            assert group.read_text().split()[-1] == "13"
    finally:
        p.kill()
        p.wait()


@pytest.mark.parametrize("bad", ["-1", "20", "x"])
def test_node_nice_outside_0_to_19_is_refused(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["deploy", "up", "--node-nice", bad])
    assert e.value.code == 2 and "not a niceness from 0 to 19" in capsys.readouterr().err


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[LocalDeployment]:
    """``fedsys deploy up`` as a newcomer types it, in ``tmp_path`` with no FEDSYS_ROOTS:
    the deployments ``up`` would start (recorded; nothing is started)."""
    ups: list[LocalDeployment] = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FEDSYS_ROOTS", raising=False)
    monkeypatch.setattr(LocalDeployment, "up", lambda self, wait=0.0: ups.append(self))
    return ups


def test_up_with_no_flags_is_secure_and_outside_the_default_roots(
        started: list[LocalDeployment], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 75: ``fedsys deploy up`` alone turns on TLS and node authentication, and its
    deployment directory is not inside the default roots, so it is not refused."""
    assert cli.main(["deploy", "up"]) == 0
    out = capsys.readouterr()
    (dep,) = started
    assert dep.tls and dep.auth
    assert dep.root == (tmp_path / "deployment").resolve()
    assert dep.roots == str((tmp_path / "runs").resolve())
    assert "(TLS, node auth)" in out.out and "WARNING" not in out.err, out
    link, _ = dep.command(SUPERLINK)
    assert "--insecure" not in link and "--enable-supernode-auth" in link
    # --tls and --auth, as older scripts give them, change nothing
    assert cli.main(["deploy", "up", "--tls", "--auth"]) == 0
    assert (started[1].tls, started[1].auth) == (True, True)


def test_insecure_is_asked_for_and_says_what_it_opens(
        started: list[LocalDeployment], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["deploy", "up", "--insecure"]) == 0
    out = capsys.readouterr()
    (dep,) = started
    assert not dep.tls and not dep.auth
    assert "--insecure" in dep.command(SUPERLINK)[0]
    warning = [line for line in out.err.splitlines() if "WARNING" in line]
    assert len(warning) == 1, out.err
    for says in (f"sites' port {dep.address} speaks plain HTTP", "register a SuperNode",
                 "receive the model", "no SuperExec secret"):
        assert says in warning[0], warning
    assert "(insecure)" in out.out
    assert cli.main(["deploy", "up", "--insecure", "--tls"]) == 2
    assert "error: --insecure turns TLS and node authentication off: drop --tls" in \
        capsys.readouterr().err
    assert len(started) == 1


def test_up_refuses_roots_that_hold_the_deployment(
        started: list[LocalDeployment], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 75: the default before (``--dir runs/deploy`` in the default root ``./runs``),
    ``--roots`` or ``$FEDSYS_ROOTS`` holding ``--dir``, and a root inside ``--dir``: each is
    refused before anything starts, naming both and what to do."""
    here = tmp_path.resolve()
    for args, env in (
            (["--dir", "runs/deploy"], None),
            (["--roots", str(here)], None),
            ([], f"/elsewhere{os.pathsep}{here}"),
            (["--dir", "d", "--roots", str(here / "d" / "runs")], None)):
        if env is not None:
            monkeypatch.setenv("FEDSYS_ROOTS", env)
        assert cli.main(["deploy", "up", "--insecure", *args]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("error: the root ") and "the deployment directory" in err, err
        assert "choose a --dir outside the roots" in err and err.count("\n") == 1, err
        monkeypatch.delenv("FEDSYS_ROOTS", raising=False)
    assert started == []
    with pytest.raises(DeployError, match="give the roots"):  # the app's default is inside
        LocalDeployment(tmp_path / "x").refuse_roots()


def test_a_deployment_under_the_old_default_is_pointed_to(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "deploy").mkdir(parents=True)
    LocalDeployment(tmp_path / "runs" / "deploy", num_nodes=1, node_ports=[1]).save()
    assert cli.main(["deploy", "status"]) == 2
    assert "--dir runs/deploy finds that one" in capsys.readouterr().err


@pytest.mark.skipif(not (shutil.which("openssl") and shutil.which("ssh-keygen")),
                    reason="needs openssl and ssh-keygen")
def test_certificate_and_key_scripts(tmp_path: Path) -> None:
    certs, keys = tmp_path / "certs", tmp_path / "keys"
    made = subprocess.run(["bash", str(SCRIPTS / "make-certs.sh"), "-d", str(certs),
                           "DNS:fl.example.org", "IP:203.0.113.7"], check=True,
                          capture_output=True, text=True, env={**os.environ}, umask=0)
    text = subprocess.run(["openssl", "x509", "-in", str(certs / "server.pem"), "-noout",
                           "-text"], check=True, capture_output=True, text=True).stdout
    for san in ("DNS:localhost", "IP Address:127.0.0.1", "DNS:fl.example.org",
                "IP Address:203.0.113.7"):
        assert san in text
    subprocess.run(["openssl", "verify", "-CAfile", str(certs / "ca.crt"),
                    str(certs / "server.pem")], check=True, capture_output=True)
    # the CA's key is not beside what the SuperLink mounts: DIR/../ca by default
    assert not (certs / "ca.key").exists() and (tmp_path / "ca" / "ca.key").exists()
    assert "keep it offline" in made.stdout
    for path in (certs / "superexec.secret", certs / "server.key", tmp_path / "ca" / "ca.key",
                 certs, tmp_path / "ca"):  # directories too, under the caller's umask 0
        assert path.stat().st_mode & 0o077 == 0, (path, oct(path.stat().st_mode))
    # the CA outlives the server certificate (CA_DAYS 3650, CERT_DAYS 365)
    def days(pem: Path) -> float:
        end = subprocess.run(["openssl", "x509", "-in", str(pem), "-noout", "-enddate"],
                             check=True, capture_output=True, text=True).stdout
        stamp = end.strip().split("=", 1)[1]
        return (time.mktime(time.strptime(stamp, "%b %d %H:%M:%S %Y %Z")) - time.time()) / 86400
    assert 3640 < days(certs / "ca.crt") and 360 < days(certs / "server.pem") < 370
    before = (certs / "server.pem").read_bytes()
    subprocess.run(["bash", str(SCRIPTS / "make-certs.sh"), "-d", str(certs)], check=True,
                   capture_output=True)
    assert (certs / "server.pem").read_bytes() == before  # kept without -f
    # kept, but not covering a SAN asked for now: refused, naming it (it said OK before)
    other = subprocess.run(["bash", str(SCRIPTS / "make-certs.sh"), "-d", str(certs),
                            "DNS:superlink"], capture_output=True, text=True)
    assert other.returncode == 1 and "does not cover DNS:superlink" in other.stderr
    assert (certs / "server.pem").read_bytes() == before
    # a certificate about to expire is not kept silently either
    short = tmp_path / "short"
    subprocess.run(["bash", str(SCRIPTS / "make-certs.sh"), "-d", str(short)], check=True,
                   capture_output=True, env={**os.environ, "CERT_DAYS": "5"})
    again = subprocess.run(["bash", str(SCRIPTS / "make-certs.sh"), "-d", str(short)],
                           capture_output=True, text=True)
    assert again.returncode == 1 and "expires within 30 days" in again.stderr
    subprocess.run(["bash", str(SCRIPTS / "node-keys.sh"), "-d", str(keys), "site-a", "site-b"],
                   check=True, capture_output=True)
    assert (keys / "site-a.pub").read_text().startswith("ecdsa-sha2-nistp384 ")
    for private in (keys / "site-b", keys / "site-a.secret", keys / "site-b.secret"):
        assert private.stat().st_mode & 0o077 == 0
    assert len((keys / "site-a.secret").read_text().strip()) == 64
    assert (keys / "site-a.secret").read_text() != (keys / "site-b.secret").read_text()
    # the operator's registration holds the .pub alone: nothing is made beside it
    pubs = tmp_path / "pubs"
    pubs.mkdir()
    shutil.copy(keys / "site-a.pub", pubs)
    subprocess.run(["bash", str(SCRIPTS / "node-keys.sh"), "-d", str(pubs), "site-a"],
                   check=True, capture_output=True)
    assert sorted(p.name for p in pubs.iterdir()) == ["site-a.pub"]
    bad = subprocess.run(["bash", str(SCRIPTS / "node-keys.sh"), "-d", str(keys), "a b"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "bad SuperNode name" in bad.stderr


def test_node_keys_reads_a_registered_key_from_a_long_answer(tmp_path: Path) -> None:
    """``flwr supernode register`` refusing a key it holds ("already in use") is a key
    registered before, however long its answer (a ``printf | grep -q`` under pipefail
    could read it as a failure: grep left at the first line and printf's broken pipe
    failed the pipeline); another refusal is an error naming the site."""
    keys = tmp_path / "keys"
    fake = tmp_path / "flwr"
    for said, code, expect in (("Public key already in use.", 0, "site-a was registered before"),
                               ("Permission denied.", 1, "could not register site-a")):
        fake.write_text("#!/bin/sh\n"
                        f"echo '[code: 23] {said}'\n"
                        "i=0; while [ $i -lt 30000 ]; do echo 'a line of the answer, long enough'; "
                        "i=$((i+1)); done\nexit 1\n")
        fake.chmod(0o755)
        got = subprocess.run(["bash", str(SCRIPTS / "node-keys.sh"), "-d", str(keys),
                              "-r", "fedsys-local", "site-a"], capture_output=True, text=True,
                             env={**os.environ, "FLWR_BIN": str(fake)})
        assert got.returncode == code, got.stderr[-300:]
        assert expect in (got.stdout + got.stderr)


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["deploy", "status", "--dir", str(tmp_path)]) == 2
    assert "error: no deployment in" in capsys.readouterr().err
    assert cli.main(["deploy", "up", "--nodes", "0", "--dir", str(tmp_path)]) == 2
    assert "error: --nodes must be at least 1" in capsys.readouterr().err
    cfg = tmp_path / "c.yaml"
    cfg.write_text("strategy: fedavg\ndataset: synthetic\nmodel: mlp\n")
    assert cli.main(["deploy", "run", str(cfg), "--superlink", "127.0.0.1:1",
                     "--dir", str(tmp_path)]) == 2
    assert "--root-certificates" in capsys.readouterr().err
    remote = ["deploy", "run", str(cfg), "--superlink", "127.0.0.1:1", "--dir", str(tmp_path)]
    assert cli.main([*remote, "--root-certificates", str(tmp_path / "none.crt")]) == 2
    assert "none.crt: cannot be read (No such file or directory)" in capsys.readouterr().err
    assert cli.main([*remote, "--root-certificates", str(cfg)]) == 2
    assert "c.yaml: not a PEM certificate" in capsys.readouterr().err
    assert cli.main(["deploy", "run", str(cfg), "--dir", str(tmp_path)]) == 2
    assert "no deployment in" in capsys.readouterr().err
    assert cli.main(["deploy", "run", str(cfg), "--set", "nope=1", "--dir", str(tmp_path)]) == 2
    assert "unknown config key 'nope'" in capsys.readouterr().err


def test_deploy_help_lists_the_actions() -> None:
    out = subprocess.run([sys.executable, "-m", "fedsys_launch", "deploy", "--help"],
                         capture_output=True, text=True, check=True).stdout
    for action in ("up", "run", "status", "down"):
        assert action in out


def test_connection_toml_escapes_what_it_writes(tmp_path: Path) -> None:
    ca = tmp_path / 'a "quoted" \\dir' / "ca.crt"
    tls = tomllib.loads(connection_toml("127.0.0.1:9093", ca))["superlink"]
    assert tls == {"default": CONNECTION, CONNECTION: {"address": "127.0.0.1:9093",
                                                       "root-certificates": str(ca)}}
    plain = tomllib.loads(connection_toml("[::1]:9093", None))["superlink"]
    assert plain[CONNECTION] == {"address": "[::1]:9093", "insecure": True}


def test_the_staged_app_builds_the_same_fab_from_a_few_files(tmp_path: Path) -> None:
    """``flwr run`` is given a copy of the FAB's files (``staged_app``), not a checkout with
    its virtual environments: the FAB is byte-identical to the one built from the checkout,
    gitignored and non-matching files stay out, and the copy is made once per content."""
    from flwr.cli.build import build_fab_from_disk

    from fedsys_launch.deploy.fab_staging import staged_app

    app = tmp_path / "app"
    (app / "pkg" / "sub").mkdir(parents=True)
    (app / "pkg" / "__init__.py").write_text("X = 1\n")
    (app / "pkg" / "sub" / "m.py").write_text("Y = 2\n")
    (app / "pkg" / "gen.py").write_text("GENERATED = 1\n")
    (app / ".gitignore").write_text("pkg/gen.py\n")
    for junk in (".venv/lib/site.py", "docs/results.md", "runs/r/metrics.jsonl", "tests/t.py"):
        (app / junk).parent.mkdir(parents=True, exist_ok=True)
        (app / junk).write_text("junk\n")
    (app / "pyproject.toml").write_text(
        '[project]\nname = "demo"\nversion = "1.0.0"\ndependencies = []\n\n'
        '[tool.flwr.app]\npublisher = "me"\nfab-include = ["pkg/**/*.py"]\n\n'
        '[tool.flwr.app.components]\nserverapp = "pkg:server"\nclientapp = "pkg:client"\n')
    staged = staged_app(app, tmp_path / "cli")
    assert staged.parent == tmp_path / "cli"
    assert sorted(p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file()) \
        == [".gitignore", "pkg/__init__.py", "pkg/gen.py", "pkg/sub/m.py", "pyproject.toml"]
    assert build_fab_from_disk(staged) == build_fab_from_disk(app)
    assert staged_app(app, tmp_path / "cli") == staged  # the same content: the same copy
    (app / "pkg" / "sub" / "m.py").write_text("Y = 3\n")
    assert staged_app(app, tmp_path / "cli") != staged
    # without fab-include patterns (Flower's app template) the app directory goes as it is
    (app / "pyproject.toml").write_text('[project]\nname = "demo"\n')
    assert staged_app(app, tmp_path / "cli2") == app


def test_up_is_not_reported_when_a_superexec_dies_as_its_node_comes_online(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every node online, then a SuperExec exits within the settle time: ``wait_online``
    (the end of ``fedsys deploy up``) names it with its log instead of reporting up."""
    dep = LocalDeployment(tmp_path, num_nodes=1, node_ports=[1001])
    dep.components = dict.fromkeys(dep.names())  # type: ignore[arg-type]
    dep.log_file(node_exec_name(0)).parent.mkdir(parents=True)
    dep.log_file(node_exec_name(0)).write_text("flower-superexec: bad secret\n")
    listed: list[bool] = []  # the SuperExec dies once its node is listed online

    def online() -> list[dict[str, object]]:
        listed.append(True)
        return [{"node-id": 1, "status": "online"}]

    monkeypatch.setattr(dep, "is_running", lambda name: name != node_exec_name(0) or not listed)
    monkeypatch.setattr(dep.flwr_cli, "nodes", online)
    with pytest.raises(DeployError, match=f"(?s){node_exec_name(0)} exited.*bad secret"):
        dep.wait_online(1, timeout=5, settle=0.01)
    steady = LocalDeployment(tmp_path, num_nodes=1, node_ports=[1001])
    steady.components = dict.fromkeys(steady.names())  # type: ignore[arg-type]
    monkeypatch.setattr(steady, "is_running", lambda name: True)
    monkeypatch.setattr(steady.flwr_cli, "nodes", lambda: [{"node-id": 1, "status": "online"}])
    assert steady.wait_online(1, timeout=5, settle=0.01) == [{"node-id": 1, "status": "online"}]


def test_compose_is_secure_and_its_apps_name_nothing_of_the_deployment() -> None:
    """Issue 75 in ``docker-compose.yml``: TLS and node authentication with no flag to
    add; every service that runs apps (a SuperExec) has ``FEDSYS_DENY`` covering each
    certificate, key and secret mounted into it, and the run tool's state where it lies
    in the server's roots."""
    import yaml

    services = yaml.safe_load((SCRIPTS.parent / "docker-compose.yml").read_text())["services"]
    link = services["superlink"]["command"].split()
    assert "--insecure" not in link and "--enable-supernode-auth" in link
    assert "--ssl-certfile" in link and "--superexec-auth-secret-file" in link
    for name in ("supernode-0", "supernode-1"):
        node = services[name]["command"].split()
        assert "--root-certificates" in node and "--auth-supernode-private-key" in node
    apps = {n: s for n, s in services.items()
            if "fedsys_launch.deploy.superexec" in str(s.get("command", ""))}
    assert len(apps) == 5, sorted(apps)  # the server's and each site's, cpu and gpu
    for name, svc in apps.items():
        deny = [Path(d) for d in svc.get("environment", {}).get("FEDSYS_DENY", "").split(":")
                if d]
        mounted = [Path(v.split(":")[1]) for v in svc["volumes"]]
        secret = [m for m in mounted if m.parts[1] in ("certs", "keys")]
        assert secret and all(any(m.is_relative_to(d) for d in deny) for m in secret), (name, deny)
    run = services["run"]["entrypoint"]
    run_dir = Path(run[run.index("--dir") + 1])
    server = services["superexec-server"]["environment"]
    if run_dir.is_relative_to(server["FEDSYS_ROOTS"]):
        assert any(run_dir.is_relative_to(d) for d in server["FEDSYS_DENY"].split(":"))
