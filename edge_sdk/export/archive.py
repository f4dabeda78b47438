"""A bundle as one .tar file (DESIGN.md 3.4: "a directory (or a .tar of it)"), for `edge-sdk pack` / `unpack`.

The archive holds the bundle's files at its root (manifest.json, weights.safetensors, ...), not inside a
top-level folder. Packing is deterministic: the same bundle gives the same bytes on any machine (entries sorted
by path, mtime 0, uid/gid 0, no user or group names, modes 0644 / 0755, PAX format so files over 8 GiB fit).
Unpacking trusts nothing in the archive: every member must be a regular file or directory whose path stays
inside the target (no absolute paths, no '..', no links, devices or FIFOs, no duplicates); the files are written
into a temporary directory next to the target, verified with Bundle.open(verify_checksums=True), and only then
renamed to the target, so a failed unpack leaves nothing behind.
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from edge_sdk.export.bundle import Bundle, BundleError
from edge_sdk.staging import staged_directory

COPY_CHUNK_BYTES = 16 << 20
FILE_MODE = 0o644
DIRECTORY_MODE = 0o755


class ArchiveError(BundleError):
    """A bundle archive is unsafe, malformed, or cannot be written where asked."""


def _bundle_entries(bundle_dir: Path) -> list[Path]:
    """Every file and directory below bundle_dir, sorted by POSIX path; links and special files are refused."""
    entries = []
    for path in sorted(bundle_dir.rglob("*"), key=lambda p: p.relative_to(bundle_dir).as_posix()):
        mode = path.lstat().st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise ArchiveError(f"{path}: only regular files and directories can be packed (found a link or device)")
        entries.append(path)
    return entries


def _tar_info(name: str, is_dir: bool, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if is_dir else tarfile.REGTYPE
    info.mode = DIRECTORY_MODE if is_dir else FILE_MODE
    info.size = 0 if is_dir else size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def pack_bundle(bundle_dir: str | Path, tar_path: str | Path, verify: bool = True) -> Path:
    """Write the bundle directory to tar_path (uncompressed, deterministic); returns tar_path.

    verify: open the bundle with checksums first, so a corrupt bundle is never packed. The archive is written
    to a temporary file next to tar_path and renamed at the end.
    """
    bundle_dir, tar_path = Path(bundle_dir), Path(tar_path)
    if verify:
        Bundle.open(bundle_dir, verify_checksums=True)
    elif not bundle_dir.is_dir():
        raise ArchiveError(f"{bundle_dir}: bundle directory not found")
    entries = _bundle_entries(bundle_dir)
    tar_path.parent.mkdir(parents=True, exist_ok=True)
    handle, staging_name = tempfile.mkstemp(prefix=f".{tar_path.name}.", dir=tar_path.parent)
    staging = Path(staging_name)
    try:
        with os.fdopen(handle, "wb") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for path in entries:
                name = path.relative_to(bundle_dir).as_posix()
                if path.is_dir():
                    tar.addfile(_tar_info(name, True, 0))
                    continue
                with path.open("rb") as source:
                    tar.addfile(_tar_info(name, False, os.fstat(source.fileno()).st_size), source)
        os.replace(staging, tar_path)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise
    return tar_path


def _member_path(member: tarfile.TarInfo, tar_path: Path) -> PurePosixPath | None:
    """The member's path relative to the target (None for the archive's root entry "."), or ArchiveError."""
    name = member.name
    pure = PurePosixPath(name)
    parts = [part for part in pure.parts if part != "."]
    if not name or pure.is_absolute() or "\\" in name or ".." in parts or (parts and ":" in parts[0]):
        raise ArchiveError(f"{tar_path}: member {name!r} must be a relative path inside the bundle")
    if not (member.isreg() or member.isdir()):
        raise ArchiveError(
            f"{tar_path}: member {name!r} is a link, device or FIFO; a bundle archive holds only files and directories"
        )
    return PurePosixPath(*parts) if parts else None


def _extract_members(tar: tarfile.TarFile, tar_path: Path, target: Path) -> None:
    seen: set[PurePosixPath] = set()
    root = target.resolve()
    for member in tar:
        relative = _member_path(member, tar_path)
        if relative is None:
            continue
        if relative in seen:
            raise ArchiveError(f"{tar_path}: member {member.name!r} appears twice")
        seen.add(relative)
        destination = target.joinpath(*relative.parts)
        if not destination.resolve().is_relative_to(root):
            raise ArchiveError(f"{tar_path}: member {member.name!r} points outside the bundle")
        if member.isdir():
            destination.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
            continue
        destination.parent.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)
        source = tar.extractfile(member)
        if source is None:
            raise ArchiveError(f"{tar_path}: member {member.name!r} has no data")
        with source, open(destination, "xb") as output:
            shutil.copyfileobj(source, output, COPY_CHUNK_BYTES)
        destination.chmod(FILE_MODE)


def unpack_bundle(tar_path: str | Path, out_dir: str | Path, force: bool = False) -> Bundle:
    """Unpack a bundle archive to out_dir and return the opened bundle (checksums verified).

    out_dir must not exist unless force (then it is replaced, but only after the new bundle verified).
    Raises ArchiveError for unsafe or malformed archives and BundleError when the unpacked bundle does not verify.
    """
    tar_path, out_dir = Path(tar_path), Path(out_dir)
    if not tar_path.is_file():
        raise ArchiveError(f"{tar_path}: archive not found")
    if out_dir.exists() and not force:
        raise ArchiveError(f"{out_dir}: output directory already exists (use --force to replace it)")
    with staged_directory(out_dir) as staging:
        try:
            with tarfile.open(tar_path, mode="r:*") as tar:
                _extract_members(tar, tar_path, staging)
        except tarfile.TarError as error:
            raise ArchiveError(f"{tar_path}: not a readable tar archive ({error})") from None
        Bundle.open(staging, verify_checksums=True)
    return Bundle.open(out_dir, verify_checksums=False)
