"""The security patches of fedsys_launch/flower_patches.py (issue 75) on Flower's own objects:
``signed-task-calls`` (with the app process's side, ``sign_task_calls``), ``task-lease``,
``fleet-ownership`` and ``bound-node-signatures``; and each security patch whose target
does not fit stopping its component.  Every test puts back what it patches (monkeypatch).
The deployments in tests/integration/test_deploy_redteam.py attack the same protections
from outside."""

from __future__ import annotations

import datetime
import importlib
import threading
import time
from base64 import b64encode
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from fastapi import HTTPException
from flwr.app import Message, Metadata, RecordDict
from flwr.common.constant import TIMESTAMP_HEADER, ErrorCode, Status, SubStatus
from flwr.proto.fleet_pb2 import (
    PullMessagesRequest,
    PullMessagesResponse,
    PushMessagesRequest,
    RegisterNodeFleetRequest,
)
from flwr.proto.message_pb2 import ConfirmMessageReceivedRequest, ObjectTree, PullObjectRequest
from flwr.proto.message_pb2 import Message as ProtoMessage
from flwr.proto.message_pb2 import Metadata as ProtoMetadata
from flwr.proto.node_pb2 import Node
from flwr.proto.task_pb2 import Task
from flwr.supercore.auth import derive_auth_secret
from flwr.supercore.constant import (
    FLEET_HTTP_PUBLIC_KEY_HEADER,
    FLEET_HTTP_SIGNATURE_HEADER,
    TASK_TOKEN_HEADER,
    TaskType,
)
from flwr.supercore.date import now
from flwr.supercore.dependencies import runtime
from flwr.supercore.error import FlowerError
from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor
from flwr.supercore.object_store import ObjectStoreFactory
from flwr.supercore.primitives.asymmetric import (
    generate_key_pairs,
    public_key_to_bytes,
    sign_message,
)
from flwr.superlink.routers.fleet import node_auth
from flwr.superlink.servicer.fleet import fleet_handlers as fh
from flwr.supernode import start_client_internal as sci
from flwr.supernode.node_auth_http_interceptor import NodeAuthHttpInterceptor
from flwr.supernode.nodestate.in_memory_nodestate import InMemoryNodeState
from starlette.datastructures import Headers

from fedsys_launch import flower_patches
from fedsys_launch import runtime_auth as ra


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flower_patches, "_warned", set())


def _warnings(caplog: pytest.LogCaptureFixture, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelname == "WARNING" and f"patch '{name}'" in r.getMessage()]


# ------------------------------------------------------------------ signed-task-calls

SECRET = b"the site's SuperExec secret"
TOKEN = "a" * 64
TASK = Task(task_id=5, run_id=3)
RUNTIME_PATH = "/v1/pull-task-input"
BODY = PullObjectRequest(run_id=3, object_id="0" * 64)


class RuntimeState:
    """Stands in for the Runtime API's state: one task, by its token."""

    def get_task_by_token(self, token: str) -> Task | None:
        return TASK if token == TOKEN else None


def runtime_request(headers: dict[str, str], path: str = RUNTIME_PATH, body: Any = BODY,
                    secret: bytes | None = SECRET, token: str = TOKEN) -> Any:
    """Stands in for the Runtime API's starlette request, as Flower's dependency sees it."""
    return SimpleNamespace(
        headers=Headers(headers={TASK_TOKEN_HEADER: token, **headers}),
        url=SimpleNamespace(path=path),
        app=SimpleNamespace(state=SimpleNamespace(superexec_auth_secret=secret)),
        state=SimpleNamespace(protobuf_request=body))


def _authenticate(request: Any, token: str = TOKEN) -> Task:
    """Flower's Runtime dependency (``get_task``), which calls ``authenticate_task``."""
    return runtime.get_task(request, token, RuntimeState())  # type: ignore[arg-type]


def _task_key(secret: bytes = SECRET, token: str = TOKEN) -> bytes:
    return ra.task_key(derive_auth_secret(secret), token)


