"""Reading input files: regular files only, size-bounded, and (inside a bundle) never through a symbolic link.

Every failure is the caller's error class with a one-line message naming the path and the reason.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from pathlib import Path

from edge_sdk.errors import EdgeSdkError

HASH_CHUNK_BYTES = 16 << 20


def open_regular(path: Path, *, follow_symlinks: bool, error: type[EdgeSdkError] = EdgeSdkError) -> int:
    """A read-only descriptor of path, which must be a regular file (and, unless follow_symlinks, not a link)."""
    # O_NONBLOCK: opening a FIFO must not wait for a writer (it is then refused as not a regular file)
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        descriptor = os.open(path, flags)
    except FileNotFoundError:
        raise error(f"{path}: file not found") from None
    except OSError as problem:
        if problem.errno == errno.ELOOP and not follow_symlinks:
            raise error(f"{path}: is a symbolic link; a bundle holds regular files only") from None
        raise error(f"{path}: cannot open ({problem.strerror})") from None
    mode = os.fstat(descriptor).st_mode
    if not stat.S_ISREG(mode):
        os.close(descriptor)
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise error(f"{path}: is {kind}; expected a regular file")
    os.set_blocking(descriptor, True)
    return descriptor


def file_size(path: Path, *, follow_symlinks: bool, error: type[EdgeSdkError] = EdgeSdkError) -> int:
    """The size of a regular file (see open_regular)."""
    descriptor = open_regular(path, follow_symlinks=follow_symlinks, error=error)
    try:
        return os.fstat(descriptor).st_size
    finally:
        os.close(descriptor)


def read_utf8_text(path: Path, what: str, error: type[EdgeSdkError] = EdgeSdkError) -> str:
    """A text file's content, which must be UTF-8 (see decode_utf8)."""
    return decode_utf8(path.read_bytes(), path, what, error)


def decode_utf8(data: bytes, path: Path, what: str, error: type[EdgeSdkError] = EdgeSdkError) -> str:
    """data, the content of the file at path, as text, which must be UTF-8: otherwise error naming the file, what it
    is, the first byte that is not and its offset (a stray byte in a corpus would otherwise become U+FFFD tokens
    without a word)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as problem:
        raise error(
            f"{path}: the {what} is not UTF-8 text (byte 0x{data[problem.start]:02x} at offset {problem.start})"
        ) from None


def read_bounded(
    path: Path, max_bytes: int, *, follow_symlinks: bool, error: type[EdgeSdkError] = EdgeSdkError
) -> bytes:
    """The whole content of a regular file of at most max_bytes bytes."""
    descriptor = open_regular(path, follow_symlinks=follow_symlinks, error=error)
    with os.fdopen(descriptor, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size > max_bytes:
            raise error(f"{path}: {size} bytes, more than the {max_bytes} this reader accepts")
        try:
            return handle.read(max_bytes + 1)
        except OSError as problem:
            raise error(f"{path}: read failed ({problem.strerror})") from None


def sha256_of(path: Path, *, follow_symlinks: bool, error: type[EdgeSdkError] = EdgeSdkError) -> tuple[int, str]:
    """(size in bytes, sha256 hex digest) of a regular file, read in chunks."""
    descriptor = open_regular(path, follow_symlinks=follow_symlinks, error=error)
    digest = hashlib.sha256()
    with os.fdopen(descriptor, "rb") as handle:
        try:
            while chunk := handle.read(HASH_CHUNK_BYTES):
                digest.update(chunk)
        except OSError as problem:
            raise error(f"{path}: read failed ({problem.strerror})") from None
        return os.fstat(handle.fileno()).st_size, digest.hexdigest()
