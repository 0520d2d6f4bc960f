"""Kits (issue 76 item 1): ``fedsys deploy server-kit``, ``site-key``, ``add-site`` and
``remove-site`` as an operator and a site type them, against temporary directories.

Registration and unregistration go through a stand-in for the ``flwr`` CLI
(``LocalDeployment.flwr``) that records what it is asked and answers as Flower's
``--format json`` does; that a real SuperLink refuses a removed site's key is for the
multihost test (issue 76 item 4), which starts the server and the sites from their kits.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509

from fedsys_launch.commands import cli
from fedsys_launch.deploy import kits
from fedsys_launch.deploy.flwr_cli import CONNECTION, FlwrCli
from fedsys_launch.deploy.local_deployment import LocalDeployment

KIT_FILES = {"ca.crt", "site.env", "site.json", "hospital-a.pub", "start.sh", "README",
             "compose.yml"}


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The caller's umask 0: what the kits write must be private all the same."""
    old = os.umask(0)
    yield
    os.umask(old)


@pytest.fixture
def flwr(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """A stand-in for the ``flwr`` CLI: records each call, answers as Flower's JSON does."""
    calls: list[tuple[str, ...]] = []

    def fake(self: FlwrCli, *args: str, timeout: float = 120.0
             ) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        assert (self.home / "config.toml").exists()
        answer = {"success": True, "node-id": 4711}
        return subprocess.CompletedProcess(["flwr", *args], 0, json.dumps(answer), "")

    monkeypatch.setattr(FlwrCli, "call", fake)
    return calls


def fedsys(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = cli.main(["deploy", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


@pytest.fixture
def server(tmp_path: Path, open_umask: None, capsys: pytest.CaptureFixture[str]) -> Path:
    rc, out, err = fedsys(capsys, "server-kit", "--name", "fl.example.org", "--address",
                          "198.51.100.1", "--out", str(tmp_path / "sk"), "--roots",
                          str(tmp_path / "runs"))
    assert rc == 0, err
    assert "keep it offline" in out and "fl.example.org:9093" in out
    return tmp_path / "sk"


@pytest.fixture
def site(tmp_path: Path, open_umask: None, capsys: pytest.CaptureFixture[str]) -> Path:
    rc, out, err = fedsys(capsys, "site-key", "hospital-a", "--out", str(tmp_path / "site"))
    assert rc == 0, err
    pub = tmp_path / "site" / "keys" / "hospital-a.pub"
    assert f"send this file to the operator: {pub}" in out
    return tmp_path / "site"


def test_server_kit_certificate_modes_firewall_and_connection(server: Path) -> None:
    cert = x509.load_pem_x509_certificate((server / "certs" / "server.pem").read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "fl.example.org" in sans.get_values_for_type(x509.DNSName)
    assert "198.51.100.1" in [str(a) for a in sans.get_values_for_type(x509.IPAddress)]
    subprocess.run(["openssl", "verify", "-CAfile", str(server / "certs" / "ca.crt"),
                    str(server / "certs" / "server.pem")], check=True, capture_output=True)
    # the CA's key apart from certs/ (what a server mounts), with its note
    assert not (server / "certs" / "ca.key").exists()
    assert "offline" in (server / "ca" / "KEEP-OFFLINE").read_text()
    for d in (server, server / "ca", server / "certs", server / "cli"):
        assert mode(d) == 0o700, d
    for f in ("ca/ca.key", "certs/server.key", "certs/superexec.secret", "cli/config.toml",
              "server.env", "firewall.txt", "kit.json", "proxy/nginx.conf"):
        assert mode(server / f) == 0o600, f
    fw = (server / "firewall.txt").read_text()
    assert "nft add rule inet filter input ip daddr 198.51.100.1 tcp dport 9093 accept" in fw
    assert "iptables -A INPUT -d 198.51.100.1 -p tcp --dport 9093 -j ACCEPT" in fw
    assert "dport 9091" not in fw  # the SuperLink's own port is never opened
    env = (server / "server.env").read_text()
    assert "SITES_BIND=198.51.100.1" in env and "SUPERLINK_PORT=9093" in env
    conn = tomllib.loads((server / "cli" / "config.toml").read_text())["superlink"]
    assert conn[CONNECTION] == {"address": "127.0.0.1:9091",
                                "root-certificates": str(server / "certs" / "ca.crt")}


def test_the_server_kit_starts_the_server_role(
        server: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``start.sh`` of the server kit: the SuperLink on loopback with TLS, node auth and
    the SuperExec secret, the proxy on the kit's address (nginx reads its configuration),
    the server's SuperExec confined to the roots and denied the kit; stand-ins for python
    and nginx record the commands (the SuperLink's port answered by the test)."""
    conf = server / "proxy" / "nginx.conf"
    text = conf.read_text()
    assert "listen 198.51.100.1:9093 ssl;" in text and "proxy_pass https://127.0.0.1:9091;" in text
    assert f"ssl_certificate {server}/certs/server.pem;" in text
    if shutil.which("nginx"):  # the syntax (binding 198.51.100.1 here fails, as it should)
        (server / "logs").mkdir()
        t = subprocess.run(["nginx", "-t", "-e", "stderr", "-p", str(server / "proxy"),
                            "-c", str(conf)], capture_output=True, text=True)
        assert "syntax is ok" in t.stderr, t.stderr
    with socket.socket() as link:
        link.bind(("127.0.0.1", 0))
        link.listen()
        port = link.getsockname()[1]
        rc, _, err = fedsys(capsys, "server-kit", "--name", "fl.example.org", "--address",
                            "198.51.100.1", "--out", str(server), "--link-port", str(port),
                            "--roots", str(tmp_path / "runs"))
        assert rc == 0, err
        calls = tmp_path / "calls"
        stub = tmp_path / "stub"
        stub.write_text(f'#!/bin/sh\necho "$(env | grep ^FEDSYS_ | sort | tr "\\n" " ")$@" >> {calls}\n'
                        f'for i in $(seq 50); do [ "$(wc -l < {calls})" -ge 3 ] && exit 0; '
                        'sleep 0.1; done\n')
        stub.chmod(0o755)
        run = subprocess.run([str(server / "start.sh")], capture_output=True, text=True,
                             timeout=60, env={**os.environ, "PYTHON": str(stub),
                                              "NGINX": str(stub)})
    assert run.returncode == 0, run.stderr
    lines = calls.read_text().splitlines()
    link_line = next(x for x in lines if "fedsys_launch.deploy.superlink" in x)
    for part in ("--enable-supernode-auth", f"--ssl-certfile {server}/certs/server.pem",
                 f"--host 127.0.0.1 --port {port}", f"--database {server}/superlink.db"):
        assert part in link_line, link_line
    assert any(f"-c {conf}" in x for x in lines)
    sx = next(x for x in lines if "fedsys_launch.deploy.superexec" in x)
    assert f"FEDSYS_DENY={server} FEDSYS_ROOTS={tmp_path / 'runs'} " in sx, sx
    assert f"--runtime-api-address 127.0.0.1:{port}" in sx
    # roots holding the kit are refused, as 'fedsys deploy up' refuses them
    rc, _, err = fedsys(capsys, "server-kit", "--name", "fl.example.org", "--out", str(server),
                        "--roots", str(tmp_path))
    assert rc == 2 and "contains the deployment directory" in err


def test_server_kit_again_keeps_the_certificate_and_allow_from_narrows(
        server: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = (server / "certs" / "server.pem").read_bytes()
    rc, _, err = fedsys(capsys, "server-kit", "--name", "fl.example.org", "--address",
                        "198.51.100.1", "--allow-from", "203.0.113.0/24", "--out", str(server),
                        "--roots", str(server.parent / "runs"))
    assert rc == 0, err
    assert (server / "certs" / "server.pem").read_bytes() == before
    assert ("iptables -A INPUT -d 198.51.100.1 -s 203.0.113.0/24 -p tcp --dport 9093 "
            "-j ACCEPT") in (server / "firewall.txt").read_text()
    # a name the kept certificate does not cover: refused in one line (make-certs.sh)
    rc, _, err = fedsys(capsys, "server-kit", "--name", "other.example.org", "--out", str(server),
                        "--roots", str(server.parent / "runs"))
    assert rc == 2 and "does not cover DNS:other.example.org" in err and err.count("\n") == 1


def test_site_key_is_private_and_the_pub_is_p384(site: Path) -> None:
    keys = site / "keys"
    assert (keys / "hospital-a.pub").read_text().startswith("ecdsa-sha2-nistp384 ")
    assert mode(keys / "hospital-a") == 0o600 and mode(keys / "hospital-a.secret") == 0o600
    assert mode(site) == 0o700 and mode(keys) == 0o700
    assert kits.public_key(keys / "hospital-a.pub").startswith("ecdsa-sha2-nistp384 AAAA")


def test_add_site_registers_and_writes_a_kit_without_the_private_key(
        server: Path, site: Path, flwr: list[tuple[str, ...]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    pub = site / "keys" / "hospital-a.pub"
    rc, out, err = fedsys(capsys, "add-site", str(pub), "--kit", str(server), "--partition-id",
                          "0", "--num-partitions", "2", "--data-dir", "/srv/fmnist")
    assert rc == 0, err
    assert flwr == [("supernode", "register", str(pub.resolve()), CONNECTION, "--name",
                     "hospital-a", "--format", "json")]
    kit = server / "sites" / "hospital-a"
    assert "node 4711" in out and str(kit) in out
    assert {p.name for p in kit.iterdir()} == KIT_FILES
    private = [(site / "keys" / n).read_bytes().strip() for n in ("hospital-a", "hospital-a.secret")]
    for f in kit.iterdir():
        data = f.read_bytes()
        assert b"PRIVATE" not in data and not any(p in data for p in private), f
    assert mode(kit) == 0o700 and mode(kit / "site.env") == 0o600 and mode(kit / "start.sh") == 0o700
    assert (kit / "ca.crt").read_bytes() == (server / "certs" / "ca.crt").read_bytes()
    info = json.loads((kit / "site.json").read_text())
    assert info["node-id"] == 4711 and info["superlink"] == "fl.example.org:9093"
    cfg = 'partition-id=0 num-partitions=2 data-dir="/srv/fmnist"'
    assert info["node-config"] == cfg

    # the site: the kit beside its keys, one command; a stand-in python records the commands
    shutil.copytree(kit, site / "kit")
    calls = tmp_path / "calls"
    stub = tmp_path / "python"
    # each stand-in ends once both have said what they were started with
    stub.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nfor i in $(seq 50); do\n'
                    f'  [ "$(wc -l < {calls})" -ge 2 ] && exit 0; sleep 0.1\ndone\n')
    stub.chmod(0o755)
    run = subprocess.run([str(site / "kit" / "start.sh")], capture_output=True, text=True,
                         env={**os.environ, "PYTHON": str(stub)}, timeout=30)
    assert run.returncode == 0, run.stderr
    lines = calls.read_text().splitlines()
    node = next(line for line in lines if "fedsys_launch.deploy.supernode" in line)
    keys = (site / "keys").resolve()
    for part in ("--superlink fl.example.org:9093", f"--auth-supernode-private-key {keys}/hospital-a",
                 f"--superexec-auth-secret-file {keys}/hospital-a.secret",
                 f"--node-config {cfg}", f"--root-certificates {(site / 'kit').resolve()}/ca.crt"):
        assert part in node, node
    assert any("fedsys_launch.deploy.superexec --insecure" in line for line in lines)
    # without its keys the site is told what is missing
    run = subprocess.run([str(site / "kit" / "start.sh"), str(tmp_path / "nowhere")],
                         capture_output=True, text=True, env={**os.environ, "PYTHON": str(stub)})
    assert run.returncode == 2 and "hospital-a is missing" in run.stderr

    # the same name again, or the same key under another name: refused, nothing registered
    for argv, says in ((["--partition-id", "1", "--num-partitions", "2"], "registered already"),
                       (["--name", "clinic-b", "--data-dir", "/d"], "key of site hospital-a")):
        rc, _, err = fedsys(capsys, "add-site", str(pub), "--kit", str(server), *argv)
        assert rc == 2 and says in err and err.count("\n") == 1, err
    assert len(flwr) == 1


def test_remove_site_unregisters_and_revokes_the_kit(
        server: Path, site: Path, flwr: list[tuple[str, ...]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    pub = site / "keys" / "hospital-a.pub"
    assert fedsys(capsys, "add-site", str(pub), "--kit", str(server), "--data-dir", "/d")[0] == 0
    rc, out, err = fedsys(capsys, "remove-site", "hospital-a", "--kit", str(server))
    assert rc == 0, err
    assert flwr[-1] == ("supernode", "unregister", "4711", CONNECTION, "--format", "json")
    kit = server / "sites" / "hospital-a"
    assert "node 4711 unregistered" in (kit / kits.REVOKED).read_text()
    assert "its key is refused" in out
    run = subprocess.run([str(kit / "start.sh")], capture_output=True, text=True)
    assert run.returncode == 2 and "revoked" in run.stderr
    rc, _, err = fedsys(capsys, "remove-site", "hospital-a", "--kit", str(server))
    assert rc == 2 and "removed already" in err
    # the removed key again: refused here (Flower keeps an unregistered node's key)
    rc, _, err = fedsys(capsys, "add-site", str(pub), "--kit", str(server), "--data-dir", "/d")
    assert rc == 2 and "key of a removed site (hospital-a)" in err and "new key pair" in err
    # a new key pair at the site: a new kit, the revoked one kept aside
    assert fedsys(capsys, "site-key", "hospital-a", "--out", str(tmp_path / "new"))[0] == 0
    new = tmp_path / "new" / "keys" / "hospital-a.pub"
    assert fedsys(capsys, "add-site", str(new), "--kit", str(server), "--data-dir", "/d")[0] == 0
    assert not (kit / kits.REVOKED).exists()
    assert len(list((server / "sites").glob("hospital-a.revoked-*"))) == 1


def test_a_refusal_of_flwr_is_one_line_and_writes_no_kit(
        server: Path, site: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    answer = subprocess.CompletedProcess(["flwr"], 1, json.dumps(
        {"success": False, "error-message": "Public key already in use.\nsee the log"}), "")
    monkeypatch.setattr(FlwrCli, "call", lambda self, *a, **k: answer)
    rc, _, err = fedsys(capsys, "add-site", str(site / "keys" / "hospital-a.pub"), "--kit",
                        str(server), "--data-dir", "/d")
    assert rc == 2 and err == ("error: could not register hospital-a: Public key already in "
                               "use. see the log\n")
    assert not (server / "sites" / "hospital-a").exists()


def test_remove_site_after_flwr_unregister_by_hand_and_a_refusal(
        server: Path, site: Path, flwr: list[tuple[str, ...]], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A node unregistered with ``flwr`` already is marked revoked all the same; a SuperLink
    that cannot be reached leaves the kit as it was, saying why in one line."""
    assert fedsys(capsys, "add-site", str(site / "keys" / "hospital-a.pub"), "--kit",
                  str(server), "--data-dir", "/d")[0] == 0
    down = subprocess.CompletedProcess(["flwr"], 1, "", "Connection to the SuperLink is "
                                       "unavailable.\n")
    monkeypatch.setattr(FlwrCli, "call", lambda self, *a, **k: down)
    rc, _, err = fedsys(capsys, "remove-site", "hospital-a", "--kit", str(server))
    assert rc == 2 and err == ("error: could not unregister hospital-a (node 4711): "
                               "Connection to the SuperLink is unavailable.\n")
    assert not (server / "sites" / "hospital-a" / kits.REVOKED).exists()
    gone = subprocess.CompletedProcess(["flwr"], 1, json.dumps({
        "success": False, "error-message": "Node 4711 already deleted, not found or "
        "unauthorized deletion attempt."}), "")
    monkeypatch.setattr(FlwrCli, "call", lambda self, *a, **k: gone)
    assert fedsys(capsys, "remove-site", "hospital-a", "--kit", str(server))[0] == 0
    assert (server / "sites" / "hospital-a" / kits.REVOKED).exists()


def test_a_fedsys_deploy_directory_registers_too(
        server: Path, site: Path, tmp_path: Path, flwr: list[tuple[str, ...]],
        capsys: pytest.CaptureFixture[str]) -> None:
    dep = LocalDeployment(tmp_path / "dep", num_nodes=1, tls=True, auth=True, port=9999,
                          link_port=9998, node_ports=[1])
    (dep.root / "certs").mkdir(parents=True)
    (dep.root / "cli").mkdir()
    (dep.root / "cli" / "config.toml").write_text("")
    shutil.copy(server / "certs" / "ca.crt", dep.ca_cert)
    dep.save()
    rc, _, err = fedsys(capsys, "add-site", str(site / "keys" / "hospital-a.pub"), "--dir",
                        str(dep.root), "--data-dir", "/d")
    assert rc == 0, err
    env = (dep.root / "sites" / "hospital-a" / "site.env").read_text()
    assert "SUPERLINK_ADDRESS=127.0.0.1:9999" in env and len(flwr) == 1


def _keygen(path: Path, *args: str) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-N", "", "-f", str(path), *args], check=True)
    return path.with_name(path.name + ".pub")


@pytest.mark.parametrize("argv, says", [
    (["server-kit", "--name", "bad name"], "--name 'bad name' is not a host name"),
    (["server-kit", "--name=-x.example.org"], "is not a host name"),
    (["server-kit", "--name", "a..b"], "is not a host name"),
    (["server-kit", "--name", "198.51.100.1"], "addresses go to --address"),
    (["server-kit", "--address", "fl.example.org"], "host names go to --name"),
    (["server-kit", "--address", "300.1.1.1"], "is not an IP address"),
    (["server-kit", "--address", "0.0.0.0"], "give the address they connect to"),
    (["server-kit"], "give the server's --name"),
    (["server-kit", "--name", "fl.example.org", "--port", "0"], "--port 0 is not a TCP port"),
    (["server-kit", "--name", "fl.example.org", "--port", "9091"], "are both 9091"),
    (["server-kit", "--name", "fl.example.org", "--allow-from", "x"], "not an address or network"),
    (["site-key", "../evil"], "site name '../evil'"),
    (["site-key", "a/b"], "no path characters"),
    (["site-key", ".hidden"], "site name '.hidden'"),
    (["remove-site", "nobody"], "no site nobody"),
])
def test_bad_input_is_refused_in_one_line(
        argv: list[str], says: str, server: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    if argv[0] == "remove-site":
        argv = [*argv, "--kit", str(server)]
    elif argv[0] == "server-kit":
        argv = [*argv, "--out", str(tmp_path / "other")]
    rc, _, err = fedsys(capsys, *argv)
    assert rc == 2 and says in err and err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err and not (tmp_path / "other").exists()


def test_a_pub_that_is_not_a_sites_p384_key_is_refused(
        server: Path, site: Path, tmp_path: Path, flwr: list[tuple[str, ...]],
        capsys: pytest.CaptureFixture[str]) -> None:
    garbage = tmp_path / "garbage.pub"
    garbage.write_text("hello\n")
    cases = [
        (_keygen(tmp_path / "ed", "-t", "ed25519"), "is not an ECDSA P-384 key"),
        (_keygen(tmp_path / "p256", "-t", "ecdsa", "-b", "256"), "is not an ECDSA P-384 key"),
        (site / "keys" / "hospital-a", "is a private key: it must never leave its site"),
        (garbage, "is not an OpenSSH public key"),
        (tmp_path / "none.pub", "cannot be read (No such file or directory)"),
    ]
    for pub, says in cases:
        rc, _, err = fedsys(capsys, "add-site", str(pub), "--kit", str(server), "--name", "s",
                            "--data-dir", "/d")
        assert rc == 2 and says in err and err.count("\n") == 1, (pub, err)
    pub = str(site / "keys" / "hospital-a.pub")
    for argv, says in ((["--partition-id", "2", "--num-partitions", "2"], "must lie in 0..1"),
                       (["--partition-id", "0"], "together"),
                       ([], "say what the site trains on"),
                       (["--data-dir", "data"], "absolute path"),
                       (["--data-dir", "/d'; rm -rf /"], "without quotes"),
                       (["--name", "../x", "--data-dir", "/d"], "no path characters"),
                       (["--kit", str(tmp_path / "nokit"), "--data-dir", "/d"], "no server kit")):
        kit_args = [] if "--kit" in argv else ["--kit", str(server)]
        rc, _, err = fedsys(capsys, "add-site", pub, *kit_args, *argv)
        assert rc == 2 and says in err and err.count("\n") == 1, (argv, err)
    assert flwr == [] and not any((server / "sites").iterdir())


def test_help_shows_the_kit_commands() -> None:
    import sys

    out = subprocess.run([sys.executable, "-m", "fedsys_launch", "deploy", "--help"],
                         capture_output=True, text=True, check=True).stdout
    for action in ("server-kit", "site-key", "add-site", "remove-site"):
        assert action in out


def test_an_address_only_kit_and_ipv6(tmp_path: Path) -> None:
    """Pure rendering: without a name the sites use the address, an IPv6 one in brackets,
    and its firewall lines are ip6tables' and nft's ip6."""
    kit = kits.ServerKit(tmp_path, (), (kits.address("2001:db8::1"),), 9443)
    assert kit.site_address == "[2001:db8::1]:9443" and kit.sans == ["IP:2001:db8::1"]
    fw = kits.firewall_text(kit, [])
    assert "nft add rule inet filter input ip6 daddr 2001:db8::1 tcp dport 9443 accept" in fw
    assert "ip6tables -A INPUT -d 2001:db8::1 -p tcp --dport 9443 -j ACCEPT" in fw
    assert "SITES_BIND=2001:db8::1" in kits.server_env(kit)
    assert kits.host_name("FL.Example.org") == "fl.example.org"
    assert kits.node_config(1, 3, "") == "partition-id=1 num-partitions=3"
    assert kits.site_env("a", "h:1", 'data-dir="/d"').splitlines()[3] == \
        "NODE_CONFIG='data-dir=\"/d\"'"


def test_a_site_with_its_own_data_gets_a_free_partition_id(tmp_path: Path) -> None:
    """``add-site --data-dir`` alone: the site's own data, all of it (no num-partitions);
    its partition-id the lowest no registered site holds, a removed site's freed."""
    assert kits.node_config(0, None, "/d") == 'partition-id=0 data-dir="/d"'
    assert kits.node_config(1, 2, "/d") == 'partition-id=1 num-partitions=2 data-dir="/d"'
    with pytest.raises(kits.DeployError, match="needs --partition-id"):
        kits.node_config(None, 2, "/d")
    assert kits.free_partition_id(tmp_path) == 0
    for name, cfg, revoked in (("a", "partition-id=0 num-partitions=2", False),
                               ("b", 'partition-id=1 data-dir="/x"', True),
                               ("c", 'partition-id=2 data-dir="/y"', False)):
        (tmp_path / "sites" / name).mkdir(parents=True)
        (tmp_path / "sites" / name / kits.SITE_FILE).write_text(
            json.dumps({"name": name, "node-id": 1, "node-config": cfg}))
        if revoked:
            (tmp_path / "sites" / name / kits.REVOKED).write_text("gone\n")
    assert kits.free_partition_id(tmp_path) == 1
