"""What the security patches add to one Runtime or Fleet call, beside what the call costs anyway.

For a request body of each size (an empty poll, a 100 KiB record, one 5 MiB array chunk, the
largest body a SuperNode sends), in this process and one thread, medians of ``--repeats``
timings of ``--number`` calls:

- *encode*: Flower's protobuf serialisation of the request (``SerializeToString``), which
  every call pays;
- *sign + check*: what ``private-task-tokens``/``signed-task-calls`` (or
  ``bound-node-signatures``) add at the two ends: the deterministic serialisation the
  signature covers, its SHA-256, the HMAC, and the check with its nonce
  (:mod:`fedsys_launch.runtime_auth`).

The ratio is the added cost per unit of encoding cost.  Every signed call is also checked
accepted (and its replay refused), so a figure never comes from a check that did not run.

Usage::

    python benchmarks/signing_costs.py
"""

from __future__ import annotations

import argparse
import statistics
import timeit

from flwr.proto.message_pb2 import PushObjectRequest

from fedsys_launch.runtime_auth import NonceStore, check_task_call, sign_task_call, task_key

SIZES = {"poll (0 B)": 0, "record (100 KiB)": 100 << 10, "chunk (5 MiB)": 5 << 20}


def measure(size: int, number: int, repeats: int) -> tuple[float, float]:
    """Median seconds per call: (encode, sign + check)."""
    req = PushObjectRequest(object_id="x" * 64, object_content=b"\x01" * size)
    key = task_key(b"s" * 32, "token")
    path = "/v1/runtime/push-object"

    def encode() -> bytes:
        return req.SerializeToString()

    nonces = NonceStore()

    def sign_and_check() -> dict[str, str]:
        headers = sign_task_call(key, path, req.SerializeToString(deterministic=True))
        got = check_task_call(key, path, req.SerializeToString(deterministic=True), headers,
                              nonces)
        assert got is None, got
        return headers

    replayed = sign_and_check()
    assert check_task_call(key, path, req.SerializeToString(deterministic=True), replayed,
                           nonces) == "signature used before"

    enc = statistics.median(timeit.repeat(encode, number=number, repeat=repeats)) / number
    sig = statistics.median(timeit.repeat(sign_and_check, number=number, repeat=repeats)) / number
    return enc, sig


def main() -> None:
    """Print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--number", type=int, default=20, help="calls per timing")
    ap.add_argument("--repeats", type=int, default=7, help="timings per figure (median)")
    args = ap.parse_args()
    print("| body | encode (ms) | sign + check (ms) | ratio |")
    print("|---|---:|---:|---:|")
    for label, size in SIZES.items():
        enc, sig = measure(size, args.number, args.repeats)
        print(f"| {label} | {enc * 1e3:.3f} | {sig * 1e3:.3f} | {sig / enc:.1f} |")


if __name__ == "__main__":
    main()
