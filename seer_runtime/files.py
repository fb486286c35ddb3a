"""Where results are written: output paths checked before the work, files replaced atomically.

Every command that writes a file (``seer calibrate --out/--plot``, ``calibrate-dyllm --out``,
``seer demo --json/--plot``, and ``StoredConfig.to_json`` under them) uses these helpers, so that

* a bad output path is an error naming the option and the path *before* a model is loaded or a
  request decoded (:func:`check_output_path`): a missing parent directory is created (the user
  asked for a file in it), one that cannot be created or written to is refused at once;
* a result is written to a temporary file in the destination's directory and renamed over the
  destination with ``os.replace`` (:func:`atomic_write`): readers see the old file or the whole
  new one, never a prefix, and a run interrupted or failing while it writes leaves no file that
  looks complete (the temporary file is removed).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["OutputPathError", "atomic_write", "check_output_path", "check_plot_path", "write_json"]


class OutputPathError(ValueError):
    """An output path that cannot be written: the message names the option and the path."""


def _label(option: str | None, path: Path) -> str:
    return f"{option} {path}" if option else str(path)


def check_output_path(path: str | os.PathLike, *, option: str | None = None, create_parent: bool = True) -> Path:
    """Check, before any long work, that a file can be written at ``path``; returns it as a ``Path``.

    The parent directory is created when missing (``create_parent``). Raises :class:`OutputPathError`
    (a ``ValueError``) naming ``option`` and ``path`` when the path is empty, is a directory, has a
    parent that is a file or cannot be created, or lies in a directory this process cannot create
    files in (tried with a temporary file, removed at once: the real test where permissions,
    read-only mounts and ACLs are concerned). An existing file at ``path`` is kept until the
    result replaces it.
    """
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise OutputPathError(f"{option or 'output path'}: expected a file path, got {path!r}")
    path = Path(path).expanduser()
    where = _label(option, path)
    if path.is_dir():
        raise OutputPathError(f"{where} is a directory: give a file path inside it")
    parent = path.parent
    for above in (parent, *parent.parents):  # the nearest existing ancestor must be a directory
        if above.exists():
            if not above.is_dir():
                raise OutputPathError(f"{where}: {above} is a file, not a directory")
            break
    if not parent.is_dir():
        if not create_parent:
            raise OutputPathError(f"{where}: the directory {parent} does not exist")
        try:
            parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputPathError(f"{where}: cannot create the directory {parent} ({exc.strerror or exc})") from None
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=".check")
    except OSError as exc:
        raise OutputPathError(f"{where}: cannot write in {parent} ({exc.strerror or exc})") from None
    os.close(fd)
    os.unlink(probe)
    return path


def check_plot_path(path: str | os.PathLike, *, option: str | None = None) -> Path:
    """:func:`check_output_path` for a figure, and the figure's format from its suffix (a format
    matplotlib writes; matplotlib installed): a figure that could not be written is refused before
    the work, not after it."""
    path = check_output_path(path, option=option)
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise OutputPathError(f"{_label(option, path)}: writing a plot needs matplotlib, which is not installed "
                              "(pip install -e '.[plot]')") from None
    formats = FigureCanvasBase.get_supported_filetypes()
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in formats:
        raise OutputPathError(f"{_label(option, path)}: the suffix {path.suffix or '(none)'!r} is not a figure format "
                              f"matplotlib writes; use one of {sorted(formats)}")
    return path


def _file_mode(path: Path) -> int:
    """The permission bits a plain ``open(path, "w")`` would give (an existing file keeps its own)."""
    try:
        return os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", *, encoding: str | None = "utf-8") -> Iterator:
    """Open a temporary file beside ``path`` for writing; when the block ends without an exception
    it is flushed to disk and renamed over ``path`` (``os.replace``, atomic on one file system).
    On an exception (``KeyboardInterrupt`` included) the temporary file is removed, ``path`` is left
    as it was, and the exception goes on. ``mode``: "w" (text, ``encoding``) or "wb"."""
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, encoding=encoding if mode == "w" else None) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _file_mode(path))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike, data, *, indent: int | None = 2) -> None:
    """``json.dump(data)`` into ``path`` atomically (:func:`atomic_write`): the data is encoded
    first, so a value JSON cannot hold raises before anything is written."""
    text = json.dumps(data, indent=indent)
    with atomic_write(path) as f:
        f.write(text + "\n")
