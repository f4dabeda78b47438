"""A bundle as one .tar file (DESIGN.md 3.4: "a directory (or a .tar of it)"), for `edge-sdk pack` / `unpack`.

The archive holds manifest.json and the files the manifest lists, at its root. Packing is deterministic: the same
bundle gives the same bytes on any machine (entries sorted by name, mtime 0, uid/gid 0, no user or group names,
mode 0644, PAX format so files over 8 GiB fit, manifest.json first and then the other files sorted by name).
Unpacking trusts nothing in the archive: every member must be a regular file with a plain name (no path, no link,
device or FIFO, no duplicate, at most MAX_MEMBERS of them, no more bytes than the disk has free), the archive must
hold a valid manifest.json, and every other member must be a file it lists, of the size it lists, all checked from
the tar headers before anything is extracted (a small compressed archive cannot fill the disk). Reaching the next
header of a compressed archive means decompressing the member before it, so the members before the manifest (only
the graphs, in archives packed before the manifest came first) may declare MAX_BYTES_BEFORE_MANIFEST in all: a
hostile archive cannot make unpack decompress terabytes to find its manifest. After extraction the bundle must open
with every checksum verified.
Both write through edge_sdk.outputs, so a failed pack or unpack leaves nothing behind and never replaces what
edge-sdk did not write.
"""

from __future__ import annotations

import os
import shutil
import tarfile
from pathlib import Path

from edge_sdk import outputs
from edge_sdk.bundle import format as bundle_format
from edge_sdk.bundle.manifest import BundleError, Manifest, validate
from edge_sdk.bundle.reader import Bundle
from edge_sdk.formats import strict_json
from edge_sdk.formats.files import open_regular

COPY_CHUNK_BYTES = 16 << 20
FILE_MODE = 0o644
MAX_MEMBERS = 64
# Far more than the ONNX graphs of a 70B model (their weights live in weights.safetensors): a few MB.
MAX_BYTES_BEFORE_MANIFEST = 64 << 20
# Names that promise a compressed archive, which pack does not write (unpack reads them)
COMPRESSED_SUFFIXES = (".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst", ".gz", ".zip")


class ArchiveError(BundleError):
    """A bundle archive is unsafe, malformed, or cannot be written where asked."""


