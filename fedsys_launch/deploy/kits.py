"""Kits: what the operator of a federation across hosts keeps, and what each site gets.

The operator makes a *server kit* once, on the server host (``fedsys deploy server-kit``)::

    DIR/kit.json        the server's host names, addresses and ports
    DIR/ca/ca.key       the CA's key: nothing reads it, keep it offline (ca/KEEP-OFFLINE)
    DIR/certs/          ca.crt, server.pem/.key (SANs: the names and addresses),
                        superexec.secret (deploy/make-certs.sh)
    DIR/server.env      the server role's settings (sites' address and port, certificates)
    DIR/firewall.txt    the lines that open the sites' port, and only it
    DIR/cli/config.toml the flwr CLI's connection to the SuperLink's loopback port
    DIR/proxy/nginx.conf the sites' port: the Fleet API only (fedsys_launch/deploy/proxy.py)
    DIR/start.sh        the server role as processes: SuperLink on loopback, the proxy,
                        the server's SuperExec (the flags of ``fedsys deploy up``)

A site makes its own key pair and SuperExec secret (``fedsys deploy site-key``,
deploy/node-keys.sh) and sends only its ``.pub``; ``fedsys deploy add-site`` registers
it with the SuperLink (``flwr supernode register``) and writes the *site kit*
``DIR/sites/NAME/``: ``ca.crt``, ``site.env`` (the server's address, the node config),
``site.json``, the ``.pub`` and ``start.sh``, one command that starts the site's
SuperNode and SuperExec with the key that never left the site.  ``fedsys deploy
remove-site`` unregisters the node (``flwr supernode unregister``) and marks the kit
revoked.  Validation and rendering are pure functions; the CLI is in
:mod:`fedsys_launch.commands.deploy_cli`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from fedsys_launch.deploy.errors import DeployError
from fedsys_launch.deploy.flwr_cli import CONNECTION, connection_toml
from fedsys_launch.deploy.local_deployment import SCRIPTS, SERVER_EXEC, SUPERLINK, LocalDeployment
from fedsys_launch.deploy.proxy import (
    ProxyLimits,
    ProxyTLS,
    compose_conf,
    default_max_body,
    nginx_conf,
    write_conf,
)

SITES_PORT, LINK_PORT, RUNTIME_PORT = 9093, 9091, 9094
KIT_FILE, SITE_FILE, REVOKED = "kit.json", "site.json", "REVOKED"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_PUB_MAX = 4096


# ---------------------------------------------------------------------- validation


def site_name(text: str) -> str:
    """A site's name (its key file, kit directory and ``--name`` at registration)."""
    if not _NAME.fullmatch(text):
        raise DeployError(f"site name {text!r}: use 1-63 letters, digits, '.', '_' or '-', "
                          "starting with a letter or digit (no path characters)")
    return text


def host_name(text: str) -> str:
    """A DNS name for the server certificate (RFC 1123; not an address, no wildcard)."""
    labels = text.split(".")
    if (len(text) > 253 or not all(_LABEL.fullmatch(lab) for lab in labels)
            or labels[-1].isdigit()):
        raise DeployError(f"--name {text!r} is not a host name (letters, digits and '-' "
                          "in dot-separated labels, e.g. fl.example.org; addresses go to --address)")
    return text.lower()


def address(text: str) -> str:
    """An IP address the sites reach the server at (not unspecified or multicast)."""
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        raise DeployError(f"--address {text!r} is not an IP address "
                          "(host names go to --name)") from None
    if ip.is_unspecified or ip.is_multicast:
        raise DeployError(f"--address {text}: the sites cannot reach a server there; "
                          "give the address they connect to")
    return str(ip)


def port(n: int, flag: str = "--port") -> int:
    """A TCP port."""
    if not 1 <= n <= 65535:
        raise DeployError(f"{flag} {n} is not a TCP port (1-65535)")
    return n


