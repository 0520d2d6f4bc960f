"""The sites' port (:mod:`fedsys_launch.deploy.proxy`): nginx forwards Flower's Fleet API and nothing else.

A real nginx in front of a stand-in upstream on loopback that records every request it
gets: the Fleet API's ``POST /v1/fleet/<endpoint>`` reaches it, unchanged; the Control
and Runtime APIs, ``/docs``, ``/openapi.json`` and every other spelling of them do not.
The deployment tests (``tests/integration/test_deploy_tls.py``) do the same against a
real SuperLink, and the Docker proof against the compose stack.
"""

from __future__ import annotations

import http.client
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from fedsys_launch.deploy.local_deployment import SCRIPTS, nginx_bin
from fedsys_launch.deploy.proxy import (
    FLEET_PATH,
    MiB,
    ProxyLimits,
    ProxyTLS,
    compose_conf,
    default_max_body,
    flower_chunk_size,
    nginx_conf,
    parse_size,
    write_conf,
)
from fedsys_launch.process.supervision import free_port, wait_port

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


Proxied = tuple[int, list[tuple[str, str]]]


@pytest.fixture(name="start_proxy")
def proxy_factory(tmp_path: Path) -> Iterator[Callable[[ProxyLimits | None], Proxied]]:
    """Start nginx with the given limits in front of a recording upstream: its port and
    what the upstream received (one proxy a test)."""
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    _Recorder.seen = []
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    procs: list[subprocess.Popen[bytes]] = []

    def start(limits: ProxyLimits | None) -> Proxied:
        port = free_port()
        work = tmp_path / f"proxy-{len(procs)}"
        conf = write_conf(work / "nginx.conf", nginx_conf(
            f"127.0.0.1:{port}", f"127.0.0.1:{upstream.server_address[1]}", str(work), None,
            limits=limits, user="root" if os.geteuid() == 0 else None))
        (work / "body").mkdir()  # bodies above 128 KiB are buffered here
        procs.append(subprocess.Popen([nginx_bin(), "-e", "stderr", "-p", str(work), "-c",
                                       str(conf), "-g", "daemon off;"],
                                      stderr=subprocess.DEVNULL))
        wait_port(port, 20)
        return port, _Recorder.seen

    try:
        yield start
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
        upstream.shutdown()
        upstream.server_close()


@pytest.fixture(name="proxied")
def proxy_in_front_of_a_recorder(start_proxy: Callable[[ProxyLimits | None], Proxied]
                                 ) -> Proxied:
    return start_proxy(None)


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
    from fedsys_launch.deploy.errors import DeployError
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    monkeypatch.setattr(Path, "exists", lambda _self: False)
    with pytest.raises(DeployError, match=r"nginx is not installed.*apt-get install nginx-light"):
        nginx_bin()


# ---------------------------------------------------------------- limits (issue 75)

def test_the_limits_are_rendered() -> None:
    """The body cap follows Flower's array chunk, bodies are buffered by nginx, and every
    limit of :class:`ProxyLimits` is a directive of the configuration compose mounts."""
    assert default_max_body({}) == 10 * MiB
    assert default_max_body({"FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE": str(8 * MiB)}) == 16 * MiB
    assert [parse_size(t) for t in ("512", "64k", "16m", "16M", "1g", "10MiB")] == [
        512, 64 << 10, 16 * MiB, 16 * MiB, 1 << 30, 10 * MiB]
    for bad in ("", "0", "-1", "10x", "1.5m"):
        with pytest.raises(ValueError):
            parse_size(bad)
    text = compose_conf()
    for line in ("worker_processes auto;", "worker_rlimit_nofile 16384;",
                 "events { worker_connections 8192; }", "client_max_body_size 10m;",
                 "proxy_request_buffering on;", "client_header_timeout 10s;",
                 "client_body_timeout 10s;", "send_timeout 30s;", "keepalive_timeout 15s;",
                 "limit_conn_zone $binary_remote_addr zone=fleet_addr:10m;",
                 "limit_req_zone $binary_remote_addr zone=fleet_rate:10m rate=20r/s;",
                 "limit_conn_status 503;", "limit_req_status 503;",
                 "limit_conn fleet_addr 32;", "limit_req zone=fleet_rate burst=200 nodelay;"):
        assert f"\n    {line}" in text or f"\n        {line}" in text or line in text, line
    assert "client_max_body_size 0" not in text and "proxy_request_buffering off" not in text
    custom = nginx_conf("127.0.0.1:1", "127.0.0.1:2", "/w", None, limits=ProxyLimits(
        max_body=3 * MiB + 1, conns_per_addr=7, rate_per_addr=3, burst=9, header_timeout=4,
        body_timeout=5, workers="3", worker_connections=100, nofile=300))
    for line in ("client_max_body_size 3145729;", "limit_conn fleet_addr 7;", "rate=3r/s;",
                 "burst=9 nodelay;", "client_header_timeout 4s;", "client_body_timeout 5s;",
                 "worker_processes 3;", "worker_connections 100;", "worker_rlimit_nofile 300;"):
        assert line in custom, line
    with pytest.raises(ValueError, match="max_body"):
        ProxyLimits(max_body=0)


