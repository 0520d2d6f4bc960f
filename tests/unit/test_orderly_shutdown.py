"""``fedsys_launch.flower_patches.orderly_shutdown``: when Flower's simulation runtime stops,
its Ray backend shuts Ray down only once no worker thread is inside a Ray call.

Why it exists: a run stopped by SIGTERM in CI ended with exit status 1 and Ray's "The core
worker has already been shutdown ... The process will exit" (a thread of Flower's runtime
reached Ray while the main thread's ``ray.shutdown()`` ran, ray-project/ray#19115), not 143
and a word on how to continue.  The first tests drive the ordering with a stand-in backend
whose calls are held open on purpose; the last runs Flower's own ``RayBackend`` on a Ray
cluster of its own with a ClientApp that is still training when ``terminate`` comes."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedsys_launch import flower_patches
from fedsys_launch.engines.simulation import ray_init_args


def _message() -> Message:
    with flower_patches.task_identity(1, 1, 0):
        return Message(RecordDict({"config": ConfigRecord({"sleep": 2.0})}), dst_node_id=7,
                       message_type="train")


def _context() -> Context:
    return Context(run_id=1, node_id=7, node_config={"partition-id": 0, "num-partitions": 1},
                   state=RecordDict(), run_config={})


class _Backend:
    """Flower's two methods as the runtime sees them: a call that waits for ``release``,
    and a terminate that records how many calls were in flight when it ran."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Semaphore(0)
        self.reached = 0
        self.in_flight = 0
        self.terminated_with: list[int] = []

    def process_message(self, message: Message, context: Context) -> tuple[Message, Context]:
        self.reached += 1
        self.in_flight += 1
        self.entered.release()
        self.release.wait(30)
        self.in_flight -= 1
        return Message(RecordDict({"metrics": MetricRecord({"ok": 1})}), reply_to=message), context

    def terminate(self) -> None:
        self.terminated_with.append(self.in_flight)


def _ordered(grace: float) -> tuple[_Backend, Any, Any]:
    backend = _Backend()
    process, terminate = flower_patches._wrap_backend(
        type(backend).process_message, type(backend).terminate, grace=lambda: grace)
    return backend, process, terminate


def _call_in_thread(process: Any, backend: _Backend, out: list[Message]) -> threading.Thread:
    t = threading.Thread(target=lambda: out.append(process(backend, _message(), _context())[0]))
    t.start()
    assert backend.entered.acquire(timeout=10)
    return t


def test_terminate_waits_for_the_call_in_flight_then_runs_flowers():
    backend, process, terminate = _ordered(grace=30.0)
    replies: list[Message] = []
    t = _call_in_thread(process, backend, replies)
    threading.Timer(0.5, backend.release.set).start()
    began = time.monotonic()
    terminate(backend)
    assert time.monotonic() - began >= 0.4  # it waited for the call ...
    assert backend.terminated_with == [0]  # ... and Ray went down with none in flight
    t.join(10)
    assert len(replies) == 1 and not replies[0].has_error()


def test_a_call_after_terminate_began_gets_an_error_reply_without_reaching_ray():
    backend, process, terminate = _ordered(grace=30.0)
    terminate(backend)
    assert backend.terminated_with == [0]
    msg = _message()
    reply, context = process(backend, msg, _context())
    assert backend.reached == 0  # Flower's call (and Ray) never reached
    assert reply.has_error() and "the simulation is stopping" in reply.error.reason
    assert reply.metadata.reply_to_message_id == msg.metadata.message_id
    assert context.node_id == 7


def test_a_call_that_outlasts_the_grace_leaves_ray_to_the_process_exit():
    backend, process, terminate = _ordered(grace=0.3)
    replies: list[Message] = []
    t = _call_in_thread(process, backend, replies)
    terminate(backend)
    assert backend.terminated_with == []  # no shutdown beside a thread inside Ray
    backend.release.set()
    t.join(10)
    assert len(replies) == 1 and not replies[0].has_error()


def test_flowers_methods_are_replaced_only_inside_and_only_where_they_fit(monkeypatch, caplog):
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    flowers = RayBackend.process_message, RayBackend.terminate
    with flower_patches.orderly_shutdown({}) as on:
        assert on and RayBackend.process_message is not flowers[0]
        assert RayBackend.terminate is not flowers[1]
    assert (RayBackend.process_message, RayBackend.terminate) == flowers

    def other(self: Any, message: Any, context: Any, timeout: float) -> None:  # a later Flower's
        return None

    monkeypatch.setattr(flower_patches, "_warned", set())
    monkeypatch.setattr(RayBackend, "process_message", other)
    with flower_patches.orderly_shutdown({}) as on:
        assert not on and RayBackend.process_message is other
    assert "patch 'orderly-shutdown' not applied: RayBackend.process_message takes" in caplog.text


slow_app = ClientApp()


@slow_app.train()
def _train(msg: Message, context: Context) -> Message:
    started = str(msg.content["config"].get("started", ""))
    if started:  # the test waits for this file: the actor is in the ClientApp
        Path(started).write_text("training")
    time.sleep(float(msg.content["config"]["sleep"]))
    return Message(RecordDict({"metrics": MetricRecord({"slept": 1})}), reply_to=msg)


@pytest.mark.slow
def test_flowers_ray_backend_shuts_ray_down_after_the_training_client_replies(monkeypatch,
                                                                               tmp_path):
    """Flower's ``RayBackend`` on a Ray cluster of its own: ``terminate`` while an actor
    trains.  Flower's own order shuts Ray down under the waiting thread (seen: its call
    failed, the actor's owner gone, or waited in ``ray.get`` for ever, so that the process
    could not exit); here the call returns the ClientApp's reply, then Ray goes down, and a
    later message is answered without starting Ray again."""
    import ray
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("PYTHONPATH", "")  # RayBackend.init_ray rewrites it; put back after
    # the ordering is under test, not the grace: a loaded machine's slow actor start-up
    # must not turn into a call that outlasts it
    monkeypatch.setattr(flower_patches, "SHUTDOWN_GRACE_S", 120.0)
    started = tmp_path / "started"
    msg = _message()
    msg.content["config"]["started"] = str(started)
    if ray.is_initialized():  # a connection an earlier test of this process left
        ray.shutdown()
    with flower_patches.orderly_shutdown({}) as on:
        assert on
        backend = RayBackend({"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                              "init_args": ray_init_args({}, 1)})
        try:
            backend.build(lambda: slow_app)
            replies: list[Message] = []
            t = threading.Thread(target=lambda: replies.append(  # (daemon: see above)
                backend.process_message(msg, _context())[0]), daemon=True)
            t.start()
            end = time.monotonic() + 120
            while not started.exists() and time.monotonic() < end:
                time.sleep(0.01)
            assert started.exists(), "the actor never began the ClientApp"
            time.sleep(0.3)  # the actor is in its two-second sleep
            backend.terminate()
            assert replies, "terminate returned before the call in flight"
            assert not replies[0].has_error(), replies[0].error
            assert replies[0].content["metrics"]["slept"] == 1
            assert not ray.is_initialized()
            late = backend.process_message(_message(), _context())[0]
            assert late.has_error() and not ray.is_initialized()
            t.join(10)
        finally:
            if ray.is_initialized():
                ray.shutdown()
