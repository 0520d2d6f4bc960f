"""fedsys_launch/runtime_auth.py: the arithmetic of the security patches (task keys, signed
Runtime calls, the nonce store, the SuperLink's ownership index, a SuperNode's reasons to
stop waiting for a reply).  Golden values were computed with ``openssl dgst -hmac`` and
``sha256sum``, not with the code under test.  That the patches use these on Flower's own
objects is in test_security_patches.py."""

from __future__ import annotations

import hashlib
import hmac

import pytest

from fedsys_launch import runtime_auth as ra

SECRET = b"auth-secret"
TOKEN = "t0k3n"
#: printf 'fedsys-task-key\x00t0k3n' | openssl dgst -sha256 -hmac 'auth-secret'
KEY_HEX = "10a430a7562bc6a764af14f82badf82288bcf15b027038f258ae26ba2169729e"
#: printf 'body' | sha256sum
BODY_SHA = "230d8358dc8e8890b4c58deeb62912ee2f20357ae92a5cc861b98e68fe31acb5"
#: the HMAC under KEY_HEX of "fedsys-v1\npath=/v1/pull-task-input\nts=1700000000\n
#: nonce=ab12\nbody=<BODY_SHA>" (openssl dgst -sha256 -mac HMAC -macopt hexkey:KEY_HEX)
MAC_HEX = "c070ba10db29a57b28bc05e95ba392812e14f8ae4c0554c62f0238236d4690f6"
PATH = "/v1/pull-task-input"
T0 = 1_700_000_000.0


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _signed(key: bytes = bytes.fromhex(KEY_HEX), path: str = PATH, body: bytes = b"body",
            at: float = T0) -> dict[str, str]:
    return ra.sign_task_call(key, path, body, clock=lambda: at)


# ------------------------------------------------------------------ golden values

def test_task_key_is_the_hmac_of_the_token_under_the_auth_secret() -> None:
    assert ra.task_key(SECRET, TOKEN).hex() == KEY_HEX
    assert ra.task_key(SECRET, TOKEN + "x") != ra.task_key(SECRET, TOKEN)
    assert ra.task_key(b"other-secret", TOKEN) != ra.task_key(SECRET, TOKEN)