def public_key(path: Path) -> str:
    """The OpenSSH ECDSA P-384 public key in ``path`` (one line), as Flower registers it."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        with path.open("rb") as fh:
            data = fh.read(_PUB_MAX + 1)
    except OSError as exc:
        raise DeployError(f"{path}: cannot be read ({exc.strerror})") from None
    if b"PRIVATE KEY" in data:
        raise DeployError(f"{path} is a private key: it must never leave its site; make a new "
                          "key pair there (fedsys deploy site-key) and send only its .pub")
    line = data.decode("ascii", "replace").strip()
    try:
        if len(data) > _PUB_MAX or "\n" in line:
            raise ValueError
        key = serialization.load_ssh_public_key(line.encode())
    except (ValueError, UnsupportedAlgorithm):
        raise DeployError(f"{path} is not an OpenSSH public key (send the .pub that "
                          "'fedsys deploy site-key' printed)") from None
    if not (isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp384r1"):
        raise DeployError(f"{path} is not an ECDSA P-384 key (ecdsa-sha2-nistp384): make it "
                          "with 'fedsys deploy site-key'")
    return " ".join(line.split()[:2])


def node_config(partition_id: int | None, num_partitions: int | None, data_dir: str) -> str:
    """The SuperNode's ``--node-config``: partition I of N of a built-in dataset (found in
    ``data_dir`` where given), or the site's own data in ``data_dir``, all of it, with
    ``partition_id`` then only the site's identity (seeds, the server's sampling)."""
    parts = []
    if num_partitions is not None and partition_id is None:
        raise DeployError("--num-partitions needs --partition-id")
    if partition_id is not None and num_partitions is None and not data_dir:
        raise DeployError("give --partition-id and --num-partitions together (or --data-dir: "
                          "the site's own data)")
    if partition_id is not None:
        top = num_partitions if num_partitions is not None else 1 << 31
        if not 0 <= partition_id < top:
            raise DeployError(f"--partition-id {partition_id} must lie in 0..{top - 1}"
                              + (" (--num-partitions)" if num_partitions is not None else ""))
        parts.append(f"partition-id={partition_id}")
    if num_partitions is not None:
        parts.append(f"num-partitions={num_partitions}")
    if data_dir:
        if not data_dir.startswith("/") or any(c in data_dir for c in "'\"\\\n$`"):
            raise DeployError(f"--data-dir {data_dir!r}: give the absolute path of the data at "
                              "the site, without quotes, '$', '`' or '\\'")
        parts.append(f'data-dir="{data_dir}"')
    if not parts:
        raise DeployError("say what the site trains on: --partition-id I --num-partitions N "
                          "(a built-in dataset's split) and/or --data-dir (its own data)")
    return " ".join(parts)


def free_partition_id(root: Path) -> int:
    """The lowest partition-id no registered site of ``root/sites`` holds: the identity of
    a site that brings its own data."""
    taken = set()
    for f in (root / "sites").glob(f"*/{SITE_FILE}"):
        if (f.parent / REVOKED).exists():
            continue
        m = re.search(r"partition-id=(\d+)", json.loads(f.read_text()).get("node-config", ""))
        if m:
            taken.add(int(m.group(1)))
    return next(i for i in range(len(taken) + 1) if i not in taken)


# ---------------------------------------------------------------------- the server kit


@dataclass(frozen=True)
class ServerKit:
    """The server's names, addresses and ports, as ``kit.json`` holds them."""

    root: Path
    names: tuple[str, ...]
    addresses: tuple[str, ...]
    port: int = SITES_PORT
    link_port: int = LINK_PORT
    roots: str = ""

    @property
    def sans(self) -> list[str]:
        """subjectAltName entries of the server certificate (beside localhost, 127.0.0.1)."""
        return [f"DNS:{n}" for n in self.names] + [f"IP:{a}" for a in self.addresses]

    @property
    def site_address(self) -> str:
        """``host:port`` the sites connect to: the first name, else the first address."""
        host = self.names[0] if self.names else self.addresses[0]
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    @property
    def ca_cert(self) -> Path:
        return self.root / "certs" / "ca.crt"

    @property
    def listen(self) -> str:
        """Where the proxy listens: the one address given, else every interface (the
        firewall lines name the addresses)."""
        if len(self.addresses) == 1:
            a = self.addresses[0]
            return f"[{a}]:{self.port}" if ":" in a else f"{a}:{self.port}"
        return f"0.0.0.0:{self.port}"

    def handle(self) -> LocalDeployment:
        """This kit as a deployment directory: the ``flwr`` CLI (``cli/``, the SuperLink's
        loopback port) and the server role's commands (certs/, superlink.db)."""
        return LocalDeployment(self.root, num_nodes=0, tls=True, auth=True, port=self.port,
                               link_port=self.link_port, roots=self.roots)

    def save(self) -> None:
        state = {k: v for k, v in asdict(self).items() if k != "root"}
        _write(self.root / KIT_FILE, json.dumps(state, indent=1) + "\n")

    @classmethod
    def load(cls, root: Path) -> ServerKit:
        try:
            s = json.loads((root / KIT_FILE).read_text())
            return cls(root.resolve(), tuple(s["names"]), tuple(s["addresses"]),
                       int(s["port"]), int(s["link_port"]), str(s.get("roots", "")))
        except (OSError, ValueError, KeyError, TypeError):
            raise DeployError(f"no server kit in {root} (make one with 'fedsys deploy "
                              "server-kit')") from None