def _signed(key: bytes | None = None, path: str = RUNTIME_PATH, body: Any = BODY) -> dict[str, str]:
    return ra.sign_task_call(key or _task_key(), path, body.SerializeToString(deterministic=True))


@pytest.fixture
def task_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "authenticate_task", runtime.authenticate_task)
    assert flower_patches.signed_task_calls({})


@pytest.mark.usefixtures("task_calls")
def test_a_runtime_call_with_the_token_alone_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(FlowerError):
        _authenticate(runtime_request({}))
    assert "Runtime call /v1/pull-task-input of task 5 refused: not signed" in caplog.text


@pytest.mark.usefixtures("task_calls")
def test_a_call_signed_with_the_task_key_passes_once() -> None:
    headers = _signed()
    assert _authenticate(runtime_request(headers)) == TASK
    with pytest.raises(FlowerError):  # replayed
        _authenticate(runtime_request(headers))
    assert _authenticate(runtime_request(_signed())) == TASK  # signed anew


@pytest.mark.usefixtures("task_calls")
def test_a_signature_for_another_body_path_or_key_is_refused() -> None:
    headers = _signed()
    other = PullObjectRequest(run_id=3, object_id="1" * 64)
    for request in (runtime_request(headers, body=other),
                    runtime_request(headers, path="/v1/push-task-output"),
                    runtime_request(_signed(key=_task_key(b"another secret"))),
                    runtime_request(_signed(key=TOKEN.encode()))):
        with pytest.raises(FlowerError):
            _authenticate(request)
    assert _authenticate(runtime_request(headers)) == TASK  # the refusals used no nonce


@pytest.mark.usefixtures("task_calls")
def test_the_token_is_still_checked_first() -> None:
    with pytest.raises(FlowerError):  # a signature with a key of an unknown token
        _authenticate(runtime_request(_signed(key=_task_key(token="b" * 64)), token="b" * 64),
                      token="b" * 64)


@pytest.mark.usefixtures("task_calls")
def test_without_a_superexec_secret_flowers_check_alone_stands() -> None:
    assert _authenticate(runtime_request({}, secret=None)) == TASK


def test_an_app_process_signs_each_runtime_call_its_runtime_api_accepts(
        monkeypatch: pytest.MonkeyPatch, task_calls: None) -> None:
    """The app process's side (``sign_task_calls``, set up by ``run_app``) with the Runtime
    API's (``signed-task-calls``): Flower's own interceptor, patched, then Flower's own
    dependency."""
    monkeypatch.setattr(RuntimeTokenHttpInterceptor, "intercept",
                        RuntimeTokenHttpInterceptor.intercept)
    flower_patches.sign_task_calls({TOKEN: _task_key()})

    def send(token: str, path: str) -> Any:
        request = httpx.Request("POST", f"http://127.0.0.1:9094{path}",
                                content=BODY.SerializeToString())
        context = SimpleNamespace(rpc_method=path, message=BODY, request=request)
        return RuntimeTokenHttpInterceptor(token).intercept(context, lambda c: c.request)

    sent = send(TOKEN, RUNTIME_PATH)
    assert sent.headers[TASK_TOKEN_HEADER] == TOKEN
    assert all(h in sent.headers for h in ra.TASK_HEADERS)
    received = runtime_request({k: v for k, v in sent.headers.items()
                                if k in ra.TASK_HEADERS}, path=sent.url.path)
    assert _authenticate(received) == TASK
    # a token the process holds no key for (another task's) is sent as Flower sends it
    other = send("c" * 64, RUNTIME_PATH)
    assert other.headers[TASK_TOKEN_HEADER] == "c" * 64
    assert not any(h in other.headers for h in ra.TASK_HEADERS)


# ------------------------------------------------------------------ task-lease

RUN = 11


def _node_state() -> InMemoryNodeState:
    state = InMemoryNodeState(ObjectStoreFactory().store())
    state.set_node_id(3)
    return state


