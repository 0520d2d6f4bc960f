"""The sites' port: an nginx reverse proxy that forwards Flower's Fleet API and nothing else.

Flower 1.41/1.42 serves its Fleet API (SuperNodes), Control API (``flwr`` CLI: register
nodes, start and stop runs) and Runtime API (the SuperExecs) on one HTTP(S) listener,
``flower-superlink --host --port``, and the open-source Control API has no authentication
(it needs Flower's OIDC plug-in, an enterprise feature).  Whoever reaches that port can
register a SuperNode key of their own and ``flwr run`` an app of their own on the server
and on every site.  Flower offers no supported way to split the listeners (the separate
``--fleet-api-address`` and ``--control-api-address`` are deprecated and ignored), so
fedsys puts a maintained reverse proxy in front: the SuperLink binds loopback
(``127.0.0.1``, its *link port*, for the operator's ``flwr`` CLI and the server's
SuperExec), and nginx listens on the *sites' port*, terminates TLS there with the
SuperLink's certificate, and forwards only ``POST /v1/fleet/<endpoint>`` to the
SuperLink over loopback (verifying its certificate against the private CA when TLS is
on).  Everything else, ``/v1/control/``, ``/v1/runtime/``, ``/docs``, ``/openapi.json``
and ``/health`` included, is answered 404 by nginx and never reaches the SuperLink.

The path is checked on the request line as the site sent it (``$request_uri``), not
after nginx's own decoding and ``..`` folding, so no spelling of a control path can reach
the SuperLink through a Fleet location.

The SuperLink bounds nothing itself: Flower reads a whole request body before it checks a
node's signature (a 400 MB ``push-object`` with only ``ca.crt`` grew it by 784 MB), so the
proxy does (:class:`ProxyLimits`, issue 75): a body above ``client_max_body_size`` is
refused 413 (the largest a SuperNode sends is one array chunk, :func:`default_max_body`);
bodies are buffered by nginx (``proxy_request_buffering on``) and reach the SuperLink
whole, so a slow or oversized body never does; request headers and bodies have timeouts;
connections with a request in progress and requests per second are limited per client
address (503, which Flower's SuperNode retries with back-off); and the workers hold
thousands of connections.

:func:`nginx_conf` renders the configuration for ``fedsys deploy``
(:mod:`fedsys_launch.deploy.local_deployment`) and for docker-compose (``deploy/proxy/nginx.conf``, checked
against this renderer by ``tests/unit/test_proxy.py``, so the two cannot drift).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

#: the only request lines forwarded to the SuperLink: a Fleet API endpoint, no query
FLEET_PATH = r"^/v1/fleet/[a-z][a-z-]*$"

MiB = 1 << 20
#: Flower's array chunk (``flwr.common.constant.FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE``, read
#: from the same environment variable by every SuperNode): the largest object it pushes
FLOWER_CHUNK_DEFAULT = 5 * MiB


def flower_chunk_size(environ: dict[str, str] | None = None) -> int:
    """The array chunk Flower's SuperNodes push (5 MiB unless
    ``FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE`` says otherwise)."""
    env = os.environ if environ is None else environ
    return int(env.get("FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE", FLOWER_CHUNK_DEFAULT))


def default_max_body(environ: dict[str, str] | None = None) -> int:
    """The body cap: twice Flower's array chunk (10 MiB at its default).

    What a SuperNode POSTs is small but for ``push-object``: one object each, an
    ``ArrayChunk`` of at most one chunk (5 MiB and about 200 bytes of framing), or a
    record, whose deflated form lists its children's ids and holds its values; arrays are
    never sent whole.  ``push-messages`` carries message metadata and the object tree
    (ids only).  The largest body of a real run is one chunk (``docs/performance.md``);
    the second chunk's worth is the margin for a metric or config record a ClientApp
    replies with (those are not chunked).
    """
    return 2 * flower_chunk_size(environ)


def parse_size(text: str) -> int:
    """``10m``, ``512k``, ``1g`` or bytes (nginx's units, 1024-based) as bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([kmg]?)(?:i?b)?\s*", text.lower())
    if not m or int(m.group(1)) <= 0:
        raise ValueError(f"not a size: {text!r} (bytes, or a number with k, m or g)")
    return int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2)]