def firewall_text(kit: ServerKit, allow_from: list[str]) -> str:
    """The host firewall's lines: the sites' port open on the server's addresses (from
    ``allow_from`` only, where given), a cap on connections per address; nothing else of
    fedsys listens off loopback (the SuperLink: 127.0.0.1)."""
    p = kit.port
    dst = kit.addresses or ("",)
    src = allow_from or [""]
    nft, ipt = [], []
    for d in dst:
        for s in src:
            fam = "ip6" if ":" in (d or s) else "ip"
            nft.append(" ".join(x for x in ("nft add rule inet filter input",
                                            f"{fam} daddr {d}" if d else "",
                                            f"{fam} saddr {s}" if s else "",
                                            f"tcp dport {p} accept") if x))
            tool = "ip6tables" if ":" in (d or s) else "iptables"
            ipt.append(" ".join(x for x in (f"{tool} -A INPUT", f"-d {d}" if d else "",
                                            f"-s {s}" if s else "",
                                            f"-p tcp --dport {p} -j ACCEPT") if x))
    return "\n".join([
        f"# fedsys server {kit.site_address}: the sites' port {p} is the one port to open.",
        "# The SuperLink (Fleet, Control, Runtime APIs) listens on 127.0.0.1:"
        f"{kit.link_port} only; keep the input policy 'drop' for everything else.",
        "# nftables:", *nft, "# or iptables:", *ipt,
        "# at most 64 connections from one address (docs/deployment.md, threat model):",
        f"iptables -I INPUT -p tcp --syn --dport {p} -m connlimit --connlimit-above 64 "
        "-j REJECT --reject-with tcp-reset", ""])


def server_env(kit: ServerKit) -> str:
    """Settings of the server role (``--env-file`` of its compose file)."""
    bind = kit.addresses[0] if len(kit.addresses) == 1 else "0.0.0.0"
    return "\n".join([
        "# fedsys server role, made by 'fedsys deploy server-kit'",
        f"FEDSYS_KIT={kit.root}", f"CERTS_DIR={kit.root / 'certs'}",
        f"SITES_BIND={bind}", f"SUPERLINK_PORT={kit.port}", f"LINK_PORT={kit.link_port}",
        f"SITES_ADDRESS={kit.site_address}",
        f"KIT_UID={os.getuid()}",  # the compose file's `sites` tool writes kits as their owner
        ""])


