"""What binds a Runtime or Fleet request to the party that may make it: small pure parts.

Flower 1.41/1.42 authenticates an app process's Runtime API calls by its task token alone
(only ``AcquireTask`` carries the SuperExec's HMAC), and a SuperNode's Fleet API calls by a
signed timestamp that covers neither the request nor a nonce.  fedsys's guarded patches
(:mod:`fedsys_launch.flower_patches`: ``signed-task-calls``, ``fleet-ownership``,
``bound-node-signatures``) add what is missing; this module holds their arithmetic, with no
Flower internals:

* a **task key**, ``HMAC(derive_auth_secret(secret), "fedsys-task-key" || token)``: the
  SuperExec that acquired the task (it holds the site's or the server's SuperExec secret)
  hands it to its app process in memory; every Runtime call of that process is signed with
  it over the path, a timestamp, a nonce and the body's digest.  The token alone, wherever
  it leaks, signs nothing, and a signature is good once.
* a **bound node signature**: the SuperNode's key signs the path, a timestamp, a nonce and
  the body's digest, so a captured header neither replays nor covers another request.
* an **ownership index** of the SuperLink: which messages (and the objects of their trees)
  were handed to which node, so a node pulls and confirms only its own.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping

#: headers of a signed Runtime call (beside Flower's task-token header)
TASK_TS = "x-fedsys-task-ts"
TASK_NONCE = "x-fedsys-task-nonce"
TASK_BODY = "x-fedsys-task-body-sha256"
TASK_SIGNATURE = "x-fedsys-task-signature"
TASK_HEADERS = (TASK_TS, TASK_NONCE, TASK_BODY, TASK_SIGNATURE)

#: headers of a bound node signature (beside Flower's public-key header)
NODE_NONCE = "x-fedsys-node-nonce"
NODE_BODY = "x-fedsys-node-body-sha256"
NODE_SIGNATURE = "x-fedsys-node-signature"

#: how far a signed call's clock may be from ours, either way (Flower's SuperExec window)
MAX_SKEW_S = 300
TASK_KEY_CONTEXT = b"fedsys-task-key\x00"


def task_key(auth_secret: bytes, token: str) -> bytes:
    """The key an app process signs its Runtime calls with.

    Parameters
    ----------
    auth_secret : bytes
        Flower's auth-scope secret of the SuperExec secret
        (``flwr.supercore.auth.derive_auth_secret``).
    token : str
        The task's token, as the Runtime API issued it.

    Returns
    -------
    bytes
        32 bytes that only a holder of the SuperExec secret can make from the token.
    """
    return hmac.new(auth_secret, TASK_KEY_CONTEXT + token.encode(), hashlib.sha256).digest()


def digest(body: bytes) -> str:
    """The hex SHA-256 of a request body."""
    return hashlib.sha256(body).hexdigest()


def canonical(path: str, timestamp: int | str, nonce: str, body_sha256: str) -> bytes:
    """The bytes a signature covers: the request's path, time, nonce and body digest."""
    return f"fedsys-v1\npath={path}\nts={timestamp}\nnonce={nonce}\nbody={body_sha256}".encode()


def sign_task_call(key: bytes, path: str, body: bytes,
                   clock: Callable[[], float] = time.time) -> dict[str, str]:
    """The headers that sign one Runtime call with a task key."""
    ts, nonce, body_sha = int(clock()), secrets.token_hex(16), digest(body)
    mac = hmac.new(key, canonical(path, ts, nonce, body_sha), hashlib.sha256).hexdigest()
    return {TASK_TS: str(ts), TASK_NONCE: nonce, TASK_BODY: body_sha, TASK_SIGNATURE: mac}


