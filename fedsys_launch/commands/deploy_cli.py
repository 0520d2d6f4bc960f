"""``fedsys deploy``: a real Flower deployment as processes on 127.0.0.1.

``up`` starts a SuperLink, its SuperExec and N SuperNodes with their SuperExecs
(the topology of ``docker-compose.yml``), with TLS and node authentication unless
``--insecure``, ``run`` submits the fedsys app with a YAML experiment and prints the
results table, ``status`` shows what runs, ``down`` stops everything.  State lives in
``--dir`` (default ``deployment``, outside the default roots ``./runs``), so later
invocations find the deployment.  ``run --superlink HOST:PORT`` submits to any
SuperLink instead, e.g. the docker-compose one.  For a server and sites on other hosts,
``server-kit``, ``site-key``, ``add-site`` and ``remove-site`` make and revoke the kits
(:mod:`fedsys_launch.deploy.kits`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from fedsys_launch import config_schema
from fedsys_launch.deploy import kits, site_status
from fedsys_launch.deploy.errors import DeployError, RunNotStartedError
from fedsys_launch.deploy.flwr_cli import CONNECTION, connection_toml, run_config_toml
from fedsys_launch.deploy.local_deployment import STATE_FILE, SUPERLINK, LocalDeployment
from fedsys_launch.deploy.proxy import parse_size
from fedsys_launch.process.run_lock import busy, in_use

DEFAULT_DIR = "deployment"
#: ``fedsys deploy server-kit --out`` and ``add-site --kit`` by default
KIT_DIR = "server-kit"
#: The default ``--dir`` before issue 75, inside the default roots ``./runs``.
OLD_DEFAULT_DIR = "runs/deploy"
APP_DIR = Path(__file__).resolve().parents[2]

EPILOG = """examples:
  fedsys deploy up --nodes 3                       SuperLink + 3 SuperNodes, HTTPS, node keys
  fedsys deploy run configs/smoke.yaml --set num-clients=3 --set clients-per-round=3
  fedsys deploy status                             processes, SuperNodes, runs
  fedsys deploy down                               stop everything
  fedsys deploy run configs/smoke.yaml --superlink 127.0.0.1:9093 \\
      --root-certificates deploy/certs/ca.crt      submit to the docker-compose SuperLink

sites on other hosts (kits):
  fedsys deploy server-kit --name fl.example.org --address 198.51.100.1 --out server-kit
                                                   at the server: CA, certificate, firewall
  fedsys deploy site-key hospital-a --out site     at the site: key pair + secret; send the .pub
  fedsys deploy add-site hospital-a.pub --kit server-kit --partition-id 0 --num-partitions 2
                                                   register it; its kit: server-kit/sites/hospital-a
  fedsys deploy remove-site hospital-a --kit server-kit    unregister it: its key is refused
