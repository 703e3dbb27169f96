"""The one image reader every command uses: the size is checked from the header, before decoding.

A PNG of a few hundred kilobytes can declare 12000 × 12000 pixels and decode into gigabytes
(Pillow only refuses beyond twice ``Image.MAX_IMAGE_PIXELS``). ``read_image`` opens the file
lazily — Pillow reads the header alone — and refuses an image of more than ``max_pixels``
pixels with one line (``ImageTooLarge``, a BadInput: exit 2, HTTP 413 in ``serve-reward``)
before a byte of pixel data is decoded.

The limit: ``max_pixels_for(resolution)`` = max(``DEFAULT_MAX_PIXELS``, (8·resolution)²) where
a setting fixes the resolution (positives are resized to it), ``DEFAULT_MAX_PIXELS`` (4096²)
elsewhere; the environment variable ``RECAST_MAX_IMAGE_PIXELS`` overrides both. An image past
Pillow's own decompression-bomb limit is refused the same way, one line.

A command that reads many images (``recast score`` over a folder) also sums the sizes their
headers declare (:func:`image_size`, nothing decoded) against ``max_total_pixels()``:
``DEFAULT_MAX_TOTAL_PIXELS`` (2³⁶), or ``RECAST_MAX_TOTAL_PIXELS``.
"""

from __future__ import annotations

import io
import os
import warnings
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

from recast_cli.errors import BadInput, cut

DEFAULT_MAX_PIXELS = 4096 * 4096
MAX_PIXELS_ENV = "RECAST_MAX_IMAGE_PIXELS"
DEFAULT_MAX_TOTAL_PIXELS = 2**36
MAX_TOTAL_PIXELS_ENV = "RECAST_MAX_TOTAL_PIXELS"


class ImageTooLarge(BadInput):
    """An image whose header declares more pixels than the limit (refused before decoding)."""


class ImageUnreadable(BadInput):
    """A file or payload that is not a decodable image."""


def max_pixels_for(resolution: int | None = None) -> int:
    """The pixel limit for images that are resized to ``resolution`` (or for any image when None)."""
    override = _env_limit(MAX_PIXELS_ENV)
    if override is not None:
        return override
    return max(DEFAULT_MAX_PIXELS, (8 * resolution) ** 2) if resolution else DEFAULT_MAX_PIXELS


def max_total_pixels() -> int:
    """The most pixels, summed over every image, one command reads (``RECAST_MAX_TOTAL_PIXELS``)."""
    override = _env_limit(MAX_TOTAL_PIXELS_ENV)
    return DEFAULT_MAX_TOTAL_PIXELS if override is None else override


def _env_limit(name: str) -> int | None:
    """The positive integer in ``$name``, None when unset; BadInput when it is something else."""
    text = os.environ.get(name)
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise BadInput(f"${name} = {cut(text)!r} is not an integer") from None
    if value < 1:
        raise BadInput(f"${name} must be >= 1, got {value}")
    return value


def read_image(source: bytes | str | os.PathLike[str], what: str | None = None, max_pixels: int | None = None,
               formats: tuple[str, ...] | None = None) -> Image.Image:
    """A fully decoded copy of the image in ``source`` (bytes or a file), its size checked first.

    ``what`` names the image in messages (default: the path). ``formats`` restricts the file
    format (e.g. ``("PNG",)``). Raises ImageTooLarge or ImageUnreadable, one line each.
    """
    return _open_checked(source, what, max_pixels, formats, decode=True)


def image_size(source: bytes | str | os.PathLike[str], what: str | None = None,
               max_pixels: int | None = None) -> tuple[int, int]:
    """(width, height) the header of the image in ``source`` declares, checked as :func:`read_image`
    checks it; no pixel is decoded (a folder's total is summed from these before any decoding)."""
    return _open_checked(source, what, max_pixels, None, decode=False)


def _open_checked(source: bytes | str | os.PathLike[str], what: str | None, max_pixels: int | None,
                  formats: tuple[str, ...] | None, decode: bool) -> Any:
    """The image opened lazily, its header checked; then decoded (a copy) or just its size."""
    limit = max_pixels if max_pixels is not None else max_pixels_for()
    label = what or (str(source) if not isinstance(source, bytes) else "image")
    try:
        with warnings.catch_warnings():  # Pillow warns on the header of a huge image; the check below refuses it
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(source) if isinstance(source, bytes) else Path(source))
        with image:
            width, height = image.size
            if width * height > limit:
                raise ImageTooLarge(f"{label}: {width} x {height} pixels is more than the limit of {limit} "
                                    f"(${MAX_PIXELS_ENV} sets it)")
            if formats is not None and image.format not in formats:
                raise ImageUnreadable(f"{label}: a {image.format} image, expected {' or '.join(formats)}")
            if not decode:
                return width, height
            image.load()
            return image.copy()
    except BadInput:
        raise
    except Image.DecompressionBombError as exc:
        raise ImageTooLarge(f"{label}: {' '.join(str(exc).split())}") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        reason = "not an image" if isinstance(exc, UnidentifiedImageError) else (
            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        raise ImageUnreadable(f"{label}: cannot decode the image ({reason})") from None