def _size(n: int) -> str:
    """Bytes as nginx reads them (``10m`` where it is whole mebibytes)."""
    return f"{n >> 20}m" if n % MiB == 0 else (f"{n >> 10}k" if n % 1024 == 0 else str(n))


@dataclass(frozen=True)
class ProxyLimits:
    """What one client address may cost the sites' port (issue 75).

    Parameters
    ----------
    max_body : int
        ``client_max_body_size``: larger bodies are refused 413 by nginx, as soon as the
        ``Content-Length`` says so or as the chunked body passes it (default
        :func:`default_max_body`, 10 MiB).
    conns_per_addr : int
        Requests in progress at once from one address (``limit_conn``; nginx counts a
        connection once its request header is read): a SuperNode has at most four (its
        loop, its heartbeat, two object pushes or pulls), so 32 leave room for eight sites
        behind one address.
    rate_per_addr, burst : int
        Requests per second from one address and the burst above it served at once
        (``limit_req ... nodelay``): an idle SuperNode asks every 3 s, one sending a model
        asks once per array and chunk, as fast as its link allows.
    header_timeout, body_timeout : int
        Seconds for the whole request header (and the TLS handshake), and between two
        reads of the body (``client_header_timeout`` / ``client_body_timeout``).
    send_timeout : int
        Seconds between two writes of a response to a site (a 5 MiB object it pulls).
    keepalive_timeout : int
        Seconds an idle connection is kept (Flower's client keeps its own for 5 s).
    workers : str
        ``worker_processes`` (``auto``: one per core).
    worker_connections : int
        Connections per worker, a proxied request counting two.
    nofile : int
        ``worker_rlimit_nofile`` (at most the hard limit of whoever starts nginx).
    """

    max_body: int = field(default_factory=default_max_body)
    conns_per_addr: int = 32
    rate_per_addr: int = 20
    burst: int = 200
    header_timeout: int = 10
    body_timeout: int = 10
    send_timeout: int = 30
    keepalive_timeout: int = 15
    workers: str = "auto"
    worker_connections: int = 8192
    nofile: int = 16384

    def __post_init__(self) -> None:
        for name in ("max_body", "conns_per_addr", "rate_per_addr", "header_timeout",
                     "body_timeout", "send_timeout", "keepalive_timeout",
                     "worker_connections", "nofile"):
            if getattr(self, name) <= 0:
                raise ValueError(f"ProxyLimits.{name} must be positive")
        if self.burst < 0:
            raise ValueError("ProxyLimits.burst must not be negative")

    def for_sites(self, sites: int) -> ProxyLimits:
        """These limits with room for ``sites`` SuperNodes behind one address (a local
        deployment's all come from 127.0.0.1): four requests in progress, two a second
        and a burst of 100 (a model's arrays and chunks) for each, never below these."""
        return replace(self, conns_per_addr=max(self.conns_per_addr, 4 * sites),
                       rate_per_addr=max(self.rate_per_addr, 2 * sites),
                       burst=max(self.burst, 100 * sites))


@dataclass(frozen=True)
class ProxyTLS:
    """What the proxy needs for TLS on both sides.

    Parameters
    ----------
    cert, key : str
        The certificate and key it presents to the sites (the SuperLink's own).
    ca : str
        The private CA that signed the SuperLink's certificate: the proxy checks the
        SuperLink against it on loopback.
    """

    cert: str
    key: str
    ca: str


