"""Datasets: Fashion-MNIST (IDX files), CIFAR-10/100 (torchvision), synthetic, and a
dataset of the user's own (``custom``: NumPy files or class folders in ``data-dir``).

Images are kept as ``uint8`` tensors and normalised batch by batch, so every
process (server, each simulated client) holds one compact copy.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported where tensors are made: the CLI's commands without
    import torch  # data (deploy, keys, status) start without it (about 3 s of CPU each)

DEBIAN_FMNIST = Path("/usr/share/datasets/fashion-mnist")
DEBIAN_PACKAGE = "dataset-fashion-mnist"
FMNIST_FILES = {
    "train-images": "train-images-idx3-ubyte",
    "train-labels": "train-labels-idx1-ubyte",
    "test-images": "t10k-images-idx3-ubyte",
    "test-labels": "t10k-labels-idx1-ubyte",
}


class DataError(RuntimeError):
    """A dataset could not be found or read; the message says how to get it."""


@dataclass(frozen=True)
class Dataset:
    """A labelled image dataset split into train and test parts.

    Attributes
    ----------
    x_train, x_test : torch.Tensor
        ``uint8`` images of shape ``(n, C, H, W)``.
    y_train, y_test : torch.Tensor
        ``int64`` labels.
    mean, std : tuple of float
        Per-channel normalisation applied by :meth:`normalise`.
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    source: str = ""

    @property
    def input_shape(self) -> tuple[int, int, int]:
        c, h, w = self.x_train.shape[1:]
        return int(c), int(h), int(w)

    def normalise(self, x: torch.Tensor) -> torch.Tensor:
        """Map a ``uint8`` batch to normalised float32 (:class:`Normaliser`)."""
        return Normaliser(self.mean, self.std)(x)


