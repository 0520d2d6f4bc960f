"""The sites' port (:mod:`fedsys_launch.proxy`): nginx forwards Flower's Fleet API and nothing else.

A real nginx in front of a stand-in upstream on loopback that records every request it
gets: the Fleet API's ``POST /v1/fleet/<endpoint>`` reaches it, unchanged; the Control
and Runtime APIs, ``/docs``, ``/openapi.json`` and every other spelling of them do not.
The deployment tests (``tests/integration/test_deploy_tls.py``) do the same against a
real SuperLink, and the Docker proof against the compose stack.
"""

from __future__ import annotations

import http.client
import shutil
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from fedsys_launch.deploy import SCRIPTS, free_port, nginx_bin, wait_port
from fedsys_launch.proxy import FLEET_PATH, ProxyTLS, compose_conf, nginx_conf, write_conf

ROOT = Path(__file__).resolve().parents[2]


def test_compose_mounts_the_rendered_configuration() -> None:
    """``deploy/proxy/nginx.conf`` is :func:`compose_conf`'s output, so docker-compose's
    proxy and ``fedsys deploy``'s cannot drift apart."""
    assert (ROOT / "deploy" / "proxy" / "nginx.conf").read_text() == compose_conf()
    compose = (ROOT / "docker-compose.yml").read_text()
    assert "./deploy/proxy/nginx.conf:/etc/fedsys/nginx.conf:ro" in compose
    assert "network_mode: host" not in compose
    assert not [line for line in compose.splitlines() if "ca.key" in line and ":/" in line]


class _Recorder(BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, str]]] = []

    def _answer(self) -> None:
        self.seen.append((self.command, self.path))
        n = int(self.headers.get("content-length") or 0)
        self.rfile.read(n)
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    do_GET = do_POST = do_PUT = do_HEAD = _answer  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(name="proxied")
def proxy_in_front_of_a_recorder(tmp_path: Path) -> Iterator[tuple[int, list[tuple[str, str]]]]:
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    _Recorder.seen = []
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    port = free_port()
    work = tmp_path / "proxy"
    conf = write_conf(work / "nginx.conf", nginx_conf(
        f"127.0.0.1:{port}", f"127.0.0.1:{upstream.server_address[1]}", str(work), None))
    proc = subprocess.Popen([nginx_bin(), "-e", "stderr", "-p", str(work), "-c", str(conf),
                             "-g", "daemon off;"], stderr=subprocess.PIPE)
    try:
        wait_port(port, 20)
        yield port, _Recorder.seen
    finally:
        proc.terminate()
        proc.wait(10)
        upstream.shutdown()


def _send(port: int, method: str, path: str) -> int:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request(method, path, body=b"{}" if method == "POST" else None)
    return c.getresponse().status


REFUSED = ["/v1/control/list-nodes", "/v1/control/register-node", "/v1/control/start-run",
           "/v1/runtime/acquire-task", "/docs", "/openapi.json", "/health", "/",
           "/v1/fleet/../control/list-nodes", "/v1/fleet/%2e%2e/control/list-nodes",
           "/v1/fleet/..%2fcontrol/list-nodes", "/v1/fleet/%2E%2E/control/start-run",
           "/v1//fleet/pull-messages", "/v1/fleet//pull-messages", "/v1/fleet/",
           "/v1/fleet/pull-messages?next=/v1/control/list-nodes", "/v1/fleet/pull-messages/",
           "/v1/fleet/pull-messages%00", "/V1/FLEET/pull-messages", "/v1/fleet/Pull-Messages"]


def test_only_fleet_posts_reach_the_superlink(proxied: tuple[int, list[tuple[str, str]]]
                                              ) -> None:
    port, seen = proxied
    for path in REFUSED:
        assert _send(port, "POST", path) in (400, 404), path
        assert _send(port, "GET", path) in (400, 403, 404), path  # 403: POST only
    assert seen == []
    for endpoint in ("register-node", "pull-messages", "push-messages", "push-object",
                     "pull-object", "send-node-heartbeat", "get-fab", "get-run"):
        assert _send(port, "POST", f"/v1/fleet/{endpoint}") == 200
        assert _send(port, "GET", f"/v1/fleet/{endpoint}") == 403  # POST only
    assert seen == [("POST", f"/v1/fleet/{e}") for e in (
        "register-node", "pull-messages", "push-messages", "push-object", "pull-object",
        "send-node-heartbeat", "get-fab", "get-run")]


def test_the_fleet_pattern_is_the_whole_path() -> None:
    import re
    assert re.fullmatch(FLEET_PATH.strip("^$"), "/v1/fleet/pull-messages")
    for bad in ("/v1/fleet/../control", "/v1/fleet/a?b", "/v1/fleet/a/b", "/v1/fleet/"):
        assert not re.match(FLEET_PATH, bad)


def test_the_tls_configuration_is_valid_nginx(tmp_path: Path) -> None:
    """``nginx -t`` accepts the HTTPS configuration with real certificates, which checks
    the SuperLink against the CA (``proxy_ssl_verify``) on loopback."""
    certs = tmp_path / "certs"
    subprocess.run(["bash", str(SCRIPTS / "make-certs.sh"), "-d", str(certs)], check=True,
                   capture_output=True)
    work = tmp_path / "proxy"
    text = nginx_conf("127.0.0.1:1", "127.0.0.1:2", str(work), ProxyTLS(
        str(certs / "server.pem"), str(certs / "server.key"), str(certs / "ca.crt")))
    for line in ("proxy_ssl_verify on;", "ssl_protocols TLSv1.2 TLSv1.3;",
                 "proxy_pass https://127.0.0.1:2;"):
        assert line in text
    conf = write_conf(work / "nginx.conf", text)
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (work / sub).mkdir()
    test = subprocess.run([nginx_bin(), "-t", "-e", "stderr", "-p", str(work), "-c", str(conf)],
                          capture_output=True, text=True)
    assert test.returncode == 0, test.stderr
    assert conf.stat().st_mode & 0o077 == 0


def test_no_nginx_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from fedsys_launch.deploy import DeployError
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    monkeypatch.setattr(Path, "exists", lambda _self: False)
    with pytest.raises(DeployError, match=r"nginx is not installed.*apt-get install nginx-light"):
        nginx_bin()