def _tar_info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.REGTYPE
    info.mode = FILE_MODE
    info.size = size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def pack_bundle(bundle_dir: str | Path, tar_path: str | Path, *, verify: bool = True, force: bool = False) -> Path:
    """Write the bundle at bundle_dir to tar_path (uncompressed, deterministic); returns tar_path.

    The bundle is opened first (with every checksum unless verify is off), so a corrupt bundle is never packed.
    force: replace an earlier edge-sdk archive at tar_path."""
    bundle_dir = Path(bundle_dir)
    compressed = next((suffix for suffix in COMPRESSED_SUFFIXES if str(tar_path).lower().endswith(suffix)), None)
    if compressed is not None:
        raise ArchiveError(
            f"{tar_path}: pack writes an uncompressed .tar (quantized weights hardly compress), not a {compressed} "
            "file: name it .tar, and compress it afterwards if you like (unpack reads .tar.gz, .tar.bz2 and .tar.xz)"
        )
    target = outputs.check_target(tar_path, outputs.ARCHIVE, replace=force, inputs=(("bundle", bundle_dir),))
    bundle = Bundle.open(bundle_dir, verify_checksums=verify)
    names = [bundle_format.MANIFEST_FILE, *sorted(bundle.manifest.files)]
    with (
        outputs.staged_output(target) as staging,
        staging.open("wb") as raw,
        tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for name in names:
            # not through a link: one swapped in since the bundle was opened would archive a file outside it
            descriptor = open_regular(bundle_dir / name, follow_symlinks=False, error=ArchiveError)
            with os.fdopen(descriptor, "rb") as source:
                tar.addfile(_tar_info(name, os.fstat(descriptor).st_size), source)
    return target.path


def _member_name(member: tarfile.TarInfo, tar_path: Path) -> str:
    name = member.name
    if not member.isreg():
        raise ArchiveError(
            f"{tar_path}: member {name[:200]!r} is a directory, link, device or FIFO; a bundle archive holds only "
            f"regular files"
        )
    if name != bundle_format.MANIFEST_FILE and not bundle_format.FILE_NAME.fullmatch(name):
        raise ArchiveError(
            f"{tar_path}: member {name[:200]!r} is not a plain file name; a bundle archive holds its files at its "
            f"root, named without paths"
        )
    return name


def _read_manifest(tar: tarfile.TarFile, member: tarfile.TarInfo, tar_path: Path) -> Manifest:
    """The archive's manifest.json, validated as Bundle.open validates it."""
    where = f"{tar_path}: member {bundle_format.MANIFEST_FILE}"
    if member.size > bundle_format.MAX_MANIFEST_BYTES:
        raise ArchiveError(f"{where}: {member.size} bytes, more than the {bundle_format.MAX_MANIFEST_BYTES} allowed")
    source = tar.extractfile(member)
    if source is None:
        raise ArchiveError(f"{where}: has no data")
    with source:
        return validate(strict_json.parse(source.read(), where, error=BundleError), where)


def _check_listed(member: tarfile.TarInfo, name: str, manifest: Manifest, tar_path: Path) -> None:
    """A member other than manifest.json must be a file the manifest lists, of the size it lists."""
    entry = manifest.files.get(name)
    if entry is None:
        raise ArchiveError(f"{tar_path}: member {name!r} is not a file the bundle's manifest lists")
    if member.size != entry.size:
        raise ArchiveError(f"{tar_path}: member {name!r} holds {member.size} bytes; the manifest lists {entry.size}")


def _checked_members(tar: tarfile.TarFile, tar_path: Path, target: Path) -> list[tuple[tarfile.TarInfo, str]]:
    """Every member with its name, checked from the headers alone before anything is extracted: plain regular files,
    no duplicate, the manifest's files at the manifest's sizes (read as soon as its member comes), and no more
    bytes in all than the disk has free, checked member by member so that a compressed archive declaring more is
    refused without reading on through it."""
    free = shutil.disk_usage(target).free
    members: list[tuple[tarfile.TarInfo, str]] = []
    manifest = None
    declared = 0
    for member in tar:
        if len(members) == MAX_MEMBERS:
            raise ArchiveError(f"{tar_path}: more than {MAX_MEMBERS} members; a bundle has a handful of files")
        name = _member_name(member, tar_path)
        if any(name == seen for _, seen in members):
            raise ArchiveError(f"{tar_path}: member {name!r} appears twice")
        members.append((member, name))
        declared += member.size
        if manifest is None and name != bundle_format.MANIFEST_FILE and declared > MAX_BYTES_BEFORE_MANIFEST:
            raise ArchiveError(
                f"{tar_path}: its members before {bundle_format.MANIFEST_FILE} declare {declared} bytes, more than "
                f"the {MAX_BYTES_BEFORE_MANIFEST} a bundle's graphs take; expected an archive that edge-sdk pack "
                "wrote (manifest.json first)"
            )
        if declared > free:
            # named by the output's directory: target is the hidden staging entry in it, a name meaningless to a user
            raise ArchiveError(
                f"{tar_path}: unpacking needs at least {declared} bytes, the file system of {target.parent} has "
                f"{free} free"
            )
        if name == bundle_format.MANIFEST_FILE:
            manifest = _read_manifest(tar, member, tar_path)
            for earlier, earlier_name in members[:-1]:
                _check_listed(earlier, earlier_name, manifest, tar_path)
        elif manifest is not None:
            _check_listed(member, name, manifest, tar_path)
    if manifest is None:
        raise ArchiveError(f"{tar_path}: has no {bundle_format.MANIFEST_FILE}; expected an edge-sdk bundle archive")
    return members


def _extract(tar: tarfile.TarFile, tar_path: Path, target: Path) -> None:
    for member, name in _checked_members(tar, tar_path, target):
        source = tar.extractfile(member)
        if source is None:
            raise ArchiveError(f"{tar_path}: member {name!r} has no data")
        with source, open(target / name, "xb") as output:
            shutil.copyfileobj(source, output, COPY_CHUNK_BYTES)
        (target / name).chmod(FILE_MODE)


def _open_archive(tar_path: Path) -> tarfile.TarFile:
    """The archive opened for reading, plain or compressed (gzip, bzip2, xz: tarfile's "r:*")."""
    try:
        return tarfile.open(tar_path, mode="r:*")
    except (tarfile.TarError, EOFError):  # tarfile's message lists every compression it tried, one per line
        raise ArchiveError(
            f"{tar_path}: not a tar archive (expected a bundle archive, plain or compressed with gzip, bzip2 or xz)"
        ) from None
    except OSError as error:
        raise ArchiveError(f"{tar_path}: cannot read ({error.strerror})") from None


def unpack_bundle(tar_path: str | Path, out_dir: str | Path, *, force: bool = False) -> Bundle:
    """Unpack a bundle archive to out_dir and return the opened bundle (checksums verified).

    out_dir must not exist unless force, and then only an earlier edge-sdk bundle is replaced (after the new one
    verified). Raises ArchiveError for unsafe or malformed archives and BundleError when the unpacked bundle does
    not verify."""
    tar_path = Path(tar_path)
    target = outputs.check_target(out_dir, outputs.BUNDLE, replace=force, inputs=(("archive", tar_path),))
    if not tar_path.is_file():
        if tar_path.is_dir():
            found = "is a directory, not an archive file"
        elif tar_path.exists():  # a FIFO or a device: reading it could wait forever or never end
            found = "is not a regular file; expected a bundle archive (.tar)"
        else:
            found = "archive not found"
        raise ArchiveError(f"{tar_path}: {found}")
    with outputs.staged_output(target) as staging:
        try:
            with _open_archive(tar_path) as tar:
                _extract(tar, tar_path, staging)
        except (tarfile.TarError, EOFError) as error:
            raise ArchiveError(f"{tar_path}: not a readable tar archive ({error})") from None
        try:
            Bundle.open(staging, verify_checksums=True)
        except BundleError as error:  # named by the archive and its member: the staging path means nothing to a user
            message = str(error).replace(f"{staging}{os.sep}", f"{tar_path}: member ").replace(str(staging), "it")
            raise BundleError(message) from None
    return Bundle.open(target.path, verify_checksums=False)
