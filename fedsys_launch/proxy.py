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
the SuperLink through a Fleet location.  Bodies are streamed (no size limit: the SuperLink
bounds its messages) and long polls are allowed an hour.

:func:`nginx_conf` renders the configuration for ``fedsys deploy``
(:mod:`fedsys_launch.deploy`) and for docker-compose (``deploy/proxy/nginx.conf``, checked
against this renderer by ``tests/unit/test_proxy.py``, so the two cannot drift).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: the only request lines forwarded to the SuperLink: a Fleet API endpoint, no query
FLEET_PATH = r"^/v1/fleet/[a-z][a-z-]*$"


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
               access_log: str = "off", error_log: str = "stderr") -> str:
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
    return f"""# fedsys: the sites' port forwards Flower's Fleet API only (fedsys_launch/proxy.py renders this)
worker_processes 1;
pid {work}/nginx.pid;
error_log {error_log} warn;
events {{ worker_connections 1024; }}
http {{
    log_format fleet '$remote_addr [$time_local] "$request" $status $body_bytes_sent $request_time';
    {access}
    client_body_temp_path {work}/body;
    proxy_temp_path {work}/proxy;
    fastcgi_temp_path {work}/fastcgi;
    uwsgi_temp_path {work}/uwsgi;
    scgi_temp_path {work}/scgi;
    server_tokens off;
    client_max_body_size 0;
    proxy_request_buffering off;
    proxy_buffering off;
    proxy_read_timeout 3600s;
    proxy_send_timeout 3600s;
    server {{
        listen {listen}{" ssl" if tls else ""};{server_tls}
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


def compose_conf() -> str:
    """The configuration docker-compose's ``proxy`` service mounts (``deploy/proxy/nginx.conf``):
    the sites' port 9093 on every interface of the SuperLink's network namespace, the
    SuperLink on its loopback port 9091, the certificates mounted under ``/certs``."""
    return nginx_conf("0.0.0.0:9093", "127.0.0.1:9091", "/tmp/nginx",
                      ProxyTLS("/certs/server.pem", "/certs/server.key", "/certs/ca.crt"),
                      access_log="/dev/stdout")


def write_conf(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` (0600; the directory 0700) and make the work directory."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)
    return path


__all__ = ["FLEET_PATH", "ProxyTLS", "compose_conf", "nginx_conf", "write_conf"]
