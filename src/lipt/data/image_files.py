"""An ImageFolder tree's files (ImageNet layout: <split>/<class>/*.JPEG): listed as
torchvision's ImageFolder lists them, decoded on demand as grey or RGB, and told apart by a
digest of their names and sizes, without reading an image. lipt.data.sources.load_image_folder
reads a tree with them; its FolderImages decodes an item at a time.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lipt.core.errors import UserError

# torchvision's ImageFolder's extensions (torchvision.datasets.folder.IMG_EXTENSIONS).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".webp", ".pgm", ".tif", ".tiff")
# torchvision's decode_image reads none of these: PIL (installed with torchvision) decodes them.
PIL_EXTENSIONS = (".bmp", ".ppm", ".pgm", ".tif", ".tiff")
FOLDER_CHANNELS = (1, 3)  # grey or RGB


def _walk(folder: Path) -> Iterator[tuple[str, list[str], list[str]]]:
    """os.walk(folder) following links, as torchvision's ImageFolder does; UserError for a link
    back to a folder the walk is already in (the real folder of `folder` or of any folder on the
    way down, through other links too), a loop along which the walk would list the same images
    again and again under this class (until the path grows too long)."""
    for top, dirs, names in os.walk(folder, followlinks=True):
        links = [
            os.path.join(top, name) for name in dirs if os.path.islink(os.path.join(top, name))
        ]
        way = Path(top).relative_to(folder).parts
        # the real folders on the way down, resolved only where a link may loop back to one
        above = (
            {os.path.realpath(folder.joinpath(*way[:d])) for d in range(len(way) + 1)}
            if links
            else set()
        )
        for link in links:
            target = os.path.realpath(link)
            if any(os.path.commonpath([folder_above, target]) == target for folder_above in above):
                raise UserError(
                    f"{link} links to {target}, a folder above it: a loop that would read the "
                    "images above it again and again as this class; remove the link"
                )
        yield top, dirs, names


def class_files(folder: Path) -> list[Path]:
    """The images in `folder` and its subfolders, in torchvision's ImageFolder order (folders
    by path, files by name), so a tree reads as torchvision reads it."""
    return [
        Path(top) / name
        for top, _, names in sorted(_walk(folder))
        for name in sorted(names)
        if name.lower().endswith(IMAGE_EXTENSIONS)
    ]


def decode_file(path: Path, channels: int) -> Tensor:
    """[channels, H, W] uint8: the file decoded as grey (1) or RGB (3), whatever it holds (16-bit
    images too, scaled to 8 bits as torchvision's to_dtype scales them)."""
    from torchvision.io import ImageReadMode, decode_image
    from torchvision.transforms.v2 import functional as F

    suffix = path.suffix.lower()
    try:
        if suffix in PIL_EXTENSIONS:
            from PIL import Image

            with Image.open(path) as opened:
                # 16-bit grey (a 16-bit PGM opens as 32-bit "I", which a 32-bit TIFF is too, of
                # its own range): PIL's convert would clip it
                pgm16 = opened.mode == "I" and opened.format == "PPM"
                if opened.mode.startswith("I;16") or pgm16:
                    deep = np.asarray(opened).astype(np.int64).clip(0, 65535) >> 8
                    img = torch.from_numpy(deep.astype(np.uint8)).unsqueeze(0)
                else:
                    pixels = np.asarray(opened.convert("L" if channels == 1 else "RGB"))
                    img = torch.from_numpy(pixels.copy())
                    img = img.unsqueeze(0) if channels == 1 else img.permute(2, 0, 1)
        else:
            # decode_image gives webp only as RGB(A): made grey after decoding
            grey = channels == 1 and suffix != ".webp"
            img = decode_image(str(path), mode=ImageReadMode.GRAY if grey else ImageReadMode.RGB)
    except (RuntimeError, OSError, ValueError) as e:
        raise UserError(f"cannot decode {path} ({e}); remove or replace the file") from e
    if img.dtype != torch.uint8:  # a 16-bit PNG decodes as uint16
        img = F.to_dtype(img, torch.uint8, scale=True)
    if img.shape[0] != channels:
        img = F.rgb_to_grayscale(img) if channels == 1 else img.expand(channels, -1, -1)
    return img.contiguous()


# How many files' sizes an ImageFolder tree's digest reads at most, evenly spread: a stat each,
# which a cluster's parallel file system answers slowly (ImageNet has 1.28M files).
SIZED_FILES = 4096


def files_digest(root: Path, paths: list[Path]) -> str:
    """12 hex digits that tell one tree of image files from another: a digest of every file's
    path under `root` (its class folder included, so its label too), in the order the reader
    lists them, and of the sizes of up to `SIZED_FILES` of them, evenly spread (all of a tree
    that small). No image is read. The same files in another place give the same digest; files
    added, removed, renamed or moved to another class give another, and so do other images
    under the same names (a resized copy of the tree) where the sizes read differ. One file
    rewritten in place at its size, or outside the sizes read, is not told."""
    digest = hashlib.sha256()
    prefix = len(str(root)) + 1
    step = max(1, len(paths) // SIZED_FILES)
    for i, path in enumerate(paths):
        name = str(path)
        size = b"-"
        if i % step == 0:
            try:
                size = str(os.stat(name).st_size).encode()
            except OSError as e:
                raise UserError(f"cannot read {path} ({e.strerror}); remove or restore it") from e
        digest.update(os.fsencode(name[prefix:]) + b"\0" + size + b"\n")
    return digest.hexdigest()[:12]


def _listed(names: list[str]) -> str:
    return ", ".join(names if len(names) <= 5 else [*names[:4], f"... ({len(names)} in all)"])


def check_folder_classes(
    train_dir: Path, val_dir: Path, classes: list[str], labels: Tensor
) -> None:
    """UserError for a class folder of `train_dir` without images (a class no item has, as
    torchvision's ImageFolder refuses it; `.ipynb_checkpoints`, say), and for a folder of
    `val_dir` with images but no class folder of that name in `train_dir` (its images would be
    left out of the test split)."""
    counts = torch.bincount(labels, minlength=len(classes)).tolist()
    empty = [name for name, count in zip(classes, counts, strict=True) if count == 0]
    if empty:
        raise UserError(
            f"class folder(s) of {train_dir} hold no images ({', '.join(IMAGE_EXTENSIONS)}): "
            f"{_listed(empty)}; remove them or add their images (each folder is a class)"
        )
    known = set(classes)
    unknown = sorted(
        p.name for p in val_dir.iterdir() if p.is_dir() and p.name not in known and class_files(p)
    )
    if unknown:
        raise UserError(
            f"{val_dir} has class folder(s) with images that {train_dir} lacks: "
            f"{_listed(unknown)}; the test split would leave them out: give each a folder "
            "of training images, or move them out of val/"
        )