def _connect(port: int, source: str = "127.0.0.1", timeout: float = 10) -> socket.socket:
    """A TCP connection to the proxy from ``source`` (any 127/8 address is loopback, so
    a per-address limit can be tried from 127.0.0.2 while the site is 127.0.0.1)."""
    return socket.create_connection(("127.0.0.1", port), timeout, source_address=(source, 0))


def _head(length: int | None) -> bytes:
    size = f"content-length: {length}" if length is not None else "transfer-encoding: chunked"
    return (f"POST /v1/fleet/push-object HTTP/1.1\r\nhost: x\r\n{size}\r\n"
            "content-type: application/protobuf\r\n\r\n").encode()


def _status(sock: socket.socket) -> int | None:
    """The status of the response on ``sock``, None when it closed without one."""
    try:
        data = sock.recv(4096)
    except (ConnectionError, TimeoutError):
        return None
    return int(data.split()[1]) if data.startswith(b"HTTP/1.1 ") else None


def _post(port: int, body: bytes, source: str = "127.0.0.1") -> int:
    with _connect(port, source) as s:
        s.sendall(_head(len(body)) + body)
        status = _status(s)
    assert status is not None
    return status


def test_a_body_above_the_cap_is_refused_and_never_forwarded(
        start_proxy: Callable[[ProxyLimits | None], Proxied]) -> None:
    """413 for a declared length above the cap and for a chunked body as it passes the
    cap (streamed, the sender stops at the answer); a body just under it is forwarded."""
    port, seen = start_proxy(ProxyLimits(max_body=MiB))
    with _connect(port) as s:
        s.sendall(_head(1 << 30))
        assert _status(s) == 413
    sent = 0
    with _connect(port) as s:
        s.sendall(_head(None))
        block = b"%x\r\n" % (64 << 10) + bytes(64 << 10) + b"\r\n"
        s.settimeout(0.05)
        status = None
        while sent < 64 * MiB and status is None:  # bounded: 64 MiB at most
            try:
                s.sendall(block)
                sent += 64 << 10
                status = _status(s)
            except TimeoutError:
                continue
            except ConnectionError:
                break
        s.settimeout(10)
        status = status or _status(s)
    assert status in (413, None) and sent < 4 * MiB, (status, sent)
    assert seen == []
    assert _post(port, bytes(MiB - 4096)) == 200
    assert seen == [("POST", "/v1/fleet/push-object")]


def test_a_slow_body_reaches_the_superlink_whole_or_not_at_all(
        start_proxy: Callable[[ProxyLimits | None], Proxied]) -> None:
    """nginx buffers the body: the upstream sees a request only once it is complete, and
    a body that stalls past ``client_body_timeout`` is dropped without reaching it."""
    port, seen = start_proxy(ProxyLimits(body_timeout=1, header_timeout=1))
    with _connect(port) as slow, _connect(port) as stalled, _connect(port) as loris:
        slow.sendall(_head(1000) + bytes(500))
        stalled.sendall(_head(1000) + bytes(500))
        loris.sendall(b"POST /v1/fleet/push-object HTTP/1.1\r\nhost: x\r\n")
        time.sleep(0.5)
        slow.sendall(bytes(250))
        time.sleep(0.6)
        assert seen == []
        slow.sendall(bytes(250))
        assert _status(slow) == 200
        t0 = time.monotonic()
        assert _status(stalled) in (408, None)  # closed at the body timeout
        assert _status(loris) in (408, None)    # and at the header timeout
        assert time.monotonic() - t0 < 5
    assert seen == [("POST", "/v1/fleet/push-object")]


