"""``fedsys_launch.flower_patches.prompt_dispatch``: Flower's simulation runtime takes a stored
message at once (its own loop looks every 0.1 s), one message per node at a time as
Flower's loop does, and Flower's function is back afterwards."""

from __future__ import annotations

import queue
import threading

from flwr.server.superlink.fleet.vce import vce_api

from fedsys_launch import flower_patches


class _State:
    """The two LinkState calls the loop makes: messages stored per node, taken one at a time."""

    def __init__(self) -> None:
        self.waiting: dict[int, list[str]] = {1: [], 2: []}
        self.lock = threading.Lock()

    def store_message_ins(self, node: int, msg: str) -> str:
        with self.lock:
            self.waiting[node].append(msg)
        return msg

    def get_message_ins(self, node_id: int, limit: int) -> list[str]:
        with self.lock:
            got, self.waiting[node_id] = (self.waiting[node_id][:limit],
                                          self.waiting[node_id][limit:])
        return got


def _run(state: _State, idle: float) -> tuple[queue.Queue[str], threading.Event, threading.Thread]:
    q: queue.Queue[str] = queue.Queue()
    stop = threading.Event()
    loop = threading.Thread(target=flower_patches._dispatch, args=(state, q, {1: 0, 2: 1}, stop, idle))
    loop.start()
    return q, stop, loop


def _end(state: _State, stop: threading.Event, loop: threading.Thread) -> None:
    stop.set()
    state.store_message_ins(1, "wake")
    loop.join(timeout=10)
    assert not loop.is_alive()
    assert "store_message_ins" not in vars(state)  # the state's own method again


def test_a_stored_message_is_taken_at_once():
    state = _State()
    # an idle wait of 60 s: only the wake can bring the message within the 10 s asked
    q, stop, loop = _run(state, 60.0)
    try:
        state.store_message_ins(2, "a")
        assert q.get(timeout=10) == "a"
        state.store_message_ins(1, "b")
        assert q.get(timeout=10) == "b"
    finally:
        _end(state, stop, loop)


def test_a_node_gets_one_message_per_sweep_as_in_flowers_loop():
    """Two messages waiting for one node: the first sweep takes one, the next (after the
    idle wait) the other, so a node's messages are not handed out at once."""
    state = _State()
    state.store_message_ins(1, "b")
    state.store_message_ins(1, "c")
    q, stop, loop = _run(state, 3.0)
    try:
        assert q.get(timeout=10) == "b"
        assert q.empty()  # "c" waits for the next sweep
        assert q.get(timeout=10) == "c"
    finally:
        _end(state, stop, loop)


def test_flowers_loop_is_replaced_only_inside_and_only_where_it_fits(monkeypatch):
    flowers = vce_api.add_messages_to_queue
    with flower_patches.prompt_dispatch({}) as replaced:
        assert replaced and vce_api.add_messages_to_queue is flower_patches._dispatch
    assert vce_api.add_messages_to_queue is flowers

    def other(state, queue, nodes_mapping, f_stop, extra):  # a later Flower's, say
        return None

    monkeypatch.setattr(vce_api, "add_messages_to_queue", other)
    with flower_patches.prompt_dispatch({}) as replaced:
        assert not replaced and vce_api.add_messages_to_queue is other