def test_the_signature_covers_path_time_nonce_and_body(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ra.digest(b"body") == BODY_SHA
    assert ra.canonical(PATH, 1_700_000_000, "ab12", BODY_SHA) == (
        b"fedsys-v1\npath=/v1/pull-task-input\nts=1700000000\nnonce=ab12\nbody=" +
        BODY_SHA.encode())
    monkeypatch.setattr(ra.secrets, "token_hex", lambda n: "ab12")
    headers = ra.sign_task_call(bytes.fromhex(KEY_HEX), PATH, b"body", clock=lambda: T0 + 0.4)
    assert headers == {ra.TASK_TS: "1700000000", ra.TASK_NONCE: "ab12", ra.TASK_BODY: BODY_SHA,
                       ra.TASK_SIGNATURE: MAC_HEX}
    assert set(headers) == set(ra.TASK_HEADERS)


def test_nonces_are_fresh_per_call() -> None:
    a, b = _signed(), _signed()
    assert a[ra.TASK_NONCE] != b[ra.TASK_NONCE] and len(a[ra.TASK_NONCE]) == 32
    assert a[ra.TASK_SIGNATURE] != b[ra.TASK_SIGNATURE]


# ------------------------------------------------------------------ check_task_call

def test_a_signed_call_passes_once() -> None:
    key, clock = bytes.fromhex(KEY_HEX), Clock(T0 + 10)
    nonces = ra.NonceStore(clock)
    headers = _signed()
    assert ra.check_task_call(key, PATH, b"body", headers, nonces, clock) is None
    assert ra.check_task_call(key, PATH, b"body", headers, nonces, clock) == \
        "signature used before"
    # a second call, signed anew, passes
    assert ra.check_task_call(key, PATH, b"body", _signed(), nonces, clock) is None


@pytest.mark.parametrize("missing", ra.TASK_HEADERS)
def test_a_call_without_each_header_is_refused(missing: str) -> None:
    headers = {k: v for k, v in _signed().items() if k != missing}
    nonces = ra.NonceStore(Clock())
    assert ra.check_task_call(bytes.fromhex(KEY_HEX), PATH, b"body", headers, nonces,
                              Clock()) == "not signed with the task's key"
    empty = {**_signed(), missing: ""}
    assert ra.check_task_call(bytes.fromhex(KEY_HEX), PATH, b"body", empty, nonces,
                              Clock()) == "not signed with the task's key"


@pytest.mark.parametrize(("skew", "ok"), [(0, True), (299, True), (-299, True), (300, False),
                                          (-300, False), (3600, False)])
def test_the_time_window_is_300_s_either_way(skew: float, ok: bool) -> None:
    clock = Clock(T0 + skew)
    why = ra.check_task_call(bytes.fromhex(KEY_HEX), PATH, b"body", _signed(),
                             ra.NonceStore(clock), clock)
    assert (why is None) is ok
    if not ok:
        assert why == "signature outside the time window"


def test_an_unreadable_timestamp_is_refused() -> None:
    headers = {**_signed(), ra.TASK_TS: "yesterday"}
    assert ra.fresh("yesterday") is None and ra.fresh("1700000000", Clock()) == 1_700_000_000
    assert ra.check_task_call(bytes.fromhex(KEY_HEX), PATH, b"body", headers,
                              ra.NonceStore(Clock()), Clock()) == \
        "signature outside the time window"


def test_a_changed_body_path_or_key_is_refused_and_uses_no_nonce() -> None:
    key, clock = bytes.fromhex(KEY_HEX), Clock()
    nonces = ra.NonceStore(clock)
    headers = _signed()
    # the body changed, its digest header kept
    assert ra.check_task_call(key, PATH, b"b0dy", headers, nonces, clock) == \
        "body does not match its signature"
    # the body and its digest changed together: the signature no longer matches
    forged = {**headers, ra.TASK_BODY: ra.digest(b"b0dy")}
    assert ra.check_task_call(key, PATH, b"b0dy", forged, nonces, clock) == \
        "signature does not match the task's key"
    # another path (a signature for pull-task-input sent to push-task-output)
    assert ra.check_task_call(key, "/v1/push-task-output", b"body", headers, nonces, clock) == \
        "signature does not match the task's key"
    # another task's key (or one made from the token without the SuperExec secret)
    for wrong in (ra.task_key(SECRET, "another-token"), TOKEN.encode(),
                  hashlib.sha256(TOKEN.encode()).digest()):
        assert ra.check_task_call(wrong, PATH, b"body", headers, nonces, clock) == \
            "signature does not match the task's key"
    # another time in the header than the one signed
    moved = {**headers, ra.TASK_TS: str(int(T0) + 1)}
    assert ra.check_task_call(key, PATH, b"body", moved, nonces, clock) == \
        "signature does not match the task's key"
    # none of the refusals used the nonce up: the genuine call still passes, once
    assert ra.check_task_call(key, PATH, b"body", headers, nonces, clock) is None
    assert ra.check_task_call(key, PATH, b"body", headers, nonces, clock) == \
        "signature used before"


def test_the_mac_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str]] = []
    real = hmac.compare_digest

    def compare(a: str, b: str) -> bool:
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr(ra.hmac, "compare_digest", compare)
    clock = Clock()
    assert ra.check_task_call(bytes.fromhex(KEY_HEX), PATH, b"body", _signed(),
                              ra.NonceStore(clock), clock) is None
    assert len(seen) == 1 and seen[0][0] == seen[0][1]


# ------------------------------------------------------------------ NonceStore

def test_a_nonce_is_good_once_until_it_expires() -> None:
    clock = Clock(100.0)
    store = ra.NonceStore(clock)
    assert store.reserve("n1", 200.0)
    assert not store.reserve("n1", 500.0)
    assert store.reserve("n2", 200.0)  # another nonce
    clock.t = 199.9
    assert not store.reserve("n1", 300.0)
    clock.t = 200.0  # expired: its signature's window is over, so it may be seen again
    assert store.reserve("n1", 300.0)
    assert not store.reserve("n1", 300.0)


def test_the_nonce_store_forgets_expired_nonces_only() -> None:
    clock = Clock(0.0)
    store = ra.NonceStore(clock)
    for i in range(5000):
        assert store.reserve(f"old{i}", 10.0)
    assert store.reserve("live", 1000.0)
    clock.t = 20.0
    assert store.reserve("trigger", 1000.0)  # over 4096 held: the expired go
    assert len(store._seen) == 2
    assert not store.reserve("live", 1000.0) and not store.reserve("trigger", 1000.0)