def test_one_address_is_limited_and_another_is_not(
        start_proxy: Callable[[ProxyLimits | None], Proxied]) -> None:
    """Requests in progress and requests per second are counted per client address: the
    extra ones from 127.0.0.2 get 503 (which Flower's SuperNode retries) while
    127.0.0.1, the real site, is served."""
    port, seen = start_proxy(ProxyLimits(conns_per_addr=4, rate_per_addr=1, burst=30))
    held: list[socket.socket] = []
    try:
        for _ in range(4):
            held.append(_connect(port, "127.0.0.2"))
            held[-1].sendall(_head(100) + bytes(10))
        time.sleep(0.3)
        refused = []
        for _ in range(6):
            with _connect(port, "127.0.0.2") as s:
                s.sendall(_head(100) + bytes(10))
                refused.append(_status(s))
        assert refused == [503] * 6
        assert _post(port, b"{}") == 200  # the site, beside a full quota from 127.0.0.2
    finally:
        for s in held:
            s.close()
    assert seen == [("POST", "/v1/fleet/push-object")]
    time.sleep(1.1)
    port, seen = start_proxy(ProxyLimits(rate_per_addr=1, burst=5))
    codes = [_post(port, b"{}", "127.0.0.2") for _ in range(20)]
    assert codes.count(200) <= 8 and codes.count(503) >= 12, codes
    assert _post(port, b"{}") == 200


def test_a_deployment_renders_its_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``fedsys deploy up --max-body`` reaches the proxy's configuration and ``deploy.json``;
    without it the cap is twice the chunk of Flower's environment; a bad size is a usage
    error."""
    from fedsys_launch.commands import cli
    from fedsys_launch.deploy.local_deployment import LocalDeployment

    dep = LocalDeployment(tmp_path / "d", max_body=parse_size("24m"))
    assert "client_max_body_size 24m;" in dep.write_proxy_conf().read_text()
    dep.save()
    assert LocalDeployment.load(tmp_path / "d").max_body == 24 * MiB
    monkeypatch.setenv("FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE", str(8 * MiB))
    text = LocalDeployment(tmp_path / "e").write_proxy_conf().read_text()
    assert "client_max_body_size 16m;" in text
    assert "limit_conn fleet_addr 32;" in text  # 2 nodes: the defaults
    text = LocalDeployment(tmp_path / "g", num_nodes=30).write_proxy_conf().read_text()
    assert "limit_conn fleet_addr 120;" in text and "burst=3000 nodelay;" in text
    assert ("user root;" in text) == (os.geteuid() == 0)  # root's workers reach its 0700 dir
    with pytest.raises(SystemExit) as e:
        cli.main(["deploy", "up", "--max-body", "ten", "--dir", str(tmp_path / "f")])
    assert e.value.code == 2 and "not a size: 'ten'" in capsys.readouterr().err


def test_the_largest_body_a_supernode_sends_fits_the_cap() -> None:
    """What the default cap is derived from: Flower slices an array into chunks of
    ``FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE`` and pushes one object per ``push-object``, so
    the largest body is one chunk and 115 bytes (ids at their longest); a record of
    1,000 arrays deflates to 85 KiB (ids only).  Both leave the cap's second chunk free."""
    import numpy as np
    from flwr.app import Array, ArrayRecord
    from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE
    from flwr.proto.message_pb2 import PushObjectRequest
    from flwr.proto.node_pb2 import Node

    assert FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE == flower_chunk_size() == 5 * MiB
    chunks = Array(np.arange(3_000_000, dtype=np.float32)).slice_array()
    largest = max(
        PushObjectRequest(node=Node(node_id=2**64 - 1), run_id=2**64 - 1, object_id=oid,
                          object_content=chunk.deflate()).ByteSize()
        for oid, chunk in chunks)
    assert 5 * MiB < largest < 5 * MiB + 1024
    record = ArrayRecord({f"layer{i}.weight": Array(np.zeros(4, np.float32))
                          for i in range(1000)}).deflate()
    assert largest + len(record) < default_max_body() - 4 * MiB


def test_sites_behind_one_address_get_room() -> None:
    """A local deployment's sites all come from 127.0.0.1: its quota grows with them."""
    assert ProxyLimits().for_sites(2) == ProxyLimits()
    many = ProxyLimits(max_body=MiB).for_sites(30)
    assert (many.conns_per_addr, many.rate_per_addr, many.burst, many.max_body) == (
        120, 60, 3000, MiB)