"""


def _niceness(text: str) -> int:
    """``--node-nice``: an integer 0-19 (a negative niceness needs privileges)."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if not 0 <= n <= 19:
        raise argparse.ArgumentTypeError(f"{text!r} is not a niceness from 0 to 19")
    return n


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_parser(sub: Any) -> None:
    """Register ``fedsys deploy`` and its actions on the top-level subparsers."""
    d = sub.add_parser(
        "deploy", help="a real Flower deployment: processes on 127.0.0.1, or kits for a "
        "server and sites on other hosts",
        description=__doc__.split("\n\n")[1].replace("\n", " ") if __doc__ else None,
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dsub = d.add_subparsers(dest="deploy_cmd", required=True, metavar="ACTION")

    def with_dir(p: argparse.ArgumentParser) -> None:
        p.add_argument("--dir", default=DEFAULT_DIR,
                       help=f"deployment directory: state, logs, certificates (default "
                       f"{DEFAULT_DIR})")

    up = dsub.add_parser("up", help="start SuperLink, SuperExecs and SuperNodes")
    up.add_argument("--nodes", type=int, default=2, help="SuperNodes (default 2)")
    up.add_argument("--tls", action="store_true",
                    help="HTTPS with a private CA (certificates in DIR/certs): the default")
    up.add_argument("--auth", action="store_true",
                    help="only registered SuperNode keys (DIR/keys) may connect; "
                    "SuperExec secret: the default")
    up.add_argument("--insecure", action="store_true",
                    help="no TLS and no node authentication: the sites' port speaks plain "
                    "HTTP and anyone who reaches it may register a SuperNode, join the runs "
                    "and receive the model (for a throw-away trial only)")
    up.add_argument("--port", type=int, default=0,
                    help="the sites' port: a reverse proxy that forwards Flower's Fleet API "
                    "and nothing else (default: a free one)")
    up.add_argument("--link-port", type=int, default=0,
                    help="the SuperLink's own port, on loopback only: Control and Runtime "
                    "APIs, for the operator's flwr CLI and the server's SuperExec "
                    "(default: a free one)")
    up.add_argument("--data-dir", default="", help="data-dir in every SuperNode's node config")
    up.add_argument("--roots", metavar="DIR[:DIR...]", default=None,
                    help="where a submitted run config's paths (output-dir, branch-from, "
                    "init-from, fedcda.cache-dir, ...) may lie on the server: FEDSYS_ROOTS of "
                    "the server's SuperExec (default: $FEDSYS_ROOTS, else ./runs); none may "
                    "contain --dir, and nothing in --dir may be named whatever the roots")
    up.add_argument("--plugins", metavar="MODULES", default="",
                    help="modules a submitted run's 'plugins' may name, comma-separated: "
                    "FEDSYS_PLUGINS of every SuperExec (default: none)")
    up.add_argument("--gpus", default="",
                    help="CUDA device ids dealt round robin to the SuperNodes, e.g. 0,1")
    up.add_argument("--node-nice", type=_niceness, default=0, metavar="N",
                    help="niceness 0-19 of the SuperNodes and the ClientApps they start "
                    "(default 0): on a machine given to the deployment with far more nodes "
                    "than cores, 19 leaves the SuperLink the CPU it needs to answer them; "
                    "niced nodes wait for every other busy process")
    up.add_argument("--max-body", type=_size, default=0, metavar="SIZE",
                    help="the sites' port refuses larger request bodies (413) before the "
                    "SuperLink reads them: bytes, or 16m, 1g (default twice Flower's array "
                    "chunk: 10m, or twice FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE where set)")
    up.add_argument("--wait", type=float, default=120.0,
                    help="seconds to wait for all SuperNodes to come online")
    with_dir(up)
    up.set_defaults(fn=cmd_up)

    r = dsub.add_parser("run", help="submit a YAML experiment and print the results table",
                        description="Submit the fedsys app with CONFIG's keys (flwr run "
                        "--stream), stream its log, and print the results table.")
    r.add_argument("config", help="YAML experiment file (configs/*.yaml)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a config key (repeatable); see 'fedsys keys'")
    r.add_argument("--superlink", metavar="HOST:PORT",
                   help="submit to this SuperLink's Control API instead of the one in --dir "
                   "(its loopback port on the server host, or an SSH tunnel to it: the "
                   "sites' port does not forward the Control API)")
    tls = r.add_mutually_exclusive_group()
    tls.add_argument("--root-certificates", metavar="CA",
                     help="CA certificate of --superlink (HTTPS)")
    tls.add_argument("--insecure", action="store_true", help="--superlink speaks plain HTTP")
    r.add_argument("--app", default=str(APP_DIR),
                   help="Flower app directory (default: this fedsys checkout)")
    r.add_argument("--timeout", type=float, default=24 * 3600.0,
                   help="seconds before the submission is given up")
    with_dir(r)
    r.set_defaults(fn=cmd_run)

    s = dsub.add_parser(
        "status", help="components, sites (online, last seen, run) and runs",
        description="Show the deployment's components (a 'deploy up' directory), each "
        "registered site (online or not, its last heartbeat, the run whose message it holds) "
        "and the runs. With --kit: the federation of a server kit, on the server host.")
    g = s.add_mutually_exclusive_group()
    g.add_argument("--dir", default=None,
                   help=f"deployment directory (default {DEFAULT_DIR})")
    g.add_argument("--kit", default=None, help="a server kit's directory instead")
    s.set_defaults(fn=cmd_status)

    dn = dsub.add_parser("down", help="stop every process of the deployment")
    with_dir(dn)
    dn.set_defaults(fn=cmd_down)
    add_kit_parsers(dsub)


def add_kit_parsers(dsub: Any) -> None:
    """``server-kit``, ``site-key``, ``add-site`` and ``remove-site`` (:mod:`fedsys_launch.deploy.kits`)."""
    sk = dsub.add_parser(
        "server-kit", help="at the server: CA (its key kept offline), the server's certificate "
        "for its names and addresses, server.env, firewall lines, the flwr connection",
        description="Make the server kit in --out: certs/ (ca.crt, server.pem for every --name "
        "and --address, superexec.secret), ca/ca.key (keep it offline), start.sh (the server "
        "role: SuperLink on loopback, the proxy, the server's SuperExec), server.env, "
        "firewall.txt (the sites' port, and only it) and cli/config.toml (flwr CLI to the "
        "SuperLink's loopback port). Run again to change nothing but what is missing; a "
        "certificate that no longer covers the names is refused (deploy/make-certs.sh -f).")
    sk.add_argument("--name", action="append", default=[], metavar="HOST",
                    help="a host name the sites reach the server by (repeatable); the first "
                    "is the address written into the site kits")
    sk.add_argument("--address", action="append", default=[], metavar="IP",
                    help="an IP address the sites reach the server at (repeatable)")
    sk.add_argument("--port", type=int, default=kits.SITES_PORT,
                    help=f"the sites' port (default {kits.SITES_PORT})")
    sk.add_argument("--link-port", type=int, default=kits.LINK_PORT,
                    help=f"the SuperLink's own port, on loopback (default {kits.LINK_PORT})")
    sk.add_argument("--allow-from", action="append", default=[], metavar="CIDR",
                    help="open the sites' port to these networks only (firewall.txt)")
    sk.add_argument("--out", default=KIT_DIR, help=f"the kit's directory (default {KIT_DIR})")
    sk.add_argument("--roots", metavar="DIR[:DIR...]", default=None,
                    help="where a submitted run config's paths may lie on the server "
                    "(FEDSYS_ROOTS of the server's SuperExec; default $FEDSYS_ROOTS, else "
                    "./runs); none may contain the kit")
    sk.set_defaults(fn=cmd_server_kit)

    key = dsub.add_parser(
        "site-key", help="at a site: its key pair and SuperExec secret; send only the .pub",
        description="Make OUT/keys/NAME (private key, 0600: it never leaves the site), "
        "NAME.pub (send it to the operator) and NAME.secret (0600) with deploy/node-keys.sh; "
        "put the kit the operator sends back in OUT/kit and run OUT/kit/start.sh.")
    key.add_argument("name", metavar="NAME", help="the site's name")
    key.add_argument("--out", default="fedsys-site", help="site directory (default fedsys-site)")
    key.set_defaults(fn=cmd_site_key)

    def federation(p: argparse.ArgumentParser) -> None:
        g = p.add_mutually_exclusive_group()
        g.add_argument("--kit", default=None,
                       help=f"the server kit (default {KIT_DIR}): its flwr connection")
        g.add_argument("--dir", default=None,
                       help="a 'fedsys deploy up' directory instead of a server kit")

    add = dsub.add_parser(
        "add-site", help="register a site's .pub with the running SuperLink and write its kit",
        description="Register NAME.pub (flwr supernode register) and write the site kit "
        "KIT/sites/NAME/: ca.crt, site.env (the server's address, the node config), "
        "site.json (node id), the .pub and start.sh, the one command the site runs. "
        "The kit holds no private key.")
    add.add_argument("pub", metavar="NAME.pub", help="the public key the site sent")
    add.add_argument("--name", default="", help="the site's name (default: the file's, "
                     "without .pub)")
    add.add_argument("--partition-id", type=int, default=None, metavar="I",
                     help="the site trains on partition I of a built-in dataset")
    add.add_argument("--num-partitions", type=int, default=None, metavar="N",
                     help="... of N partitions (the number of sites)")
    add.add_argument("--data-dir", default="", metavar="PATH",
                     help="the site's data directory, at the site (node config data-dir)")
    federation(add)
    add.set_defaults(fn=cmd_add_site)

    rm = dsub.add_parser(
        "remove-site", help="unregister a site: its key is refused from then on",
        description="Unregister site NAME's node (flwr supernode unregister NODE_ID) and "
        "mark its kit revoked (KIT/sites/NAME/REVOKED).")
    rm.add_argument("name", metavar="NAME")
    federation(rm)
    rm.set_defaults(fn=cmd_remove_site)


def _roots(given: str | None) -> str:
    """``--roots`` as absolute directories (default ``$FEDSYS_ROOTS``, else ``./runs``):
    ``fedsys deploy run`` sends paths resolved where it is called, so a relative root
    would mean another place to the server's SuperExec."""
    text = os.environ.get("FEDSYS_ROOTS") or "runs" if given is None else given
    parts = [p for p in text.split(os.pathsep) if p.strip()]
    if not parts:
        raise DeployError("--roots: name at least one directory")
    return os.pathsep.join(str(Path(p).expanduser().resolve()) for p in parts)


def cmd_up(args: argparse.Namespace) -> int:
    """``fedsys deploy up``."""
    if args.nodes < 1:
        raise DeployError("--nodes must be at least 1")
    if args.insecure and (args.tls or args.auth):
        given = [f for f, on in (("--tls", args.tls), ("--auth", args.auth)) if on]
        raise DeployError(f"--insecure turns TLS and node authentication off: drop "
                          f"{' and '.join(given)}")
    secure = not args.insecure
    if secure and not shutil.which("openssl"):
        raise DeployError("TLS, the default, needs openssl for the private CA and the "
                          "SuperLink's certificate (apt-get install openssl)")
    dep = LocalDeployment(Path(args.dir), num_nodes=args.nodes, data_dir=args.data_dir,
                          tls=secure, auth=secure, port=args.port,
                          link_port=args.link_port, gpus=args.gpus,
                          roots=_roots(args.roots), plugins=args.plugins,
                          node_nice=args.node_nice, max_body=args.max_body)
    dep.refuse_if_running()
    dep.refuse_roots()
    if args.insecure:
        print(f"WARNING: --insecure: no TLS and no node authentication: the sites' port "
              f"{dep.address} speaks plain HTTP, anyone who reaches it may register a "
              "SuperNode, join the runs and receive the model, and any local process may "
              "take the ServerApp's task (no SuperExec secret)", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    mode = ", ".join(m for m, on in (("TLS", dep.tls), ("node auth", dep.auth)) if on)
    print(f"fedsys deploy: sites' port {dep.address} (the Fleet API only; the SuperLink on "
          f"loopback {dep.control_address}) ({mode or 'insecure'}), {args.nodes} SuperNodes, "
          f"state in {dep.root}; runs may write under {dep.roots}"
          f"{f', plugins {dep.plugins}' if dep.plugins else ''}", flush=True)
    try:
        dep.up(wait=args.wait)
    except BaseException:
        dep.down()
        raise
    _components(dep)
    print(f"up in {time.monotonic() - t0:.0f} s; 'fedsys deploy run CONFIG' submits, "
          f"'fedsys deploy down' stops.\n"
          f"flwr CLI: FLWR_HOME={dep.cli_home} flwr ls {CONNECTION}")
    return 0


def _remote(args: argparse.Namespace) -> LocalDeployment:
    """A CLI-only handle on a SuperLink that ``up`` did not start."""
    if not (args.root_certificates or args.insecure):
        raise DeployError("--superlink needs --root-certificates CA (HTTPS) or --insecure")
    host, _, port = args.superlink.rpartition(":")
    if not host or not port.isdigit():
        raise DeployError(f"--superlink must be HOST:PORT, got {args.superlink!r}")
    if args.root_certificates:
        ca = Path(args.root_certificates)
        try:
            pem = ca.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise DeployError(f"--root-certificates {ca}: cannot be read "
                              f"({exc.strerror if isinstance(exc, OSError) else 'not text'})") from None
        if "-----BEGIN CERTIFICATE-----" not in pem:
            raise DeployError(f"--root-certificates {ca}: not a PEM certificate "
                              "(the CA that signed the SuperLink's certificate, e.g. deploy/certs/ca.crt)")
    dep = LocalDeployment(Path(args.dir) / "remote", port=int(port))
    cli = dep.cli_home
    cli.mkdir(parents=True, exist_ok=True)
    ca_cert = Path(args.root_certificates).resolve() if args.root_certificates else None
    (cli / "config.toml").write_text(connection_toml(args.superlink, ca_cert))
    return dep


def _load(where: str) -> LocalDeployment:
    """The deployment in ``--dir``; where the default has none but the default before
    issue 75 (``runs/deploy``) has one, the error says so."""
    try:
        return LocalDeployment.load(Path(where))
    except DeployError as exc:
        if where == DEFAULT_DIR and (Path(OLD_DEFAULT_DIR) / STATE_FILE).exists():
            raise DeployError(f"{exc}; the default --dir was {OLD_DEFAULT_DIR} before: "
                              f"--dir {OLD_DEFAULT_DIR} finds that one") from None
        raise


def cmd_run(args: argparse.Namespace) -> int:
    """``fedsys deploy run CONFIG``."""
    from fedsys_launch.commands.results import load_runs, table

    cfg = config_schema.load(Path(args.config), args.set or [])
    for _, vcfg in cfg.variants():  # strategy-specific checks before anything is sent
        config_schema.make_strategy(vcfg)
    if who := in_use(cfg.run_dir):  # its ServerApp would be refused: say so before sending
        raise DeployError(busy(cfg.run_dir, who) + "; a run of it left running on the "
                          "SuperLink ends with 'flwr stop RUN_ID' (see 'fedsys deploy status')")
    if args.superlink:
        dep = _remote(args)
    else:
        dep = _load(args.dir)
        if not all(dep.is_running(n) for n in dep.names()):
            raise DeployError(f"the deployment in {dep.root} is not (fully) running; "
                              "see 'fedsys deploy status'")
        if cfg.num_clients != dep.num_nodes:
            print(f"warning: num-clients is {cfg.num_clients} but the deployment has "
                  f"{dep.num_nodes} SuperNodes (each holds partition i of {dep.num_nodes})",
                  file=sys.stderr)
    app = Path(args.app).resolve()
    if not (app / "pyproject.toml").exists():
        raise DeployError(f"{app} is not a Flower app directory (no pyproject.toml); use --app")
    sent = cfg.to_dict()
    if not args.superlink:  # this machine's server: the run directory this command reports
        sent["output-dir"] = str(Path(cfg.output_dir).expanduser().resolve())
    (dep.cli_home / "last-run-config.toml").parent.mkdir(parents=True, exist_ok=True)
    (dep.cli_home / "last-run-config.toml").write_text(run_config_toml(sent))
    t0 = time.monotonic()
    where = args.superlink or dep.address
    print(f"fedsys deploy: submitting {cfg.strategies} to {where} -> {cfg.run_dir}", flush=True)
    try:
        dep.flwr_cli.run(app, sent, timeout=args.timeout, echo=True)
    except RunNotStartedError as exc:
        print(f"error: {str(exc).splitlines()[0]}: nothing ran (see above)", file=sys.stderr)
        return 1
    except RuntimeError as exc:
        print(f"error: {str(exc).splitlines()[0]}\n  checkpoints are in {cfg.run_dir}; submit "
              f"again with --set resume=true to continue", file=sys.stderr)
        return 1
    table(load_runs(cfg.run_dir), f"{cfg.name} ({time.monotonic() - t0:.0f} s, deployment)")
    print(f"results: {cfg.run_dir}/results.md")
    return 0


def _print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """A rich table at least 110 columns wide, so no cell is cut in a narrow terminal."""
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for col in columns:
        t.add_column(col, overflow="fold")
    for row in rows:
        t.add_row(*row)
    Console(width=max(Console().width, 110)).print(t)


def _components(dep: LocalDeployment) -> None:
    _print_table(f"deployment {dep.root} (SuperLink {dep.address})",
                 ("component", "pid", "state", "log"),
                 ((name, str(dep.components[name].pid) if dep.is_running(name) else "-",
                   "running" if dep.is_running(name) else "stopped", str(dep.log_file(name)))
                  for name in dep.names()))


def cmd_status(args: argparse.Namespace) -> int:
    """``fedsys deploy status``."""
    if args.kit is not None:
        kit = kits.ServerKit.load(Path(args.kit))
        root, dep = kit.root, kit.handle()
        print(f"server kit {root}: sites connect to {kit.site_address}")
    else:
        dep = _load(args.dir or DEFAULT_DIR)
        root = dep.root
        _components(dep)
        if not dep.is_running(SUPERLINK):
            print("the SuperLink is not running")
            return 0
    try:
        nodes, runs = dep.flwr_cli.nodes(), dep.flwr_cli.runs()
    except DeployError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    sites = site_status.registered_sites(root)
    if sites:
        activity = site_status.read_activity(root / "superlink.db")
        running = [int(r["run-id"]) for r in runs if str(r.get("status", "")).startswith("running")]
        rows = site_status.site_rows(sites, nodes, activity, running, time.time())
        _print_table("sites (fedsys deploy add-site)",
                     ("site", "node id", "state", "last seen", "run", "registered"),
                     ((r.name, str(r.node_id), r.state, r.last_seen, r.run, r.registered)
                      for r in rows))
        if isinstance(activity, str):
            print(f"last seen and run: {activity}", file=sys.stderr)
    known = {int(s["node-id"]) for s in sites}
    others = [n for n in nodes if int(n["node-id"]) not in known]
    if others or not sites:
        _print_table("SuperNodes (flwr supernode list)", ("node id", "status", "online since"),
                     ((n["node-id"], n["status"], str(n.get("online-at") or "-")) for n in others))
    if not runs:
        print("runs (flwr ls): none yet")
        return 0
    _print_table("runs (flwr ls)", ("run id", "app", "status", "elapsed", "started"),
                 ((r["run-id"], f"{r['fab-id']} {r.get('fab-version', '')}".strip(),
                   r["status"], str(r.get("elapsed", "")), str(r.get("running-at") or "-"))
                  for r in runs))
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    """``fedsys deploy down``."""
    dep = _load(args.dir)
    n = dep.down()
    print(f"stopped {n} processes; nothing of {dep.root} is running")
    return 0


def cmd_server_kit(args: argparse.Namespace) -> int:
    """``fedsys deploy server-kit``."""
    kit = kits.make_server_kit(Path(args.out), args.name, args.address, args.port,
                               args.link_port, args.allow_from, _roots(args.roots))
    print(f"server kit in {kit.root}: certificate for {', '.join(kit.sans)}\n"
          f"  CA key: {kit.root / 'ca' / 'ca.key'}: keep it offline (no component reads it)\n"
          f"  sites connect to {kit.site_address}; open that port only: {kit.root / 'firewall.txt'}\n"
          f"  start the server (SuperLink, proxy on {kit.listen}, SuperExec): "
          f"{kit.root / 'start.sh'}\n"
          f"  server role settings: {kit.root / 'server.env'}\n"
          f"  register a site: fedsys deploy add-site NAME.pub --kit {args.out} ...")
    return 0


def cmd_site_key(args: argparse.Namespace) -> int:
    """``fedsys deploy site-key NAME``."""
    pub = kits.make_site_key(args.name, Path(args.out))
    print(f"{args.name}: private key and secret in {pub.parent} (0600; they stay here)\n"
          f"send this file to the operator: {pub}\n"
          f"then put the kit you get back in {Path(args.out) / 'kit'} and run "
          f"{Path(args.out) / 'kit' / 'start.sh'}")
    return 0


def _federation(args: argparse.Namespace) -> kits.Federation:
    if args.dir is not None:
        dep = _load(args.dir)
        if not dep.auth:
            raise DeployError(f"the deployment in {dep.root} runs without node authentication "
                              "(--insecure): it has no keys to register")
        return kits.Federation(dep.root, dep.ca_cert, dep.address, dep)
    kit = kits.ServerKit.load(Path(args.kit or KIT_DIR))
    host = (kit.names[0], kit.addresses[0]) if kit.names and kit.addresses else None
    return kits.Federation(kit.root, kit.ca_cert, kit.site_address, kit.handle(), host)


def cmd_add_site(args: argparse.Namespace) -> int:
    """``fedsys deploy add-site NAME.pub``."""
    pub = Path(args.pub)
    name = args.name or (pub.name[:-4] if pub.name.endswith(".pub") else "")
    if not name:
        raise DeployError(f"{pub}: name the site with --name (the file has no .pub suffix)")
    name = kits.site_name(name)
    fed = _federation(args)
    pid = args.partition_id
    if pid is None and args.num_partitions is None and args.data_dir:
        pid = kits.free_partition_id(fed.root)
    cfg = kits.node_config(pid, args.num_partitions, args.data_dir)
    kit, node_id = kits.add_site(fed, pub, name, cfg)
    print(f"registered {name} as node {node_id}; its kit: {kit} (no private key)\n"
          f"  send it to the site, which runs: kit/start.sh")
    return 0


def cmd_remove_site(args: argparse.Namespace) -> int:
    """``fedsys deploy remove-site NAME``."""
    fed = _federation(args)
    node_id = kits.remove_site(fed, kits.site_name(args.name))
    print(f"unregistered {args.name} (node {node_id}): its key is refused from now on; "
          f"kit marked {fed.root / 'sites' / args.name / kits.REVOKED}; to rejoin, the site "
          "makes a new key pair")
    return 0