def test_a_window_full_of_live_nonces_keeps_them_all() -> None:
    clock = Clock(0.0)
    store = ra.NonceStore(clock)
    for i in range(4200):
        assert store.reserve(f"n{i}", 600.0)
    assert all(not store.reserve(f"n{i}", 600.0) for i in range(0, 4200, 97))


# ------------------------------------------------------------------ Ownership

def test_a_node_may_pull_and_confirm_only_what_was_handed_to_it() -> None:
    own = ra.Ownership()
    own.handed(1, 7, "m1", ["m1", "a1", "b1"])
    own.handed(2, 7, "m2", ["m2", "a2", "shared"])
    own.handed(1, 8, "m3", ["m3", "shared"])
    assert own.may_pull(1, 7, "a1") and own.may_pull(1, 7, "m1")
    assert not own.may_pull(2, 7, "a1") and not own.may_pull(1, 7, "a2")
    assert not own.may_pull(1, 7, "shared") and own.may_pull(1, 8, "shared")  # per run
    assert not own.may_pull(3, 7, "a1")  # a node handed nothing
    assert own.may_confirm(1, 7, "m1") and own.may_confirm(2, 7, "m2")
    assert not own.may_confirm(2, 7, "m1") and not own.may_confirm(1, 8, "m1")
    assert not own.may_confirm(1, 7, "a1")  # an object id is not a message handed
    assert own.runs() == {7, 8}
    own.forget_run(7)
    assert own.runs() == {8}
    assert not own.may_pull(1, 7, "a1") and not own.may_confirm(2, 7, "m2")
    assert own.may_pull(1, 8, "shared") and own.may_confirm(1, 8, "m3")  # the other run stays
    own.forget_run(99)  # a run with no entries
    assert own.runs() == {8}


def test_a_second_message_to_a_node_adds_to_what_it_holds() -> None:
    own = ra.Ownership()
    own.handed(1, 7, "m1", ["a"])
    own.handed(1, 7, "m2", ["b"])
    assert own.may_pull(1, 7, "a") and own.may_pull(1, 7, "b")
    assert own.may_confirm(1, 7, "m1") and own.may_confirm(1, 7, "m2")


def test_a_reply_must_come_from_its_sender_and_answer_a_message_handed_to_it() -> None:
    own = ra.Ownership()
    own.handed(1, 7, "m1" * 10, [])
    own.handed(2, 7, "m2" * 10, [])
    assert ra.reply_refusal(1, 1, 7, "m1" * 10, own) is None
    assert ra.reply_refusal(2, 1, 7, "m1" * 10, own) == "reply claims node 1, sent by node 2"
    why = ra.reply_refusal(2, 2, 7, "m1" * 10, own)
    assert why == "reply to message m1m1m1m1m1m1... which was not handed to node 2"
    assert ra.reply_refusal(1, 1, 8, "m1" * 10, own) is not None  # another run
    assert ra.reply_refusal(1, 1, 7, "", own) is not None  # a reply to nothing


# ------------------------------------------------------------------ unanswered

def test_why_a_node_stops_waiting_for_a_reply() -> None:
    # (open tasks, created at, ttl, now, lease) -> reason
    assert ra.unanswered(1, 1000.0, 600.0, 1599.0, 3600.0) is None  # within TTL and lease
    assert ra.unanswered(0, 1000.0, 600.0, 1001.0, 3600.0) == "its task ended without a reply"
    assert ra.unanswered(1, 1000.0, 600.0, 1600.0, 3600.0) == \
        "not answered within its time to live (600 s)"
    assert ra.unanswered(2, 1000.0, 43200.0, 4600.0, 3600.0) == \
        "not answered within the task lease (3600 s)"
    assert ra.unanswered(1, 1000.0, 43200.0, 4599.0, 3600.0) is None
    # the reasons in order: a task gone first, then the TTL, then the lease
    assert ra.unanswered(0, 1000.0, 1.0, 9e9, 1.0) == "its task ended without a reply"
    assert ra.unanswered(1, 1000.0, 1.5, 9e9, 1.0).startswith("not answered within its time")