def _handed(state: InMemoryNodeState, ttl: float = 600.0, age: float = 0.0,
            status: str = Status.RUNNING) -> tuple[Message, int]:
    """A message the SuperLink handed the node, its task created as Flower's SuperNode
    does, and taken by its ClientApp up to ``status``."""
    meta = Metadata(run_id=RUN, message_id="", src_node_id=1, dst_node_id=3,
                    reply_to_message_id="", group_id="1", created_at=time.time() - age,
                    ttl=ttl, message_type="train")
    msg = Message(metadata=meta, content=RecordDict())
    msg.metadata.__dict__["_message_id"] = msg.object_id
    task_id = state.create_task(task_type=TaskType.CLIENT_APP, run_id=RUN, fab_hash="f" * 64)
    assert task_id is not None
    state.store_message(msg)
    if status != Status.PENDING:
        assert state.claim_task(task_id)
    if status in (Status.RUNNING, Status.FINISHED):
        assert state.activate_task(task_id)
        assert len(state.get_messages_legacy(run_ids=[RUN], is_reply=False)) == 1  # pulled
    return msg, task_id


def _replies(state: InMemoryNodeState) -> list[Message]:
    return [e.message for e in state.msg_store.values() if e.message.metadata.reply_to_message_id]


def _status(state: InMemoryNodeState, task_id: int) -> str:
    return state.get_tasks(task_ids=[task_id])[0].status.status


def test_a_task_ended_without_a_reply_is_answered_at_once(caplog: pytest.LogCaptureFixture) -> None:
    state = _node_state()
    msg, task_id = _handed(state)
    assert state.finish_task(task_id, SubStatus.FAILED, "the ClientApp was killed")
    assert _replies(state) == []  # Flower itself answers only an AgentApp's failure
    said = flower_patches.answer_dropped(state, 3600.0, time.time)
    assert said == [f"message {msg.metadata.message_id[:12]}... of run {RUN}: "
                    "its task ended without a reply"]
    (reply,) = _replies(state)
    assert reply.metadata.reply_to_message_id == msg.metadata.message_id
    assert reply.has_error() and reply.error.code == ErrorCode.CLIENT_APP_CRASHED
    assert reply.metadata.src_node_id == 3 and reply.metadata.dst_node_id == 1
    assert "its task ended without a reply: error reply sent" in caplog.text
    assert flower_patches.answer_dropped(state, 3600.0, time.time) == []  # answered once


@pytest.mark.parametrize(("ttl", "age", "lease", "why"), [
    (60.0, 61.0, 3600.0, "not answered within its time to live (60 s)"),
    (43200.0, 3601.0, 3600.0, "not answered within the task lease (3600 s)"),
])
def test_a_task_that_outlived_its_ttl_or_lease_is_finished_and_answered(
        ttl: float, age: float, lease: float, why: str) -> None:
    state = _node_state()
    msg, task_id = _handed(state, ttl=ttl, age=age)
    assert _status(state, task_id) == Status.RUNNING
    said = flower_patches.answer_dropped(state, lease, time.time)
    assert len(said) == 1 and said[0].endswith(why)
    assert _status(state, task_id) == Status.FINISHED
    (reply,) = _replies(state)
    assert reply.metadata.reply_to_message_id == msg.metadata.message_id


@pytest.mark.parametrize("status", [Status.PENDING, Status.STARTING, Status.RUNNING])
def test_a_task_within_its_ttl_and_lease_is_left_alone(status: str) -> None:
    state = _node_state()
    _, task_id = _handed(state, ttl=600.0, age=30.0, status=status)
    assert flower_patches.answer_dropped(state, 3600.0, time.time) == []
    assert _replies(state) == [] and _status(state, task_id) == status


def test_a_message_already_answered_is_left_alone() -> None:
    state = _node_state()
    msg, task_id = _handed(state)
    assert state.finish_task(task_id, SubStatus.COMPLETED, "")
    reply = Message(metadata=Metadata(
        run_id=RUN, message_id="r" * 64, src_node_id=3, dst_node_id=1,
        reply_to_message_id=msg.metadata.message_id, group_id="1", created_at=time.time(),
        ttl=600.0, message_type="train"), content=RecordDict())
    state.store_message(reply)
    assert flower_patches.answer_dropped(state, 3600.0, time.time) == []
    assert _replies(state) == [reply]


