"""Write Fashion-MNIST tiled K times as a ``dataset: custom`` directory (train.npz, test.npz).

For cost measurements that need more clients than Fashion-MNIST's 60,000 training images
allow (``benchmarks/cross_device.py --clients 100000``): every training image K times, each
copy shifted by one pixel in a direction of its own so that no two copies are equal; the
test part is Fashion-MNIST's.  Not for accuracy claims: the copies are not new samples.

Usage::

    python scripts/tiled_fmnist.py /tmp/fmnist-x4 --times 4
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from fedsys.data import load_dataset


def main() -> None:
    """Write the tiled dataset."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("out", type=Path)
    ap.add_argument("--times", type=int, default=4)
    args = ap.parse_args()
    ds = load_dataset("fashion-mnist")
    x, y = ds.x_train.numpy(), ds.y_train.numpy()
    shifts = [(0, 0), (0, 1), (1, 0), (0, -1), (-1, 0), (1, 1), (-1, -1), (1, -1), (-1, 1)]
    if not 1 <= args.times <= len(shifts):
        raise SystemExit(f"--times must be 1..{len(shifts)}")
    xs = [np.roll(x, s, axis=(2, 3)) for s in shifts[: args.times]]
    args.out.mkdir(parents=True, exist_ok=True)
    np.savez(args.out / "train.npz", x=np.concatenate(xs), y=np.tile(y, args.times))
    np.savez(args.out / "test.npz", x=ds.x_test.numpy(), y=ds.y_test.numpy())
    print(f"wrote {args.out}: {len(y) * args.times} training images, {len(ds.y_test)} test images")


if __name__ == "__main__":
    main()