class NonceStore:
    """Nonces seen within the signature window, in this process (the SuperLink and each
    SuperNode serve from one process); a nonce is good once."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()
        self._clock = clock

    def reserve(self, nonce: str, expires_at: float) -> bool:
        """Whether ``nonce`` was unused (it is used from now until ``expires_at``)."""
        with self._lock:
            now = self._clock()
            if len(self._seen) > 4096:
                self._seen = {n: t for n, t in self._seen.items() if t > now}
            if self._seen.get(nonce, 0.0) > now:
                return False
            self._seen[nonce] = expires_at
            return True


def fresh(timestamp: str, clock: Callable[[], float] = time.time) -> int | None:
    """The timestamp as an integer when it is within :data:`MAX_SKEW_S` of now, else None."""
    try:
        ts = int(timestamp)
    except ValueError:
        return None
    return ts if abs(clock() - ts) < MAX_SKEW_S else None


def check_task_call(key: bytes, path: str, body: bytes, headers: Mapping[str, str],
                    nonces: NonceStore, clock: Callable[[], float] = time.time) -> str | None:
    """Why a Runtime call is not signed with ``key`` for this path and body, or None.

    The nonce is reserved last, so a refused call uses none up.
    """
    values = [headers.get(h, "") for h in TASK_HEADERS]
    if not all(values):
        return "not signed with the task's key"
    ts_text, nonce, body_sha, mac = values
    ts = fresh(ts_text, clock)
    if ts is None:
        return "signature outside the time window"
    if body_sha != digest(body):
        return "body does not match its signature"
    want = hmac.new(key, canonical(path, ts, nonce, body_sha), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(want, mac):
        return "signature does not match the task's key"
    if not nonces.reserve(nonce, ts + MAX_SKEW_S):
        return "signature used before"
    return None


class Ownership:
    """Which node was handed which message, and which objects make up each message.

    The SuperLink records a message when its Fleet API hands it to a node; a node's later
    ``pull-object``, ``confirm-message-received`` and reply (``push-messages``) are checked
    against it.  Entries of a run go when the run does (:meth:`forget_run`).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: (node, run) -> message ids handed to that node
        self._messages: dict[tuple[int, int], set[str]] = {}
        #: (node, run) -> object ids of those messages' trees
        self._objects: dict[tuple[int, int], set[str]] = {}

    def handed(self, node: int, run: int, message_id: str, object_ids: Iterable[str]) -> None:
        """Record that ``message_id`` (with the objects of its tree) went to ``node``."""
        with self._lock:
            self._messages.setdefault((node, run), set()).add(message_id)
            self._objects.setdefault((node, run), set()).update(object_ids)

    def may_pull(self, node: int, run: int, object_id: str) -> bool:
        """Whether ``object_id`` belongs to a message handed to ``node`` in ``run``."""
        with self._lock:
            return object_id in self._objects.get((node, run), ())

    def may_confirm(self, node: int, run: int, message_id: str) -> bool:
        """Whether ``message_id`` was handed to ``node`` in ``run``."""
        with self._lock:
            return message_id in self._messages.get((node, run), ())

    def forget_run(self, run: int) -> None:
        """Drop every entry of ``run``."""
        with self._lock:
            for table in (self._messages, self._objects):
                for k in [k for k in table if k[1] == run]:
                    del table[k]

    def runs(self) -> set[int]:
        """The runs with entries."""
        with self._lock:
            return {run for _, run in self._messages}


def reply_refusal(authenticated: int, src_node_id: int, run: int, reply_to: str,
                  ownership: Ownership) -> str | None:
    """Why a node's reply is refused, or None: it must come from the node that sends it,
    and answer a message handed to that node."""
    if src_node_id != authenticated:
        return f"reply claims node {src_node_id}, sent by node {authenticated}"
    if not ownership.may_confirm(authenticated, run, reply_to):
        return f"reply to message {reply_to[:12]}... which was not handed to node {authenticated}"
    return None


def unanswered(open_tasks: int, created_at: float, ttl: float, now: float,
               lease_s: float) -> str | None:
    """Why a SuperNode stops waiting for the reply to a message it handed out, or None.

    Parameters
    ----------
    open_tasks : int
        The message run's tasks not finished (pending, claimed or running).
    created_at, ttl : float
        The message's creation time (Unix seconds) and time to live, as Flower sets them.
    now : float
        The time now.
    lease_s : float
        The longest a message's task may hold the node (``FEDSYS_TASK_LEASE_S``).

    Returns
    -------
    str or None
        ``None`` while the task may still answer, else the reason logged with the
        error reply the node sends in its place.
    """
    if open_tasks == 0:
        return "its task ended without a reply"
    if now >= created_at + ttl:
        return f"not answered within its time to live ({ttl:g} s)"
    if now >= created_at + lease_s:
        return f"not answered within the task lease ({lease_s:g} s)"
    return None


__all__ = ["MAX_SKEW_S", "NODE_BODY", "NODE_NONCE", "NODE_SIGNATURE", "TASK_HEADERS",
           "NonceStore", "Ownership", "canonical", "check_task_call", "digest", "fresh",
           "reply_refusal", "sign_task_call", "task_key", "unanswered"]