def test_a_message_left_by_a_stopped_run_is_dropped_with_its_task(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Flower's pull stage leaves a message whose run stopped while its objects were pulled
    (RunNotRunningException: it returns None with the message and its pending task still
    stored); its ClientApp's late reply then went out after the node's next pull, every
    later reply one message late (test_deploy_tls, CI of 9bc...: rounds missed their
    timeouts).  With the lease, a pull that returns no message leaves none stored."""
    state, store = _node_state(), ObjectStoreFactory().store()
    msg, task_id = _handed(state, status=Status.PENDING)

    def flowers_pull(state: Any, object_store: Any, **kwargs: Any) -> int | None:
        return None  # the run stopped: Flower returns None, message and task left behind

    monkeypatch.setattr(sci, "_pull_and_store_message", flowers_pull)
    monkeypatch.setattr(sci, "_push_messages", sci._push_messages)
    assert flower_patches.task_lease(3600.0, {})
    assert sci._pull_and_store_message(state=state, object_store=store) is None
    assert list(state.msg_store) == [] and _status(state, task_id) == Status.FINISHED
    assert state.get_tasks(task_ids=[task_id])[0].status.sub_status == SubStatus.STOPPED
    assert "will not be answered" in caplog.text and msg.metadata.message_id[:12] in caplog.text
    # a pull that returns a run id (a message to answer) leaves it alone
    msg2, task2 = _handed(state, status=Status.PENDING)
    monkeypatch.setattr(sci, "_pull_and_store_message", lambda state, object_store: RUN)
    assert flower_patches.task_lease(3600.0, {})
    assert sci._pull_and_store_message(state=state, object_store=store) == RUN
    assert list(state.msg_store) == [msg2.metadata.message_id]
    assert _status(state, task2) == Status.PENDING


def test_the_push_stage_serves_the_next_message_after_a_dropped_task(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Flower's push stage waits for a reply; with the lease, a dropped task's error reply
    is made and pushed, and the SuperNode's loop goes on to the next message."""
    pushed: list[list[Message]] = []

    def flowers_push(state: Any, object_store: Any, send: Any, push_object: Any) -> None:
        pushed.append(list(state.get_messages_legacy(is_reply=True)))

    monkeypatch.setattr(sci, "_push_messages", flowers_push)
    monkeypatch.setattr(sci, "_pull_and_store_message", sci._pull_and_store_message)
    assert flower_patches.task_lease(3600.0, {}, poll_s=0.01)
    state = _node_state()
    msg, task_id = _handed(state)
    assert state.finish_task(task_id, SubStatus.FAILED, "killed")
    done = threading.Thread(target=sci._push_messages, daemon=True,
                            kwargs={"state": state, "object_store": None, "send": None,
                                    "push_object": None})
    done.start()
    done.join(20)
    assert not done.is_alive(), "the push stage still waits for a reply"
    assert len(pushed) == 1 and [m.metadata.reply_to_message_id for m in pushed[0]] == [
        msg.metadata.message_id]


# ------------------------------------------------------------------ fleet-ownership

class LinkState:
    """Stands in for the SuperLink's LinkState: each run's status."""

    def __init__(self) -> None:
        self.finished: set[int] = set()

    def get_run_status(self, run_ids: set[int]) -> dict[int, Any]:
        return {r: SimpleNamespace(status=Status.FINISHED if r in self.finished
                                   else Status.RUNNING) for r in run_ids}


def _message(node: int, run: int = 7) -> tuple[ProtoMessage, ObjectTree]:
    mid = f"{node}" * 64
    msg = ProtoMessage(metadata=ProtoMetadata(run_id=run, message_id=mid, src_node_id=0,
                                              dst_node_id=node, message_type="train"))
    tree = ObjectTree(object_id=mid, children=[
        ObjectTree(object_id=f"a{node}" * 32, children=[ObjectTree(object_id="shared" * 10)])])
    return msg, tree


@pytest.fixture
def fleet(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Flower's four handlers replaced by recorders (put back after), then the patch."""
    seen: list[tuple[str, Any]] = []

    def pull_messages(request: Any, state: Any, store: Any) -> PullMessagesResponse:
        seen.append(("pull_messages", request))
        msg, tree = _message(request.node.node_id)
        return PullMessagesResponse(messages_list=[msg], message_object_trees=[tree])

    def push_messages(request: Any, state: Any) -> str:
        seen.append(("push_messages", request))
        return "pushed"

    def pull_object(request: Any, state: Any) -> str:
        seen.append(("pull_object", request))
        return "object"

    def confirm_message_received(request: Any, state: Any, store: Any) -> str:
        seen.append(("confirm_message_received", request))
        return "confirmed"

    for f in (pull_messages, push_messages, pull_object, confirm_message_received):
        monkeypatch.setattr(fh, f.__name__, f)
    assert flower_patches.fleet_ownership({})
    return seen


def _pull(node: int, state: LinkState) -> PullMessagesResponse:
    # as Flower's router calls the handlers: by keyword
    return fh.pull_messages(request=PullMessagesRequest(node=Node(node_id=node)), state=state,
                            store=None)


def _forbidden(call: Any) -> None:
    with pytest.raises(HTTPException) as raised:
        call()
    assert raised.value.status_code == 403


def test_a_node_pulls_only_objects_of_messages_handed_to_it(
        fleet: list[tuple[str, Any]], caplog: pytest.LogCaptureFixture) -> None:
    state = LinkState()
    _pull(1, state), _pull(2, state)
    mine = PullObjectRequest(node=Node(node_id=1), run_id=7, object_id="a1" * 32)
    theirs = PullObjectRequest(node=Node(node_id=1), run_id=7, object_id="a2" * 32)
    assert fh.pull_object(request=mine, state=state) == "object"
    _forbidden(lambda: fh.pull_object(request=theirs, state=state))
    assert "Fleet pull-object of node 1 refused" in caplog.text
    for oid in ("1" * 64, "shared" * 10):  # the message's root and a shared leaf
        assert fh.pull_object(request=PullObjectRequest(node=Node(node_id=1), run_id=7,
                                                        object_id=oid), state=state) == "object"
    # in another run, nothing was handed
    _forbidden(lambda: fh.pull_object(request=PullObjectRequest(
        node=Node(node_id=1), run_id=8, object_id="a1" * 32), state=state))
    served = [r for n, r in fleet if n == "pull_object"]
    assert served[0] is mine and theirs not in served  # Flower's handler got what was sent


def test_a_node_confirms_only_messages_handed_to_it(fleet: list[tuple[str, Any]]) -> None:
    state = LinkState()
    _pull(1, state), _pull(2, state)
    mine = ConfirmMessageReceivedRequest(node=Node(node_id=2), run_id=7,
                                         message_object_id="2" * 64)
    assert fh.confirm_message_received(request=mine, state=state, store=None) == "confirmed"
    for mid in ("1" * 64, "a2" * 32):  # another node's message; an object, not a message
        _forbidden(lambda mid=mid: fh.confirm_message_received(
            request=ConfirmMessageReceivedRequest(node=Node(node_id=2), run_id=7,
                                                  message_object_id=mid),
            state=state, store=None))
    assert [r for n, r in fleet if n == "confirm_message_received"] == [mine]


def test_a_node_replies_only_as_itself_to_a_message_handed_to_it(
        fleet: list[tuple[str, Any]]) -> None:
    state = LinkState()
    _pull(1, state), _pull(2, state)

    def reply(node: int, src: int, to: str) -> PushMessagesRequest:
        return PushMessagesRequest(node=Node(node_id=node), messages_list=[ProtoMessage(
            metadata=ProtoMetadata(run_id=7, message_id="r" * 64, src_node_id=src,
                                   dst_node_id=0, reply_to_message_id=to))])

    _forbidden(lambda: fh.push_messages(request=reply(2, 1, "1" * 64), state=state))
    _forbidden(lambda: fh.push_messages(request=reply(2, 2, "1" * 64), state=state))
    _forbidden(lambda: fh.push_messages(request=reply(2, 2, ""), state=state))
    good = reply(2, 2, "2" * 64)
    assert fh.push_messages(request=good, state=state) == "pushed"
    assert [r for n, r in fleet if n == "push_messages"] == [good]


def test_what_was_handed_goes_when_its_run_does(fleet: list[tuple[str, Any]]) -> None:
    state = LinkState()
    _pull(1, state)
    mine = PullObjectRequest(node=Node(node_id=1), run_id=7, object_id="a1" * 32)
    assert fh.pull_object(request=mine, state=state) == "object"
    state.finished.add(7)
    _pull(1, state)  # the next pull forgets finished runs
    # a finished run's request goes to Flower's handler, which refuses it in its own words
    # (a SuperNode reads those as the run's end); a 403 would not say so
    assert fh.pull_object(request=mine, state=state) == "object"
    assert fleet[-1][0] == "pull_object"


# ------------------------------------------------------------------ bound-node-signatures

NODE_ID = 7
FLEET_PATH = "/v1/fleet/pull-object"


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any, bytes]:
    """A node's key pair; the LinkState (Flower's and fedsys's lookups) knows it as node 7."""
    private, public = generate_key_pairs()
    public_bytes = public_key_to_bytes(public)
    linkstate = SimpleNamespace(
        get_node_id_by_public_key=lambda key: NODE_ID if key == public_bytes else None)
    linkstate_module = importlib.import_module("flwr.superlink.dependencies.linkstate")
    monkeypatch.setattr(linkstate_module, "get_linkstate", lambda request: linkstate)
    monkeypatch.setattr(node_auth, "get_linkstate", lambda request: linkstate)
    # both ends' functions come back after the test
    monkeypatch.setattr(NodeAuthHttpInterceptor, "intercept", NodeAuthHttpInterceptor.intercept)
    monkeypatch.setattr(node_auth, "authenticate_node", node_auth.authenticate_node)
    return private, public, public_bytes


FLOWERS_INTERCEPT = NodeAuthHttpInterceptor.intercept


def _send(keys: tuple[Any, Any, bytes], body: Any, path: str = FLEET_PATH,
          intercept: Any = None) -> httpx.Request:
    """What the SuperNode sends: Flower's request through its (patched) interceptor."""
    request = httpx.Request("POST", f"https://127.0.0.1:9095{path}",
                            content=body.SerializeToString(),
                            extensions={"proto": type(body)})
    context = SimpleNamespace(rpc_method=path, message=body, request=request)
    interceptor = NodeAuthHttpInterceptor(keys[0], keys[1])
    sent: httpx.Request = (intercept or NodeAuthHttpInterceptor.intercept)(
        interceptor, context, lambda c: c.request)
    return sent


def _received(sent: httpx.Request, body: Any = None, path: str | None = None,
              drop: tuple[str, ...] = ()) -> Any:
    """What the SuperLink's middleware hands ``authenticate_node``: the headers, the path
    and the body as parsed (or ``body`` in its place)."""
    return SimpleNamespace(
        headers=Headers(headers={k: v for k, v in sent.headers.items() if k not in drop}),
        url=SimpleNamespace(path=path or sent.url.path),
        state=SimpleNamespace(
            protobuf_request=body or sent.extensions["proto"].FromString(sent.content)))


def _unauthorized(request: Any) -> None:
    with pytest.raises(HTTPException) as raised:
        node_auth.authenticate_node(request)
    assert raised.value.status_code == 401


def _object(node: int = NODE_ID, oid: str = "a" * 64) -> PullObjectRequest:
    return PullObjectRequest(node=Node(node_id=node), run_id=3, object_id=oid)


@pytest.fixture
def bound(keys: tuple[Any, Any, bytes]) -> tuple[Any, Any, bytes]:
    assert flower_patches.sign_node_requests({})
    assert flower_patches.bound_node_signatures({})
    return keys


def test_a_bound_signature_is_good_once(bound: tuple[Any, Any, bytes],
                                       caplog: pytest.LogCaptureFixture) -> None:
    sent = _send(bound, _object())
    assert ra.NODE_NONCE in sent.headers and ra.NODE_BODY in sent.headers
    assert node_auth.authenticate_node(_received(sent)) is None
    _unauthorized(_received(sent))  # replayed
    assert "signature used before" in caplog.text
    assert node_auth.authenticate_node(_received(_send(bound, _object()))) is None


def test_a_bound_signature_covers_the_body_and_the_path(bound: tuple[Any, Any, bytes]) -> None:
    sent = _send(bound, _object())
    _unauthorized(_received(sent, body=_object(oid="b" * 64)))  # another object
    _unauthorized(_received(sent, path="/v1/fleet/confirm-message-received"))
    # a stripped bound signature is no Flower timestamp signature either
    _unauthorized(_received(sent, drop=(ra.NODE_NONCE, ra.NODE_BODY)))
    assert node_auth.authenticate_node(_received(sent)) is None  # no refusal used its nonce


def test_a_bound_signature_of_another_node_or_an_old_one_is_refused(
        bound: tuple[Any, Any, bytes]) -> None:
    _unauthorized(_received(_send(bound, _object(node=NODE_ID + 1))))  # not the key's node
    ts = (now() - datetime.timedelta(seconds=400)).isoformat()
    body = _object()
    body_sha = ra.digest(body.SerializeToString(deterministic=True))
    old = {FLEET_HTTP_PUBLIC_KEY_HEADER: b64encode(bound[2]).decode(), TIMESTAMP_HEADER: ts,
           ra.NODE_NONCE: "n" * 32, ra.NODE_BODY: body_sha,
           FLEET_HTTP_SIGNATURE_HEADER: b64encode(sign_message(
               bound[0], ra.canonical(FLEET_PATH, ts, "n" * 32, body_sha))).decode()}
    _unauthorized(SimpleNamespace(headers=Headers(headers=old),
                                  url=SimpleNamespace(path=FLEET_PATH),
                                  state=SimpleNamespace(protobuf_request=body)))


def test_a_node_registers_only_its_own_key(bound: tuple[Any, Any, bytes]) -> None:
    mine = RegisterNodeFleetRequest(public_key=bound[2])
    path = "/v1/fleet/register-node"
    assert node_auth.authenticate_node(_received(_send(bound, mine, path))) is None
    other = RegisterNodeFleetRequest(public_key=public_key_to_bytes(generate_key_pairs()[1]))
    _unauthorized(_received(_send(bound, other, path)))


def test_a_plain_flower_signature_is_taken_unless_bound_is_required(
        keys: tuple[Any, Any, bytes]) -> None:
    """A plain Flower SuperNode signs a timestamp only: still taken (and, within its
    window, replayable: what docs/deployment.md says this does not cover), unless
    FEDSYS_NODE_SIGNATURES=bound."""
    assert flower_patches.bound_node_signatures({})
    plain = _send(keys, _object(), intercept=FLOWERS_INTERCEPT)
    assert ra.NODE_NONCE not in plain.headers
    assert node_auth.authenticate_node(_received(plain)) is None
    assert node_auth.authenticate_node(_received(plain)) is None  # replays: Flower's window
    _unauthorized(_received(_send(keys, _object(node=NODE_ID + 1),
                                  intercept=FLOWERS_INTERCEPT)))  # Flower's own check stays


def test_bound_signatures_required_refuse_a_plain_one(
        keys: tuple[Any, Any, bytes], caplog: pytest.LogCaptureFixture) -> None:
    assert flower_patches.bound_node_signatures({flower_patches.SIGNATURES_ENV: "bound"})
    _unauthorized(_received(_send(keys, _object(), intercept=FLOWERS_INTERCEPT)))
    assert "without a bound signature (FEDSYS_NODE_SIGNATURES=bound)" in caplog.text
    assert flower_patches.sign_node_requests({})
    assert node_auth.authenticate_node(_received(_send(keys, _object()))) is None


# ------------------------------------------------------------------ targets that do not fit

def _other(request: Any, extra: Any) -> None:  # a later Flower's, say
    return None


def _misfits(monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[Any, Any]]:
    """Each security patch: (make its target not fit, apply it)."""
    def tokens() -> None:
        monkeypatch.setattr(RuntimeTokenHttpInterceptor, "intercept", _other)

    return {
        "private-task-tokens": (tokens, lambda env: flower_patches.private_task_tokens(
            lambda: pytest.fail("started"), lambda secret: None, env)),
        "signed-task-calls": (lambda: monkeypatch.setattr(runtime, "authenticate_task", _other),
                              flower_patches.signed_task_calls),
        "fleet-ownership": (lambda: monkeypatch.setattr(fh, "pull_object", _other),
                            flower_patches.fleet_ownership),
        "bound-node-signatures": (
            lambda: monkeypatch.setattr(node_auth, "authenticate_node", _other),
            flower_patches.bound_node_signatures),
        "bound-node-signatures (SuperNode)": (
            lambda: monkeypatch.setattr(node_auth, "authenticate_node", _other),
            flower_patches.sign_node_requests),
    }


def test_the_security_set_is_these_four() -> None:
    assert flower_patches.SECURITY == {"private-task-tokens", "signed-task-calls",
                                       "fleet-ownership", "bound-node-signatures"}
    assert {n.split(" ")[0] for n in _misfits(pytest.MonkeyPatch())} == flower_patches.SECURITY


@pytest.mark.parametrize("case", ["private-task-tokens", "signed-task-calls", "fleet-ownership",
                                  "bound-node-signatures", "bound-node-signatures (SuperNode)"])
def test_a_security_patch_that_does_not_fit_stops_the_component(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, case: str) -> None:
    name = case.split(" ")[0]
    misfit, apply = _misfits(monkeypatch)[case]
    misfit()
    with pytest.raises(SystemExit, match=f"Flower patch '{name}' does not fit flwr") as stop:
        apply({})
    assert f"{flower_patches.ENV}={name}" in str(stop.value)  # how to accept it
    assert not _warnings(caplog, name)
    # turned off by name: it stays out, with a WARNING saying what stays open
    assert apply({flower_patches.ENV: name}) is False
    said = _warnings(caplog, name)
    assert len(said) == 1 and "turned off (FEDSYS_FLOWER_PATCHES)" in said[0], said
    assert flower_patches.PATCHES[name].upstream in said[0]


def test_a_security_patch_turned_off_leaves_flower_as_it_is(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(runtime, "authenticate_task", runtime.authenticate_task)
    monkeypatch.setattr(fh, "pull_object", fh.pull_object)
    monkeypatch.setattr(node_auth, "authenticate_node", node_auth.authenticate_node)
    flowers = runtime.authenticate_task, fh.pull_object, node_auth.authenticate_node
    off = {flower_patches.ENV: "none"}
    assert not flower_patches.signed_task_calls(off)
    assert not flower_patches.fleet_ownership(off)
    assert not flower_patches.bound_node_signatures(off)
    assert (runtime.authenticate_task, fh.pull_object, node_auth.authenticate_node) == flowers
    assert len([r for r in caplog.records if r.levelname == "WARNING"]) == 3


def test_a_task_lease_that_does_not_fit_keeps_flowers_wait(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Not a security patch: a WARNING, and Flower's push stage stays."""
    def other(state: Any, object_store: Any, send: Any) -> None:
        return None

    monkeypatch.setattr(sci, "_push_messages", other)
    assert not flower_patches.task_lease(3600.0, {})
    assert sci._push_messages is other
    said = _warnings(caplog, "task-lease")
    assert len(said) == 1 and "_push_messages takes" in said[0]


def test_a_node_signatures_setting_other_than_bound_stops_the_superlink() -> None:
    """A typo in ``FEDSYS_NODE_SIGNATURES`` must not quietly keep the weaker check."""
    before = node_auth.authenticate_node
    for value in ("strict", "Bound", "1"):
        with pytest.raises(SystemExit, match=f"FEDSYS_NODE_SIGNATURES='{value}': give 'bound'"):
            flower_patches.bound_node_signatures({"FEDSYS_NODE_SIGNATURES": value})
    assert node_auth.authenticate_node is before  # nothing patched