def nginx_conf(listen: str, link: str, work: str, tls: ProxyTLS | None,
               access_log: str = "off", error_log: str = "stderr",
               limits: ProxyLimits | None = None, user: str | None = None) -> str:
    """An nginx configuration that forwards only Flower's Fleet API.

    Parameters
    ----------
    listen : str
        ``HOST:PORT`` the sites connect to.
    link : str
        ``127.0.0.1:PORT``, the SuperLink's loopback listener.
    work : str
        A directory the proxy may write (its pid file and request buffers).
    tls : ProxyTLS or None
        HTTPS on both sides; ``None``: plain HTTP (a deployment without ``--tls``).
    access_log, error_log : str
        Where nginx logs (``off`` / ``stderr`` or a file).
    limits : ProxyLimits or None
        Body cap, timeouts, per-address limits and workers (``None``: the defaults).
    user : str or None
        ``user``: whom the workers run as when nginx is started as root (``None``: no
        directive; nginx's default, ``nobody``, cannot enter a 0700 ``work`` of root's to
        buffer a body).

    Returns
    -------
    str
        The whole ``nginx.conf``.
    """
    scheme = "https" if tls else "http"
    server_tls = (f"""
        ssl_certificate {tls.cert};
        ssl_certificate_key {tls.key};
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_prefer_server_ciphers on;""" if tls else "")
    upstream_tls = (f"""
            proxy_ssl_trusted_certificate {tls.ca};
            proxy_ssl_verify on;
            proxy_ssl_name localhost;
            proxy_ssl_server_name on;
            proxy_ssl_protocols TLSv1.2 TLSv1.3;""" if tls else "")
    access = "access_log off;" if access_log == "off" else f"access_log {access_log} fleet;"
    lim = limits or ProxyLimits()
    return f"""# fedsys: the sites' port forwards Flower's Fleet API only (fedsys_launch/deploy/proxy.py renders this)
{f"user {user};{chr(10)}" if user else ""}worker_processes {lim.workers};
worker_rlimit_nofile {lim.nofile};
pid {work}/nginx.pid;
error_log {error_log} warn;
events {{ worker_connections {lim.worker_connections}; }}
http {{
    log_format fleet '$remote_addr [$time_local] "$request" $status $body_bytes_sent $request_length $request_time';
    {access}
    client_body_temp_path {work}/body;
    proxy_temp_path {work}/proxy;
    fastcgi_temp_path {work}/fastcgi;
    uwsgi_temp_path {work}/uwsgi;
    scgi_temp_path {work}/scgi;
    server_tokens off;
    # issue 75: nothing large or slow reaches the SuperLink, which reads whole bodies
    client_max_body_size {_size(lim.max_body)};
    client_body_buffer_size 128k;
    proxy_request_buffering on;
    client_header_timeout {lim.header_timeout}s;
    client_body_timeout {lim.body_timeout}s;
    send_timeout {lim.send_timeout}s;
    keepalive_timeout {lim.keepalive_timeout}s;
    lingering_time 10s;
    reset_timedout_connection on;
    limit_conn_zone $binary_remote_addr zone=fleet_addr:10m;
    limit_req_zone $binary_remote_addr zone=fleet_rate:10m rate={lim.rate_per_addr}r/s;
    limit_conn_status 503;
    limit_req_status 503;
    proxy_buffering off;
    proxy_read_timeout 3600s;
    proxy_send_timeout 3600s;
    server {{
        listen {listen}{" ssl" if tls else ""};{server_tls}
        limit_conn fleet_addr {lim.conns_per_addr};
        limit_req zone=fleet_rate burst={lim.burst} nodelay;
        location / {{
            return 404;
        }}
        location /v1/fleet/ {{
            if ($request_uri !~ "{FLEET_PATH}") {{
                return 404;
            }}
            limit_except POST {{
                deny all;
            }}
            proxy_pass {scheme}://{link};
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;{upstream_tls}
        }}
    }}
}}
"""


def compose_conf(limits: ProxyLimits | None = None) -> str:
    """The configuration docker-compose's ``proxy`` service mounts (``deploy/proxy/nginx.conf``):
    the sites' port 9093 on every interface of the SuperLink's network namespace, the
    SuperLink on its loopback port 9091, the certificates mounted under ``/certs``; the
    default :class:`ProxyLimits` with Flower's default chunk (not this environment's)."""
    return nginx_conf("0.0.0.0:9093", "127.0.0.1:9091", "/tmp/nginx",
                      ProxyTLS("/certs/server.pem", "/certs/server.key", "/certs/ca.crt"),
                      access_log="/dev/stdout",
                      limits=limits or ProxyLimits(max_body=default_max_body({})))


def write_conf(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` (0600; the directory 0700) and make the work directory."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)
    return path


__all__ = ["FLEET_PATH", "ProxyLimits", "ProxyTLS", "compose_conf", "default_max_body",
           "flower_chunk_size", "nginx_conf", "parse_size", "write_conf"]
