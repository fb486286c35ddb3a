"""Images as users give them: a file path or a PIL image, one or several per request.

* :func:`open_image` reads an image file, refusing before it decodes any pixel a file whose
  header claims more than ``PIL.Image.MAX_IMAGE_PIXELS`` pixels (a decompression bomb, or a
  picture far larger than any model's views: downscale it first), and naming the file when it
  is missing, not an image, or truncated (even when ``PIL.ImageFile.LOAD_TRUNCATED_IMAGES`` is
  set, as lmms-eval sets it on import: the flag is cleared while the file decodes, so that
  function is not thread-safe against code that sets the flag at the same time). EXIF
  orientation is applied, as ``transformers``' ``load_image`` does; a file of several frames
  (GIF, APNG, TIFF pages) gives its first.
* :func:`to_rgb` converts any mode to 8-bit RGB the way ``transformers``' ``convert_to_rgb``
  does (alpha, including a palette's transparent index, composited over white), and scales
  16-bit pixels (``I;16*``, a 16-bit PNG read as ``I``) to 8 bits instead of clipping them at
  255; pixels without a defined range (``F`` floats, other 32-bit ``I`` images) are refused by
  name.
* :func:`request_images` normalises ``generate(images=...)``: one entry per request, each None,
  a path, a PIL image, an already prepared image, or a list of those (one per ``<image>`` in the
  prompt, in order); anything else is a ``TypeError`` saying what was expected.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path

__all__ = ["open_image", "request_images", "to_rgb"]

#: modes whose pixels ``to_rgb`` scales from 16 bits to 8
_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N")


def _pil():
    from PIL import Image

    return Image


def open_image(path: str | os.PathLike, *, what: str = "image file"):
    """The image in the file ``path``, decoded and converted to 8-bit RGB (:func:`to_rgb`).

    Raises ``FileNotFoundError`` (no such file) and ``ValueError`` naming ``what`` and the file:
    a directory, not an image, a header claiming more pixels than ``PIL.Image.MAX_IMAGE_PIXELS``
    (checked before any pixel is decoded), a truncated or corrupt file, a mode without a defined
    range. ``TypeError`` when ``path`` is not a path.
    """
    Image = _pil()
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise TypeError(f"{what}: expected a file path, got {type(path).__name__} {path!r}")
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} does not exist")
    if path.is_dir():
        raise ValueError(f"{what} {path} is a directory, not an image file")
    from PIL import ImageFile

    limit = Image.MAX_IMAGE_PIXELS
    lenient = ImageFile.LOAD_TRUNCATED_IMAGES
    try:
        with warnings.catch_warnings():
            # PIL warns above MAX_IMAGE_PIXELS and raises above twice that: both are refused here
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                # a truncated file is an error even where a library (lmms-eval, on import) told PIL to
                # fill the missing pixels with grey: that image is not the one the user gave
                ImageFile.LOAD_TRUNCATED_IMAGES = False
                try:
                    img.load()
                finally:
                    ImageFile.LOAD_TRUNCATED_IMAGES = lenient
                rgb = to_rgb(_oriented(img), source=f"{what} {path}")
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        found = re.search(r"\((\d+) pixels\)", str(exc))
        size = f"{int(found.group(1)):,} pixels" if found else "too many pixels"
        raise ValueError(f"{what} {path} claims {size}, more than the {limit:,} (PIL.Image.MAX_IMAGE_PIXELS) an "
                         "image may have here: a decompression bomb, or a picture to downscale before use") from None
    except Image.UnidentifiedImageError:
        raise ValueError(f"{what} {path} is not an image file PIL can read") from None
    except (OSError, SyntaxError, EOFError) as exc:  # PIL's errors for truncated and corrupt data
        raise ValueError(f"{what} {path} cannot be decoded ({exc}): the file is truncated or corrupt") from None
    return rgb


def _oriented(img):
    """``img`` turned as its EXIF orientation says (transformers' load_image does the same)."""
    from PIL import ImageOps

    return ImageOps.exif_transpose(img) if img.getexif().get(0x0112, 1) != 1 else img


def to_rgb(image, *, source: str = "image"):
    """An 8-bit RGB copy of the PIL image ``image`` (returned as is when already RGB).

    16-bit greyscale (``I;16``, ``I;16L``, ``I;16B``, ``I;16N``, and ``I`` decoded from a PNG,
    which can only hold 16 bits there) is scaled by 255/65535; every mode with alpha or a
    palette is composited over white (``transformers``' ``convert_to_rgb``); ``F`` (floats) and
    other ``I`` images (32-bit integers) have no range to scale from and raise ``ValueError``
    naming ``source`` and the mode, as does a mode PIL cannot convert.
    """
    Image = _pil()
    if not isinstance(image, Image.Image):
        raise TypeError(f"{source}: expected a PIL image, got {type(image).__name__}")
    mode = image.mode
    if mode == "RGB":
        return image
    if mode in _SIXTEEN_BIT or (mode == "I" and image.format == "PNG"):
        import numpy as np

        pixels = np.asarray(image).astype(np.float64)
        return Image.fromarray(np.rint(pixels * (255.0 / 65535.0)).clip(0, 255).astype(np.uint8), "L").convert("RGB")
    if mode in ("I", "F"):
        kind = "32-bit integer" if mode == "I" else "floating-point"
        raise ValueError(f"{source}: mode {mode!r} ({kind} pixels) has no defined range to scale to 8 bits; save the "
                         "image with 8 or 16 bits per channel")
    try:
        rgba = image.convert("RGBA")
    except ValueError as exc:
        raise ValueError(f"{source}: mode {mode!r} cannot be converted to RGB ({exc})") from None
    background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
    return Image.alpha_composite(background, rgba).convert("RGB")


def request_images(images, batch: int, *, prepare: Callable, prepared: type) -> list[list] | None:
    """``generate(images=...)`` as one list of prepared images per request (None: no images).

    images: None, or a list / tuple with one entry per request (``batch`` of them); each entry
    None (no image), a path (``str`` or ``os.PathLike``, read with :func:`open_image`), a PIL
    image (:func:`to_rgb`), an instance of ``prepared`` (kept as is), or a list / tuple of those
    (one per ``<image>`` placeholder, in order). ``prepare(pil_rgb_image)`` turns one picture
    into a ``prepared`` object. Raises ``TypeError`` / ``ValueError`` naming ``images[i]`` (and
    ``[j]``) and the file.
    """
    if images is None:
        return None
    Image = _pil()
    expected = "None, a path, a PIL image, a prepared image (ImageInput) or a list of those"
    if not isinstance(images, (list, tuple)):
        raise TypeError(f"images must be a list with one entry per request ({batch}) - each {expected} - got "
                        f"{type(images).__name__}" + (" (wrap it: images=[path])" if isinstance(
                            images, (str, os.PathLike, Image.Image)) else ""))
    if len(images) != batch:
        raise ValueError(f"images must have one entry per request ({batch}), got {len(images)}")

    def one(item, where: str):
        if isinstance(item, prepared):
            return item
        if isinstance(item, (str, os.PathLike)):
            return prepare(open_image(item, what=f"{where}: image file"))
        if isinstance(item, Image.Image):
            return prepare(to_rgb(item, source=where))
        raise TypeError(f"{where} must be {expected}, got {type(item).__name__}")

    out: list = []
    for i, entry in enumerate(images):
        if entry is None:
            out.append(None)
        elif isinstance(entry, (list, tuple)):
            out.append([one(item, f"images[{i}][{j}]") for j, item in enumerate(entry)])
        else:
            out.append([one(entry, f"images[{i}]")])
    return out