SERVER_START_SH = """#!/usr/bin/env bash
# Start the server role of this kit: the SuperLink on 127.0.0.1:{link} (Fleet, Control,
# Runtime APIs), the proxy (nginx) on {listen}, forwarding the Fleet API only, and the
# server's SuperExec (runs the ServerApp; runs may write under {roots}).
#   ./start.sh         PYTHON (default: the Python that made the kit), NGINX (default nginx)
# Ctrl-C stops all three.  The firewall: firewall.txt.  Runs: fedsys deploy run CONFIG
#   --superlink 127.0.0.1:{link} --root-certificates {ca}
set -euo pipefail
umask 077
kit="$(cd "$(dirname "$0")" && pwd)"
py="${{PYTHON:-{python}}}"
nginx="${{NGINX:-nginx}}"
command -v "$nginx" >/dev/null || {{ echo "error: nginx is not installed (apt-get install" \\
  "nginx-light): it is the sites' port" >&2; exit 2; }}
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
mkdir -p "$kit/home/superlink" "$kit/home/superexec-server" "$kit/logs"
pids=()
trap 'kill "${{pids[@]}}" 2>/dev/null || true' EXIT INT TERM
(cd "$kit/home/superlink" && FLWR_HOME="$PWD" exec {superlink}) &
pids+=($!)
for _ in $(seq 120); do (exec 3<>/dev/tcp/127.0.0.1/{link}) 2>/dev/null && break; sleep 0.5; done
"$nginx" -e stderr -p "$kit/proxy" -c "$kit/proxy/nginx.conf" -g 'daemon off;' &
pids+=($!)
(cd "$kit/home/superexec-server" && FLWR_HOME="$PWD" {policy} exec {superexec}) &
pids+=($!)
wait -n "${{pids[@]}}"
"""