@dataclass(frozen=True)
class Normaliser:
    """A dataset's per-channel normalisation as a value of its own (what
    :meth:`Dataset.normalise` does, without the dataset: sent to a Ray worker,
    ``fedsys_launch.engines.ray_training_workers``)."""

    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Map a ``uint8`` batch to normalised float32 (on the batch's device)."""
        import torch
        m, s = _statistics(self.mean, self.std, x.device)
        # ((x / 255) - m) / s, each step in place on one new float32 copy of the batch
        return x.to(torch.float32, copy=True).div_(255.0).sub_(m).div_(s)


@functools.lru_cache(maxsize=64)
def _statistics(mean: tuple[float, ...], std: tuple[float, ...], device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """:class:`Normaliser`'s mean and std as float32 tensors on ``device``, shaped to
    broadcast over a batch: made once per device (on a GPU each making is a copy the host
    waits for), read only."""
    import torch
    return (torch.tensor(mean, dtype=torch.float32, device=device).view(1, -1, 1, 1),
            torch.tensor(std, dtype=torch.float32, device=device).view(1, -1, 1, 1))


# --------------------------------------------------------------------------- FMNIST


IDX_UBYTE = 0x08  # IDX type code of unsigned bytes, the only one Fashion-MNIST uses


def _read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (optionally gzip-compressed) of unsigned bytes.

    A ``.gz`` file is read through an uncompressed copy in the cache (:func:`idx_cache`),
    made on first use: every process that loads the data (each deployment message starts
    one) then skips the decompression, most of a load's CPU (docs/development.md "Why
    things are as they are").  A file that is cut off (an interrupted download), empty, not
    gzip or not IDX raises :class:`DataError` naming the file; a copy in the cache that is
    not a whole IDX file is made again.
    """
    cached = idx_cache(path) if path.suffix == ".gz" else None
    if cached is not None and cached.is_file():
        try:
            return _parse_idx(cached.read_bytes(), cached)
        except (DataError, OSError):
            with contextlib.suppress(OSError):
                cached.unlink()
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as fh:
            raw = fh.read()
    except (EOFError, OSError) as exc:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{path} cannot be read ({exc}); delete it and fetch again") from None
    data = _parse_idx(raw, path)
    if cached is not None:
        tmp = cached.with_name(f".{cached.name}.{os.getpid()}")
        try:  # whole or not at all: a reader never sees a copy being written
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(raw)
            os.replace(tmp, cached)
        except OSError:  # no writable cache: read the .gz every time
            with contextlib.suppress(OSError):
                tmp.unlink()
    return data


def idx_cache(path: Path) -> Path | None:
    """Where the uncompressed copy of the IDX file ``path`` (a ``.gz``) is kept:
    ``$FEDSYS_CACHE`` (default ``~/.cache/fedsys``)/``idx/``, under a name that changes with
    the file's location, size and modification time; ``None`` where ``path`` cannot be
    examined."""
    try:
        st = path.stat()
        key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    except OSError:
        return None
    root = Path(os.environ.get("FEDSYS_CACHE") or Path.home() / ".cache" / "fedsys")
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return root / "idx" / f"{path.name.removesuffix('.gz')}-{digest}"


def _parse_idx(raw: bytes, path: Path) -> np.ndarray:
    """The array of an IDX file's bytes ``raw`` (``path`` names it in errors)."""
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != IDX_UBYTE or raw[3] == 0:
        raise DataError(f"{path} is not an IDX file of unsigned bytes (bad magic number)")
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise DataError(f"{path} is truncated inside its header")
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise DataError(f"{path} is truncated: expected {dims}, found {data.size} bytes")
    return data.reshape(dims)


def _find_idx(directory: Path) -> dict[str, Path] | None:
    """Return the four IDX files under ``directory`` (plain or .gz), if all exist."""
    for sub in ("", "fashion-mnist", "FashionMNIST/raw", "fashion_mnist"):
        d = directory / sub
        found: dict[str, Path] = {}
        for key, stem in FMNIST_FILES.items():
            for cand in (d / stem, d / f"{stem}.gz"):
                if cand.is_file():
                    found[key] = cand
                    break
        if len(found) == 4:
            return found
    return None


def fmnist_search_path(data_dir: str = "") -> list[Path]:
    """Directories searched for Fashion-MNIST, in order: ``data_dir`` alone where one
    is given (a run told where its data is never reads another copy), else
    ``$FEDSYS_DATA`` and the Debian package's directory."""
    if data_dir:
        return [Path(data_dir).expanduser()]
    out = []
    if os.environ.get("FEDSYS_DATA"):
        out.append(Path(os.environ["FEDSYS_DATA"]).expanduser())
    out.append(DEBIAN_FMNIST)
    return out


FMNIST_IN_DATA_DIR = (
    "Fashion-MNIST not found in data-dir {searched}: no complete set of the four IDX files "
    "(train-images-idx3-ubyte[.gz], ...) there or in its fashion-mnist/, FashionMNIST/raw/ "
    "or fashion_mnist/; a run given a data-dir reads no other copy (leave data-dir empty to "
    "search $FEDSYS_DATA and " + str(DEBIAN_FMNIST) + ")."
)
FMNIST_HOW = (
    "Get it with one of:\n"
    "  * fedsys data fetch fashion-mnist      (installs the Debian package as root,\n"
    "                                          else downloads through torchvision)\n"
    f"  * sudo apt-get install {DEBIAN_PACKAGE}  (IDX files in {DEBIAN_FMNIST})\n"
    "  * copy the four IDX files (train-images-idx3-ubyte.gz, ...) into a directory\n"
    "    and set data-dir=<dir> or FEDSYS_DATA=<dir>"
)
FMNIST_HELP = "Fashion-MNIST not found. Searched: {searched}. " + FMNIST_HOW


def load_fashion_mnist(data_dir: str = "") -> Dataset:
    """Load Fashion-MNIST from the first directory of :func:`fmnist_search_path`.

    Raises
    ------
    DataError
        When no directory holds the four IDX files (a given ``data_dir`` is named: only
        an empty one searches the defaults).
    """
    import torch
    searched = fmnist_search_path(data_dir)
    for d in searched:
        files = _find_idx(d)
        if files is None:
            continue
        xtr = _read_idx(files["train-images"])[:, None]
        xte = _read_idx(files["test-images"])[:, None]
        ytr = _read_idx(files["train-labels"]).astype(np.int64)
        yte = _read_idx(files["test-labels"]).astype(np.int64)
        return Dataset(
            "fashion-mnist",
            torch.from_numpy(xtr.copy()),
            torch.from_numpy(ytr.copy()),
            torch.from_numpy(xte.copy()),
            torch.from_numpy(yte.copy()),
            10,
            (0.2860,),
            (0.3530,),
            source=str(files["train-images"].parent),
        )
    raise DataError(_not_found(data_dir))


def _not_found(data_dir: str) -> str:
    """Why Fashion-MNIST was not found, and how to get it."""
    if data_dir:
        return FMNIST_IN_DATA_DIR.format(searched=Path(data_dir).expanduser()) + " " + FMNIST_HOW
    return FMNIST_HELP.format(searched=", ".join(map(str, fmnist_search_path(data_dir))))


def fetch_fashion_mnist(data_dir: str = "", allow_apt: bool = True) -> Path:
    """Make Fashion-MNIST available and return the directory holding it.

    Tries the search path, then (as root with apt) the Debian package, then
    torchvision's download into ``data_dir`` (or ``~/.cache/fedsys``).
    """
    for d in fmnist_search_path(data_dir):
        if _find_idx(d) is not None:
            return d
    log: list[str] = []
    # the Debian package lands in its own directory: not where a given data-dir points
    if not data_dir and allow_apt and shutil.which("apt-get") and os.geteuid() == 0:
        for cmd in (["apt-get", "install", "-y", "-q", DEBIAN_PACKAGE],
                    ["sh", "-c", f"apt-get update -q && apt-get install -y -q {DEBIAN_PACKAGE}"]):
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if _find_idx(DEBIAN_FMNIST) is not None:
                return DEBIAN_FMNIST
            log.append(f"{' '.join(cmd)} -> exit {proc.returncode}")
    target = Path(data_dir or Path.home() / ".cache" / "fedsys").expanduser()
    try:
        from torchvision.datasets import FashionMNIST

        FashionMNIST(str(target), train=True, download=True)
        FashionMNIST(str(target), train=False, download=True)
        if _find_idx(target) is not None:
            return target
    except Exception as exc:
        log.append(f"torchvision download into {target} failed: {exc}")
    raise DataError(_not_found(data_dir) + ("\nTried: " + "; ".join(log) if log else ""))


# --------------------------------------------------------------------------- CIFAR


def load_cifar(name: str, data_dir: str = "") -> Dataset:
    """Load CIFAR-10 or CIFAR-100 through torchvision from a local root.

    The root is ``data_dir``, else ``$FEDSYS_DATA``, else ``~/.cache/fedsys``;
    torchvision downloads there when the machine is online.
    """
    import torch
    from torchvision import datasets

    cls = {"cifar10": datasets.CIFAR10, "cifar100": datasets.CIFAR100}[name]
    root = Path(data_dir or os.environ.get("FEDSYS_DATA", "") or Path.home() / ".cache/fedsys")
    root = root.expanduser()
    try:
        try:
            tr, te = cls(str(root), train=True), cls(str(root), train=False)
        except RuntimeError:
            tr = cls(str(root), train=True, download=True)
            te = cls(str(root), train=False, download=True)
    except Exception as exc:
        raise DataError(
            f"{name} not found under {root} and could not be downloaded ({exc}). "
            f"Put the torchvision archive folder ({tr_folder(name)}) under {root}, or "
            f"set data-dir=<dir> / FEDSYS_DATA=<dir> to where it is."
        ) from None

    def to_t(ds: object) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.from_numpy(np.asarray(ds.data)).permute(0, 3, 1, 2).contiguous()  # type: ignore[attr-defined]
        return x, torch.tensor(ds.targets, dtype=torch.int64)  # type: ignore[attr-defined]

    xtr, ytr = to_t(tr)
    xte, yte = to_t(te)
    nc = 10 if name == "cifar10" else 100
    mean = (0.4914, 0.4822, 0.4465) if nc == 10 else (0.5071, 0.4865, 0.4409)
    std = (0.2470, 0.2435, 0.2616) if nc == 10 else (0.2673, 0.2564, 0.2762)
    return Dataset(name, xtr, ytr, xte, yte, nc, mean, std, source=str(root))


def tr_folder(name: str) -> str:
    return "cifar-10-batches-py" if name == "cifar10" else "cifar-100-python"


# --------------------------------------------------------------------------- synthetic


def make_synthetic(
    n_train: int = 2000, n_test: int = 500, num_classes: int = 10, seed: int = 1234
) -> Dataset:
    """A small learnable dataset: class prototypes plus noise, 1x8x8 images.

    The data are fixed by ``seed`` (not the run seed), like a real dataset.
    """
    import torch
    rng = np.random.default_rng(seed)
    protos = rng.uniform(40, 215, size=(num_classes, 1, 8, 8))

    def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        y = rng.integers(0, num_classes, size=n)
        x = protos[y] + rng.normal(0, 45, size=(n, 1, 8, 8))
        return (
            torch.from_numpy(np.clip(x, 0, 255).astype(np.uint8)),
            torch.from_numpy(y.astype(np.int64)),
        )

    xtr, ytr = draw(n_train)
    xte, yte = draw(n_test)
    return Dataset("synthetic", xtr, ytr, xte, yte, num_classes, (0.5,), (0.25,), "generated")


# --------------------------------------------------------------------------- custom

CUSTOM_HOW = ("dataset custom reads a dataset of your own from data-dir: either train.npz "
              "and test.npz, each with a uint8 image array 'x' (N, H, W), (N, C, H, W) or "
              "(N, H, W, C) and an integer label array 'y' (N,), labels 0..K-1; or train/ and "
              "test/ directories with one folder of images per class (torchvision's ImageFolder "
              "layout, the classes in sorted order)")
#: Image files an ImageFolder-style directory may hold (torchvision's IMG_EXTENSIONS).
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def load_custom(data_dir: str) -> Dataset:
    """A dataset of the user's own in ``data_dir`` (:data:`CUSTOM_HOW` says the layout):
    ``train.npz`` and ``test.npz``, else ``train/`` and ``test/`` class folders.

    The images are kept as ``uint8`` ``(N, C, H, W)``; the normalisation is the training
    images' per-channel mean and standard deviation; the classes are those of the training
    part.

    Raises
    ------
    DataError
        Naming the file or folder and what is wrong with it: missing, unreadable, not
        images, of another size or channel count than the rest, labels out of range.
    """
    import torch

    root = Path(data_dir).expanduser() if data_dir else None
    if root is None or not root.is_dir():
        where = f"data-dir {root} is not a directory" if root else "data-dir is empty"
        raise DataError(f"{where}: {CUSTOM_HOW}")
    if (root / "train.npz").exists() or (root / "test.npz").exists():
        (xtr, ytr), (xte, yte) = (_npz_part(root / f"{p}.npz") for p in ("train", "test"))
        classes = int(ytr.max()) + 1 if len(ytr) else 0
    elif (root / "train").is_dir() and (root / "test").is_dir():
        names = sorted(d.name for d in (root / "train").iterdir() if d.is_dir())
        xtr, ytr = _folder_part(root / "train", names)
        xte, yte = _folder_part(root / "test", names)
        classes = len(names)
    else:
        raise DataError(f"data-dir {root} holds neither train.npz and test.npz nor train/ and "
                        f"test/: {CUSTOM_HOW}")
    if len(ytr) == 0 or len(yte) == 0:
        raise DataError(f"data-dir {root}: the {'training' if len(ytr) == 0 else 'test'} part "
                        "holds no images")
    if xtr.shape[1:] != xte.shape[1:]:
        raise DataError(f"data-dir {root}: training images are {_shape(xtr)} but test images "
                        f"{_shape(xte)}; both parts need one size and channel count")
    if classes < 2:
        raise DataError(f"data-dir {root}: the training part has {classes} class; at least 2")
    if int(yte.max()) >= classes:
        raise DataError(f"data-dir {root}: a test label is {int(yte.max())} but the training "
                        f"part has classes 0..{classes - 1}")
    mean, std = _channel_moments(xtr)
    return Dataset("custom", torch.from_numpy(xtr), torch.from_numpy(ytr.astype(np.int64)),
                   torch.from_numpy(xte), torch.from_numpy(yte.astype(np.int64)), classes,
                   mean, std, source=str(root))


def _channel_moments(x: np.ndarray, chunk: int = 4096
                     ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and standard deviation of ``uint8`` images ``(N, C, H, W)`` scaled
    to [0, 1], summed in float64 a chunk of images at a time (no float copy of the whole
    set: 240,000 Fashion-MNIST-sized images would take 1.5 GB)."""
    total = np.zeros(x.shape[1])
    squares = np.zeros(x.shape[1])
    for i in range(0, len(x), chunk):
        part = x[i:i + chunk].astype(np.float64)
        total += part.sum(axis=(0, 2, 3))
        squares += np.einsum("nchw,nchw->c", part, part)
    count = len(x) * x.shape[2] * x.shape[3]
    mean = total / count
    var = np.maximum(squares / count - mean**2, 0.0)
    return (tuple(float(m) / 255.0 for m in mean),
            tuple(max(float(v) / 255.0, 1e-6) for v in np.sqrt(var)))


def _shape(x: np.ndarray) -> str:
    """``C x H x W`` of an image array."""
    return "x".join(map(str, x.shape[1:]))


def _npz_part(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """``x`` as ``uint8`` ``(N, C, H, W)`` and ``y`` of one ``.npz`` part, checked."""
    if not path.exists():
        raise DataError(f"{path} is missing: {CUSTOM_HOW}")
    try:
        with np.load(path, allow_pickle=False) as f:
            if "x" not in f or "y" not in f:
                raise DataError(f"{path} holds {sorted(f.files)}, not the arrays 'x' and 'y': "
                                f"{CUSTOM_HOW}")
            x, y = f["x"], f["y"]
    except DataError:
        raise
    except (OSError, ValueError, EOFError) as exc:
        raise DataError(f"{path} is not a readable .npz file ({type(exc).__name__}: {exc})") from None
    if x.ndim == 3:
        x = x[:, None]
    elif x.ndim == 4 and x.shape[1] not in (1, 3) and x.shape[3] in (1, 3):
        x = x.transpose(0, 3, 1, 2)
    if x.ndim != 4 or x.shape[1] not in (1, 3):
        raise DataError(f"{path}: 'x' has shape {x.shape}; give (N, H, W), (N, C, H, W) or "
                        "(N, H, W, C) with C 1 or 3")
    if x.dtype != np.uint8:
        if not np.issubdtype(x.dtype, np.integer) or (x.size and (x.min() < 0 or x.max() > 255)):
            raise DataError(f"{path}: 'x' is {x.dtype}; give uint8 pixel values 0..255 "
                            "(scale float images by 255 and round)")
        x = x.astype(np.uint8)
    if y.ndim != 1 or len(y) != len(x) or not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{path}: 'y' must be one integer label per image ({len(x)}), "
                        f"got {y.dtype} of shape {y.shape}")
    if len(y) and y.min() < 0:
        raise DataError(f"{path}: a label is {int(y.min())}; labels are 0..K-1")
    return np.ascontiguousarray(x), y


def _folder_part(root: Path, classes: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The images of ``root/<class>/`` as ``uint8`` ``(N, C, H, W)`` and their class
    indices in ``classes`` (those of the training part), checked."""
    from PIL import Image, UnidentifiedImageError

    found = sorted(d.name for d in root.iterdir() if d.is_dir())
    if extra := sorted(set(found) - set(classes)):
        raise DataError(f"{root} has class folders the training part lacks: {', '.join(extra)}")
    xs: list[np.ndarray] = []
    ys: list[int] = []
    for k, name in enumerate(classes):
        if not (root / name).is_dir():
            continue
        for f in sorted((root / name).iterdir()):
            if f.suffix.lower() not in IMAGE_SUFFIXES:
                continue
            try:
                with Image.open(f) as img:
                    gray = img.mode in ("1", "L", "LA", "I", "I;16", "F")
                    a = np.asarray(img.convert("L" if gray else "RGB"))
            except (OSError, UnidentifiedImageError, ValueError) as exc:
                raise DataError(f"{f} is not a readable image ({type(exc).__name__})") from None
            a = a[None] if a.ndim == 2 else a.transpose(2, 0, 1)
            if xs and a.shape != xs[0].shape:
                raise DataError(f"{f} is {'x'.join(map(str, a.shape))} (channels x height x "
                                f"width) but the images before it are {'x'.join(map(str, xs[0].shape))}; "
                                "every image needs one size and channel count")
            xs.append(a)
            ys.append(k)
    if not xs:
        return np.zeros((0, 1, 1, 1), np.uint8), np.zeros(0, np.int64)
    return np.stack(xs), np.asarray(ys, dtype=np.int64)


# --------------------------------------------------------------------------- entry


@functools.lru_cache(maxsize=2)
def load_dataset(name: str, data_dir: str = "") -> Dataset:
    """Load a dataset by config name (cached per process)."""
    if name == "fashion-mnist":
        return load_fashion_mnist(data_dir)
    if name in ("cifar10", "cifar100"):
        return load_cifar(name, data_dir)
    if name == "synthetic":
        if data_dir and not Path(data_dir).expanduser().is_dir():  # a typo, or another dataset meant
            raise DataError(f"data-dir {data_dir} is not a directory (dataset synthetic is "
                            "generated and reads no files: leave data-dir empty)")
        return make_synthetic()
    if name == "custom":
        return load_custom(data_dir)
    raise DataError(f"unknown dataset {name!r}")
