"""fedsys's Flower ``Array`` codec (:func:`fedsys.protocol.to_array`,
:func:`~fedsys.protocol.from_array`) is Flower's own, byte for byte and error for error,
only faster: held against ``Array(x)`` and ``Array.numpy()`` for every input."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from fedsys import protocol

RNG = np.random.default_rng(0)
ARRAYS = [
    RNG.standard_normal((64, 784)).astype(np.float32),
    RNG.standard_normal(10).astype(np.float32),
    RNG.standard_normal((3, 2, 5)),                      # float64
    RNG.standard_normal((4, 4)).astype(np.float16),
    RNG.integers(0, 255, (7, 3), dtype=np.uint8),
    RNG.integers(-9, 9, 5, dtype=np.int64),
    np.array(3.5, dtype=np.float32),                     # 0-d
    np.zeros((0, 4), np.float32),                        # empty
    np.array([True, False]),
    (RNG.standard_normal(4) + 1j).astype(np.complex64),
    RNG.standard_normal((5, 3)).astype(">f4"),           # big-endian
    np.asfortranarray(RNG.standard_normal((5, 3))),      # written in C order, as to_record did
    RNG.standard_normal((6, 8))[::2, ::3],               # a strided view
    np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")]),  # structured: Flower's own path
]


def _same_array(got: Array, want: Array) -> None:
    assert (got.dtype, got.shape, got.stype) == (want.dtype, want.shape, want.stype)
    assert got.data == want.data
    # the same object state as Flower's constructor leaves, attribute by attribute and in
    # its order (to_array makes the Array without the constructor): a Flower release that
    # sets more, or sets it otherwise, fails here
    assert type(got) is type(want)
    assert list(vars(got).items()) == list(vars(want).items())


@pytest.mark.parametrize("x", ARRAYS, ids=lambda x: f"{x.dtype}{x.shape}")
def test_written_as_flower_writes_it_and_read_as_flower_reads_it_twice(x):
    want = Array(np.require(x, requirements="C"))  # as to_record wrote it before
    for _ in range(2):  # the first learns the header, the second uses it
        got = protocol.to_array(x)
        _same_array(got, want)
        for _ in range(2):
            back, ref = protocol.from_array(got), want.numpy()
            assert back.dtype == ref.dtype and back.shape == ref.shape
            assert back.tobytes() == ref.tobytes()
            assert back.flags.writeable and back.flags.c_contiguous == ref.flags.c_contiguous
            assert not np.shares_memory(back, protocol.from_array(got))


def test_an_array_made_without_the_constructor_behaves_as_flowers_own():
    import pickle

    x = ARRAYS[0]
    for _ in range(2):
        got, want = protocol.to_array(x), Array(x)
        assert pickle.loads(pickle.dumps(got)) == want  # (before object_id: Flower's cache
        assert got.is_dirty and want.is_dirty           # of it does not pickle)
        assert got == want and got.object_id == want.object_id
        assert list(vars(got).items()) == list(vars(want).items())
        assert not got.is_dirty
        got.data = want.data = protocol.to_array(ARRAYS[1]).data  # its setter still guards it
        assert got.is_dirty and got.object_id == want.object_id
        assert np.array_equal(got.numpy(), ARRAYS[1])


def test_a_record_round_trips_as_flowers_own():
    params = {"w": ARRAYS[0], "b": ARRAYS[1]}
    rec = protocol.to_record(params)
    flower = ArrayRecord({k: Array(v) for k, v in params.items()})
    assert list(rec.keys()) == list(flower.keys())
    for k in params:
        _same_array(rec[k], flower[k])
    back = protocol.from_record(flower)
    assert all(np.array_equal(back[k], params[k]) for k in params)


def _error(fn, *a):
    try:
        fn(*a)
    except Exception as exc:  # what each raises, compared
        return type(exc), str(exc)
    return None


def _hostile(good: Array) -> list[Array]:
    d, n = good.data, len(good.data)
    out = [
        d[: n - 4],                     # truncated
        d + b"\x00" * 8,                # a trailing extra (numpy.load ignores it)
        d[:10] + d[10:40].replace(b"(64, 784)", b"(64, 785)") + d[40:],
        d[:8] + b"\xff\xff" + d[10:],   # a header length past the data
        b"\x93NUMPY\x01\x00",           # magic alone
        b"",
        b"not numpy at all",
        d.replace(b"'<f4'", b"'|O'"),   # object dtype: pickles refused
        d.replace(b"False", b"True "),  # fortran order
    ]
    return [Array(dtype=good.dtype, shape=good.shape, stype=good.stype, data=x) for x in out] + [
        Array(dtype=good.dtype, shape=good.shape, stype="torch.Tensor", data=d)]


def test_a_malformed_array_reads_or_fails_exactly_as_flowers_reader():
    good = protocol.to_array(ARRAYS[0])
    protocol.from_array(good)  # the header is known now: the short way is taken
    for bad in _hostile(good):
        want, got = _error(bad.numpy), _error(protocol.from_array, bad)
        assert got == want, bad.data[:60]
        if want is None:
            assert np.array_equal(protocol.from_array(bad), bad.numpy())


def test_the_kept_headers_are_bounded(monkeypatch):
    monkeypatch.setattr(protocol, "_HEADERS_KEPT", 4)
    monkeypatch.setattr(protocol, "_READ", {})
    monkeypatch.setattr(protocol, "_WRITTEN", {})
    for n in range(1, 20):
        x = np.arange(n, dtype=np.float32)
        assert np.array_equal(protocol.from_array(protocol.to_array(x)), x)
        assert len(protocol._READ) <= 4 and len(protocol._WRITTEN) <= 4


def test_data_that_is_not_bytes_is_read_as_flowers_reader_reads_it():
    """An Array whose data was set to another buffer (a ClientApp may do so in process)."""
    good = protocol.to_array(ARRAYS[1])
    protocol.from_array(good)
    odd = Array(dtype=good.dtype, shape=good.shape, stype=good.stype, data=good.data)
    odd.data = bytearray(good.data)  # type: ignore[assignment]
    assert np.array_equal(protocol.from_array(odd), odd.numpy())