def server_start_sh(kit: ServerKit) -> str:
    """The server role as processes (:meth:`LocalDeployment.command`'s lines, so the
    flags are those ``fedsys deploy up`` starts), ``$py`` for the interpreter."""
    dep = kit.handle()

    def line(name: str) -> tuple[str, str]:
        args, env = dep.command(name)
        cmd = shlex.join(args[1:]) if args[0] == sys.executable else shlex.join(args)
        return ('"$py" ' + cmd if args[0] == sys.executable else cmd,
                " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())))

    superlink, _ = line(SUPERLINK)
    superexec, policy = line(SERVER_EXEC)
    return SERVER_START_SH.format(link=kit.link_port, listen=kit.listen, roots=kit.roots,
                                  ca=kit.ca_cert, python=shlex.quote(sys.executable),
                                  superlink=superlink, superexec=superexec, policy=policy)


def write_server_proxy(kit: ServerKit) -> Path:
    """``proxy/nginx.conf``: the sites' port on :attr:`ServerKit.listen`, TLS with the
    kit's certificate, the Fleet API only, to the SuperLink's loopback port."""
    work = kit.root / "proxy"
    for sub in ("", "body", "proxy", "fastcgi", "uwsgi", "scgi"):
        _mkdir(work / sub)
    certs = kit.root / "certs"
    return write_conf(work / "nginx.conf", nginx_conf(
        kit.listen, f"127.0.0.1:{kit.link_port}", str(work),
        ProxyTLS(str(certs / "server.pem"), str(certs / "server.key"), str(kit.ca_cert)),
        access_log=str(kit.root / "logs" / "proxy-access.log"),
        limits=ProxyLimits(max_body=default_max_body({})),
        user="root" if os.geteuid() == 0 else None))


def deploy_file(name: str) -> str:
    """The text of ``deploy/NAME`` (the role compose files), or :class:`DeployError`."""
    try:
        return (SCRIPTS / name).read_text()
    except OSError:
        raise DeployError(f"{SCRIPTS / name} not found: run fedsys deploy from a fedsys "
                          "checkout (or an image built from one)") from None


def run_script(name: str, *args: str) -> str:
    """Run ``deploy/NAME`` (make-certs.sh, node-keys.sh) under umask 077; its stdout,
    or :class:`DeployError` with its last error line."""
    script = SCRIPTS / name
    if not script.exists():
        raise DeployError(f"{script} not found: run fedsys deploy from a fedsys checkout")
    proc = subprocess.run(["bash", str(script), *args], capture_output=True, text=True,
                          check=False, umask=0o077)
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        raise DeployError(f"{name}: {lines[-1] if lines else f'exit {proc.returncode}'}")
    return proc.stdout


def make_server_kit(out: Path, names: list[str], addresses: list[str], sites_port: int,
                    link_port: int, allow_from: list[str], roots: str) -> ServerKit:
    """Write the server kit into ``out`` (certificates kept where they still cover the
    names and addresses: deploy/make-certs.sh)."""
    if not names and not addresses:
        raise DeployError("give the server's --name (host name) and/or --address, as the "
                          "sites will reach it")
    if not shutil.which("openssl"):
        raise DeployError("openssl is needed for the CA and the certificate (apt-get install "
                          "openssl)")
    kit = ServerKit(out.resolve(), tuple(host_name(n) for n in names),
                    tuple(address(a) for a in addresses), port(sites_port),
                    port(link_port, "--link-port"), roots)
    if kit.port == kit.link_port:
        raise DeployError(f"--port and --link-port are both {kit.port}: the sites' port "
                          "is the proxy's, the SuperLink's own stays on loopback")
    kit.handle().refuse_roots()
    allow = [str(ipaddress.ip_network(a, strict=False)) for a in _networks(allow_from)]
    _mkdir(kit.root)
    run_script("make-certs.sh", "-d", str(kit.root / "certs"), "-k", str(kit.root / "ca"),
               *kit.sans)
    _write(kit.root / "ca" / "KEEP-OFFLINE", "ca.key signs server certificates; nothing "
           "running reads it. Move it to offline storage; it is needed only to issue a new "
           "server certificate.\n")
    _mkdir(kit.root / "cli")
    _write(kit.root / "cli" / "config.toml",
           connection_toml(f"127.0.0.1:{kit.link_port}", kit.ca_cert))
    _write(kit.root / "server.env", server_env(kit))
    _write(kit.root / "firewall.txt", firewall_text(kit, allow))
    write_server_proxy(kit)
    # the server role in Docker (deploy/server.compose.yml): the proxy's configuration with
    # container paths, read by the image's user
    _write(kit.root / "proxy" / "compose.conf", compose_conf(), 0o644)
    _write(kit.root / "compose.yml", deploy_file("server.compose.yml"), 0o644)
    _mkdir(kit.root / "inbox")
    _mkdir(kit.root / "sites")
    _write(kit.root / "start.sh", server_start_sh(kit), 0o700)
    kit.save()
    return kit


def _networks(given: list[str]) -> list[str]:
    for a in given:
        try:
            ipaddress.ip_network(a, strict=False)
        except ValueError:
            raise DeployError(f"--allow-from {a!r} is not an address or network "
                              "(e.g. 203.0.113.0/24)") from None
    return given


# ---------------------------------------------------------------------- sites


def make_site_key(name: str, out: Path) -> Path:
    """At the site: ``out/keys/NAME`` (private key), ``.pub`` and ``.secret``
    (deploy/node-keys.sh, 0600 but the .pub); returns the ``.pub`` to send."""
    name = site_name(name)
    if not shutil.which("ssh-keygen") or not shutil.which("openssl"):
        raise DeployError("ssh-keygen and openssl are needed (apt-get install "
                          "openssh-client openssl)")
    _mkdir(out)
    _mkdir(out / "keys")
    run_script("node-keys.sh", "-d", str(out / "keys"), name)
    return out / "keys" / f"{name}.pub"


@dataclass(frozen=True)
class Federation:
    """Where sites are registered: a server kit or a ``fedsys deploy`` directory."""

    root: Path
    ca_cert: Path
    site_address: str
    cli: LocalDeployment
    #: the certificate's host name and the address it stands for, where the kit has both
    #: (a site container maps one to the other when its DNS does not)
    server_host: tuple[str, str] | None = None


def site_env(name: str, server: str, node_cfg: str, runtime_port: int = RUNTIME_PORT,
             server_host: tuple[str, str] | None = None) -> str:
    """Settings of the site role (``start.sh`` reads it as data; the ``--env-file`` of
    its ``compose.yml``, deploy/site.compose.yml)."""
    host = [f"SERVER_NAME={server_host[0]}", f"SERVER_IP={server_host[1]}"] if server_host else []
    return "\n".join([
        f"# fedsys site {name}, made by 'fedsys deploy add-site'",
        f"SITE_NAME={name}", f"SUPERLINK_ADDRESS={server}",
        f"NODE_CONFIG={shlex.quote(node_cfg)}", f"RUNTIME_PORT={runtime_port}", *host,
        "COMPOSE_PROFILES=cpu", f"COMPOSE_PROJECT_NAME=fedsys-site-{name.lower()}", ""])


START_SH = """#!/usr/bin/env bash
# Start this site: its SuperNode (to the server in site.env, TLS with ca.crt, the site's
# own key) and its SuperExec (runs the ClientApp).  One command:
#   ./start.sh [KEYDIR]
# KEYDIR holds NAME and NAME.secret from 'fedsys deploy site-key NAME --out DIR'
# (default: ../keys beside this kit, i.e. DIR/keys when the kit is in DIR/kit).
# PYTHON (default python3) must have fedsys installed.  Ctrl-C stops both.
set -euo pipefail
umask 077
kit="$(cd "$(dirname "$0")" && pwd)"
# site.env is read as data, not run as shell: KEY=VALUE lines, a value maybe in '...'
while IFS='=' read -r k v; do
  case "$k" in
    SITE_NAME|SUPERLINK_ADDRESS|NODE_CONFIG|RUNTIME_PORT)
      v="${v#\\'}"; printf -v "$k" '%s' "${v%\\'}" ;;
  esac
done < "$kit/site.env"
case "${SITE_NAME:-}" in ""|*/*|.*) echo "error: $kit/site.env names no site" >&2; exit 2 ;; esac
keys="${1:-${FEDSYS_SITE_KEYS:-$kit/../keys}}"
keys="$(cd "$keys" 2>/dev/null && pwd || echo "$keys")"
if [ -e "$kit/REVOKED" ]; then
  echo "error: this kit was revoked: $(cat "$kit/REVOKED")" >&2; exit 2
fi
for f in "$keys/$SITE_NAME" "$keys/$SITE_NAME.secret"; do
  [ -s "$f" ] || { echo "error: $f is missing: the key and secret that" \\
    "'fedsys deploy site-key $SITE_NAME' made at this site (give their directory)" >&2; exit 2; }
done
py="${PYTHON:-python3}"
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
export FEDSYS_DENY="$keys:$kit" FEDSYS_PLUGINS="${FEDSYS_PLUGINS:-}"
export FLWR_HOME="${FLWR_HOME:-$kit/home}"
mkdir -p "$FLWR_HOME"
"$py" -m fedsys_launch.deploy.supernode --root-certificates "$kit/ca.crt" \\
  --superlink "$SUPERLINK_ADDRESS" --auth-supernode-private-key "$keys/$SITE_NAME" \\
  --superexec-auth-secret-file "$keys/$SITE_NAME.secret" --isolation process \\
  --host 127.0.0.1 --port "$RUNTIME_PORT" --node-config "$NODE_CONFIG" &
node=$!
"$py" -m fedsys_launch.deploy.superexec --insecure \\
  --superexec-auth-secret-file "$keys/$SITE_NAME.secret" \\
  --runtime-api-address "127.0.0.1:$RUNTIME_PORT" &
exe=$!
trap 'kill "$node" "$exe" 2>/dev/null || true' EXIT INT TERM
wait -n "$node" "$exe"
"""


def site_readme(name: str, server: str) -> str:
    return (f"fedsys site kit for {name}: the server is {server}.\n"
            "Copy this directory to the site as DIR/kit, beside DIR/keys that\n"
            f"'fedsys deploy site-key {name} --out DIR' made there, then run:\n\n"
            "    DIR/kit/start.sh\n\n"
            "This kit holds no private key: ca.crt (the server's CA), site.env (the server's\n"
            "address, the node config), site.json, the registered .pub and start.sh.\n")


def _site_dir(fed: Federation, name: str) -> Path:
    return fed.root / "sites" / site_name(name)


def add_site(fed: Federation, pub: Path, name: str, node_cfg: str) -> tuple[Path, int]:
    """Register ``pub`` as site ``name`` (``flwr supernode register``) and write its kit
    ``sites/NAME/``; returns the kit's directory and the node id."""
    key = public_key(pub)
    kit = _site_dir(fed, name)
    if (kit / SITE_FILE).exists() and not (kit / REVOKED).exists():
        raise DeployError(f"site {name} is registered already ({kit}); "
                          f"'fedsys deploy remove-site {name}' first")
    for other in sorted((fed.root / "sites").glob(f"*/{SITE_FILE}")):
        if json.loads(other.read_text()).get("public-key") != key:
            continue
        if (other.parent / REVOKED).exists():  # Flower keeps an unregistered node's key
            raise DeployError(f"{pub} is the key of a removed site ({other.parent.name}): "
                              "the site makes a new key pair (fedsys deploy site-key) to rejoin")
        raise DeployError(f"{pub} is the key of site {other.parent.name} already")
    if not fed.ca_cert.exists():
        raise DeployError(f"{fed.ca_cert} is missing: the federation has no CA (TLS)")
    proc = fed.cli.flwr_cli.call("supernode", "register", str(pub.resolve()), CONNECTION, "--name", name,
                        "--format", "json")
    node_id = _json_answer(proc, "node-id", f"could not register {name}")
    if kit.exists():  # a revoked kit of the same name: kept aside
        kit.rename(kit.with_name(f"{name}.revoked-{time.strftime('%Y%m%dT%H%M%S')}"))
    _mkdir(kit.parent)
    _mkdir(kit)
    _write(kit / "ca.crt", fed.ca_cert.read_text(), 0o644)
    _write(kit / f"{name}.pub", key + "\n", 0o644)
    _write(kit / "site.env", site_env(name, fed.site_address, node_cfg,
                                      server_host=fed.server_host))
    _write(kit / "compose.yml", deploy_file("site.compose.yml"), 0o644)
    _write(kit / SITE_FILE, json.dumps({
        "name": name, "node-id": node_id, "superlink": fed.site_address,
        "node-config": node_cfg, "public-key": key,
        "registered": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}, indent=1) + "\n")
    _write(kit / "start.sh", START_SH, 0o700)
    _write(kit / "README", site_readme(name, fed.site_address))
    return kit, node_id


def remove_site(fed: Federation, name: str) -> int:
    """Unregister site ``name`` (``flwr supernode unregister``: its key is refused from
    then on) and mark its kit revoked; returns the node id."""
    kit = _site_dir(fed, name)
    try:
        info = json.loads((kit / SITE_FILE).read_text())
    except (OSError, ValueError):
        raise DeployError(f"no site {name} in {fed.root / 'sites'}") from None
    if (kit / REVOKED).exists():
        raise DeployError(f"site {name} was removed already: {(kit / REVOKED).read_text().strip()}")
    node_id = int(info["node-id"])
    proc = fed.cli.flwr_cli.call("supernode", "unregister", str(node_id), CONNECTION, "--format", "json")
    if "already deleted" not in proc.stdout + proc.stderr:  # unregistered by hand: so be it
        _json_answer(proc, "node-id", f"could not unregister {name} (node {node_id})")
    _write(kit / REVOKED, f"node {node_id} unregistered "
           f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n")
    return node_id


def _json_answer(proc: subprocess.CompletedProcess[str], field: str, what: str) -> int:
    """``field`` of a ``flwr ... --format json`` answer, or one line saying why not."""
    try:
        data = json.loads(proc.stdout)
        if proc.returncode == 0 and data.get("success", True):
            return int(data[field])
    except (ValueError, KeyError, TypeError, AttributeError):
        data = {}
    said = (data.get("error-message") if isinstance(data, dict) else None) or next(
        (ln for ln in reversed((proc.stdout + proc.stderr).splitlines()) if ln.strip()),
        f"exit {proc.returncode}")
    raise DeployError(f"{what}: {' '.join(str(said).split())}")


# ---------------------------------------------------------------------- files


def _mkdir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)


def _write(path: Path, text: str, mode: int = 0o600) -> None:
    """Write ``text`` to ``path`` with ``mode`` (never wider while it is written)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    tmp.replace(path)
