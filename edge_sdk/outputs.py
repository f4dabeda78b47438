"""Writing results where the user asked, without ever harming what edge-sdk did not write.

Every command that writes (export, calibrate, unpack, pack, build, eval and bench reports) goes through this module:

- `check_target` runs before any work and refuses, in one line naming the path and the reason: an empty path; a
  symbolic link; a path ending in '..'; the current directory, one of its parents, the filesystem root or the home
  directory; an input of the command (the model, the archive), a directory containing one or a path inside one; a
  path inside an edge-sdk bundle or predictors directory (recognised by their marks); and, unless the
  command may replace it (--force for directories and archives), anything that exists. What --force replaces must
  be an output edge-sdk itself wrote, recognised by its own marks (a bundle's manifest, a predictors directory's
  header metadata, an archive's manifest, a report's producer field) and holding nothing else: only regular files,
  under the names edge-sdk writes (a directory or a link there is the user's). It must also be a regular file or a
  directory (never a FIFO or a device), not a mount point, in a directory edge-sdk can write.
- `staged_output` builds the result in a hidden sibling (`.NAME.edge-sdk-staging-...`), held under a lock for
  the writer's lifetime, and publishes it by one rename. Publishing is exclusive: if the target changed since
  `check_target` looked (another writer got there first, or the output to replace now holds something edge-sdk did
  not write: it is checked again at the rename, and once more after it, undoing the exchange), this writer's result
  is discarded with a clear error and nothing is replaced. A writer that fails or is interrupted (Ctrl-C; SIGTERM
  and SIGHUP too, through the CLI) removes its staging entry and the directories it created for the output, and
  names the output, never the staging entry, in its message; one that dies (even by SIGKILL) leaves only its
  hidden staging entry, whose lock the kernel releases; the next command writing into that directory removes it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import math
import os
import re
import secrets
import shutil
import stat
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from edge_sdk import __version__
from edge_sdk.errors import EdgeSdkError

STAGING_MARK = ".edge-sdk-staging-"
# A staging entry's whole name, as staged_output makes it: ".NAME" + STAGING_MARK + "PID-" + 8 hex digits. Only
# names of this form are ever swept, so a user's file that merely contains the mark is left alone.
_STAGING_NAME = re.compile(r"\..+" + re.escape(STAGING_MARK) + r"[0-9]+-[0-9a-f]{8}")
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2
_AT_FDCWD = -100
NAME_MAX = 255  # bytes in one file name, on every file system Linux writes
MAX_MARK_BYTES = 64 << 20  # the most of a file read to recognise it as ours


class OutputError(EdgeSdkError):
    """An output location edge-sdk must not write, or a write that could not complete."""


@dataclass(frozen=True)
class OutputKind:
    """What a command writes: a directory or a file, its name in messages, and how to recognise one edge-sdk
    wrote (ours returns None, or the reason it is not ours)."""

    noun: str
    is_directory: bool
    ours: Callable[[Path], str | None]
    # whether replacing an earlier one takes --force (a report option replaces an earlier edge-sdk report without it,
    # and eval and bench have no --force)
    replaced_with_force: bool = True


@dataclass(frozen=True)
class Target:
    """A checked output location: the path, its kind, and the identity (device, inode) of the output it replaces,
    or None when it did not exist when checked."""

    path: Path
    kind: OutputKind
    replaces: tuple[int, int] | None


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _is_within(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def _protected_reason(path: Path, inputs: tuple[tuple[str, Path], ...]) -> str | None:
    real = _real(path)
    if real == real.parent:
        return "is the filesystem root"
    cwd = _real(Path.cwd())
    if _is_within(cwd, real):
        return "is the current directory" if real == cwd else "contains the current directory"
    home = os.environ.get("HOME")
    if home and real == _real(Path(home)):
        return "is the home directory"
    for noun, source in inputs:
        source_real = _real(source)
        if real == source_real:
            return f"is the {noun}"
        if _is_within(source_real, real):
            return f"contains the {noun} {source}"
        if _is_within(real, source_real):
            return f"is inside the {noun} {source}"
    return None


def check_target(
    path: str | Path, kind: OutputKind, *, replace: bool, inputs: tuple[tuple[str, str | Path], ...] = ()
) -> Target:
    """Refuse an output location edge-sdk must not write (see the module docstring); replace: the user allowed
    replacing an earlier edge-sdk output there (--force)."""
    if str(path) == "":  # Path("") would be the current directory, which the user did not name
        raise OutputError(f"the {kind.noun}'s path is empty; name where to write it")
    path = Path(path)
    too_long = len(os.fsencode(_staging_name(path, "-replaced"))) - NAME_MAX
    if too_long > 0:
        raise OutputError(
            f"{path}: the name is {too_long} bytes too long for edge-sdk, which writes the {kind.noun} beside it under "
            f"a longer hidden name first; use a name of at most {len(os.fsencode(path.name)) - too_long} bytes"
        )
    if path.is_symlink():
        raise OutputError(f"{path}: is a symbolic link; edge-sdk writes its {kind.noun} only to a real path")
    reason = _protected_reason(path, tuple((noun, Path(source)) for noun, source in inputs))
    if reason is not None:
        raise OutputError(f"{path}: {reason}; edge-sdk never writes its {kind.noun} there")
    if path.name == "..":
        # the output would be staged in the directory before '..' and published by renaming '..': neither is the
        # directory the user named
        raise OutputError(f"{path}: ends in '..'; name the {kind.noun} itself")
    container = _enclosing_output(path)
    if container is not None:
        raise OutputError(
            f"{path}: is inside the edge-sdk {container[0]} {container[1]}, which holds only its own files; "
            f"write the {kind.noun} elsewhere"
        )
    try:
        info = path.lstat()
    except (FileNotFoundError, NotADirectoryError):
        _check_parent(path, kind)
        return Target(path, kind, None)
    except OSError as problem:
        raise OutputError(f"{path}: cannot inspect ({problem.strerror})") from None
    if not replace:
        # the hint to use --force only where --force would replace what is there, else why it would not
        try:
            _check_replaceable(path, info, kind)
        except OutputError as refusal:
            why = str(refusal).removeprefix(f"{path}: ")
            raise OutputError(f"{path}: already exists, and --force would not replace it: {why}") from None
        raise OutputError(f"{path}: already exists (use --force to replace an earlier edge-sdk {kind.noun})")
    _check_replaceable(path, info, kind)
    return Target(path, kind, (info.st_dev, info.st_ino))


def _check_replaceable(path: Path, info: os.stat_result, kind: OutputKind) -> None:
    """Raise OutputError unless the existing path (lstat info) is an earlier edge-sdk output of this kind that can be
    replaced by a rename beside it."""
    expected_type = stat.S_ISDIR if kind.is_directory else stat.S_ISREG
    if not expected_type(info.st_mode):  # checked before reading it: a FIFO would block the read forever
        raise OutputError(f"{path}: is {_file_type(info.st_mode)}, not an edge-sdk {kind.noun}; refusing to replace it")
    if os.path.ismount(path):
        raise OutputError(
            f"{path}: is a mount point; edge-sdk replaces its {kind.noun} by a rename, which cannot move it"
        )
    _check_parent(path, kind)  # the new output is staged beside the old one
    why_not = kind.ours(path)
    if why_not is not None:
        if kind.replaced_with_force:
            raise OutputError(f"{path}: {why_not}; --force replaces only an edge-sdk {kind.noun}")
        raise OutputError(f"{path}: {why_not}; write the {kind.noun} elsewhere")


def _enclosing_output(path: Path) -> tuple[str, Path] | None:
    """(noun, directory) of the edge-sdk bundle or predictors directory that path lies in, judged by their marks
    (an edge-sdk manifest, a predictors header); None when no existing ancestor is one."""
    directory = _real(path.absolute().parent)
    for ancestor in (directory, *directory.parents):
        if not ancestor.is_dir():
            continue
        if _bundle_manifest(ancestor) is not None:
            return "bundle", ancestor
        if _has_predictors_header(ancestor):
            return "predictors directory", ancestor
    return None


def check_model_output(
    path: str | Path, kind: OutputKind, *, replace: bool, model_dir: str | Path, input_files: Iterable[str | Path] = ()
) -> Target:
    """check_target for a command that reads a model and text files (calibrate, export, sweep) and writes `kind`:
    none of its inputs may be written over. It imports nothing heavy, so that the command line refuses a wrong
    location before it loads torch."""
    inputs = (("input model", model_dir), *(("input file", file) for file in input_files))
    return check_target(path, kind, replace=replace, inputs=inputs)


def _file_type(mode: int) -> str:
    for is_type, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISREG, "a file"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if is_type(mode):
            return name
    return "a device"


def _check_parent(path: Path, kind: OutputKind) -> None:
    """The nearest existing ancestor must be a directory we can write in (the rest is created)."""
    for ancestor in path.absolute().parents:
        if ancestor.exists():
            if not ancestor.is_dir():
                raise OutputError(f"{path}: {ancestor} is a file, so the {kind.noun} cannot be created below it")
            if not os.access(ancestor, os.W_OK | os.X_OK):
                why = (
                    "is on a read-only file system" if os.statvfs(ancestor).f_flag & os.ST_RDONLY else "is not writable"
                )
                raise OutputError(f"{path}: {ancestor} {why}, so the {kind.noun} cannot be created there")
            return


# (device, inode) of the staging directories this process holds locked while it writes into them
_held_staging: set[tuple[int, int]] = set()


@contextlib.contextmanager
def _directory_lock(directory: Path) -> Iterator[None]:
    """An exclusive lock on directory (flock on its descriptor) while staging entries are created, swept or
    published; where the file system has no such locks the lock is skipped (renames stay exclusive)."""
    descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        info = os.fstat(descriptor)
        if (info.st_dev, info.st_ino) in _held_staging:
            # an output staged inside this process's own staging directory (sweep's bundles): that lock is ours
            # already, and flock would wait on it forever (each open file description locks on its own)
            yield
            return
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX)
        except OSError as problem:
            if problem.errno not in (errno.EBADF, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise
        yield
    finally:
        os.close(descriptor)


def sweep_stale_staging(directory: Path) -> list[Path]:
    """Remove staging entries in directory whose writer died (its lock is free); returns what was removed.
    The caller holds the directory lock, so no writer is between creating its entry and locking it."""
    removed = []
    try:
        names = [name for name in os.listdir(directory) if _STAGING_NAME.fullmatch(name)]
    except OSError:
        return removed
    for name in names:
        entry = directory / name
        try:
            descriptor = os.open(entry, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(descriptor)
            continue  # alive: its writer holds the lock
        try:
            if stat.S_ISDIR(os.fstat(descriptor).st_mode):
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
        finally:
            os.close(descriptor)
    return removed


def _staging_name(path: Path, suffix: str = "") -> str:
    """The hidden name path's output is written under before it is published (suffix: the replaced output's)."""
    return f".{path.name}{STAGING_MARK}{os.getpid()}-{secrets.token_hex(4)}{suffix}"


def _renameat2(source: Path, destination: Path, flags: int) -> bool:
    """rename(2) with RENAME_NOREPLACE / RENAME_EXCHANGE; False where the C library or file system lacks it.
    OSError for other failures (EEXIST: RENAME_NOREPLACE found the destination taken)."""
    libc = _libc()
    function = getattr(libc, "renameat2", None) if libc is not None else None
    if function is None:
        return False
    result = function(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(destination), flags)
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(destination))


_libc_handle: list[ctypes.CDLL | None] = []


def _libc() -> ctypes.CDLL | None:
    if not _libc_handle:
        try:
            _libc_handle.append(ctypes.CDLL(None, use_errno=True))
        except OSError:
            _libc_handle.append(None)
    return _libc_handle[0]


def _remove(path: Path) -> None:
    """Remove a staging entry, never raising: it runs while another error is on its way to the user, which it must
    not hide (on a read-only file system even unlinking a missing file fails); whatever stays is swept later."""
    with contextlib.suppress(OSError):
        if stat.S_ISDIR(path.lstat().st_mode):
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink()


def _changed_message(target: Target) -> str:
    return (
        f"{target.path}: changed while this command ran (another process wrote it); this {target.kind.noun} was "
        f"discarded and nothing was replaced"
    )


def _publish(staging: Path, target: Target) -> None:
    """Move staging to target.path if the target is still as check_target saw it (the directory lock is held)."""
    path = target.path
    try:
        info = path.lstat()
    except FileNotFoundError:
        info = None
    if target.replaces is None:
        if info is not None:
            raise OutputError(_changed_message(target))
        try:
            if not _renameat2(staging, path, _RENAME_NOREPLACE):
                os.rename(staging, path)
        except FileExistsError:
            raise OutputError(_changed_message(target)) from None
        return
    if info is None or (info.st_dev, info.st_ino) != target.replaces:
        raise OutputError(_changed_message(target))
    # Checked again now, not only before the work: the user may have put files into the old output meanwhile (an
    # export takes an hour), and replacing it removes the old one whole.
    _check_still_ours(path, target)
    if _renameat2(staging, path, _RENAME_EXCHANGE):
        _remove_replaced(staging, path, target)  # staging now holds the replaced output
        return
    retired = path.with_name(_staging_name(path, "-replaced"))
    os.rename(path, retired)
    try:
        _check_still_ours(retired, target)
    except OutputError:
        os.rename(retired, path)
        raise
    os.rename(staging, path)
    _remove(retired)


def _check_still_ours(old: Path, target: Target) -> None:
    why_not = target.kind.ours(old)
    if why_not is not None:
        raise OutputError(
            f"{target.path}: changed while this command ran: it now {why_not}; this {target.kind.noun} was "
            f"discarded and the earlier one left as it is"
        )


def _remove_replaced(replaced: Path, path: Path, target: Target) -> None:
    """Remove the output an exchange of names replaced, unless something foreign reached it between the last check
    and the exchange: then the exchange is undone (the new output, now at replaced, is discarded by the caller)."""
    try:
        _check_still_ours(replaced, target)
    except OutputError:
        _renameat2(replaced, path, _RENAME_EXCHANGE)
        raise
    _remove(replaced)


@contextlib.contextmanager
def staged_output(target: Target) -> Iterator[Path]:
    """Yield a fresh staging path next to target (an empty directory, or a file path not yet created); when the
    block succeeds it becomes the target (see the module docstring). On any exception, or an interrupt, the
    staging entry is removed and the target is left as it was."""
    parent = target.path.absolute().parent
    # deepest first; a '..' or '.' component is not a directory of its own (rmdir of 'a/..' fails and would stop
    # the removal before 'a')
    created = [
        ancestor for ancestor in (parent, *parent.parents) if ancestor.name not in ("..", ".") and not ancestor.exists()
    ]
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except BaseException as problem:  # an interrupt (SIGINT, SIGTERM) too: what was made for the output goes
        _remove_created(created)
        if isinstance(problem, OSError):
            raise OutputError(f"{target.path}: cannot create its directory {parent} ({problem.strerror})") from None
        raise
    staging = parent / _staging_name(target.path)
    try:
        with _directory_lock(parent):
            sweep_stale_staging(parent)
            if target.kind.is_directory:
                staging.mkdir(mode=0o755)
                lock = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            else:
                lock = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
            fcntl.flock(lock, fcntl.LOCK_EX)
            identity = os.fstat(lock)
            held = (identity.st_dev, identity.st_ino)
    except BaseException as problem:
        _remove(staging)
        _remove_created(created)
        if isinstance(problem, OSError):
            raise OutputError(f"{target.path}: cannot write in {parent} ({problem.strerror})") from None
        raise
    _held_staging.add(held)
    try:
        yield staging
        with _directory_lock(parent):
            try:
                _publish(staging, target)
            except OSError as problem:
                raise OutputError(
                    f"{target.path}: cannot put the new {target.kind.noun} in place ({problem.strerror}); "
                    f"{_kept(target)}"
                ) from None
    except BaseException as problem:
        _remove(staging)
        _remove_created(created)
        if isinstance(problem, OSError) and _is_write_failure(problem, staging):
            raise OutputError(
                f"{target.path}: cannot write the {target.kind.noun} ({problem.strerror}); {_kept(target)}"
            ) from None
        raise
    finally:
        _held_staging.discard(held)
        os.close(lock)


# errors only writing causes; reading an input fails otherwise, and names its file
_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)


def _is_write_failure(problem: OSError, staging: Path) -> bool:
    """Whether problem came from writing the staged output (a full disk names no file, or names the staging
    entry, a hidden name that means nothing to the user)."""
    if problem.errno in _WRITE_ERRNOS:
        return True
    return problem.filename is not None and _is_within(Path(os.fsdecode(problem.filename)), staging)


def _kept(target: Target) -> str:
    return f"the earlier {target.kind.noun} is unchanged" if target.replaces else "nothing was left behind"


def _remove_created(directories: list[Path]) -> None:
    """Remove the directories staged_output created for an output that failed, deepest first, each only while it
    is empty: whatever another process put there meanwhile stays."""
    for directory in directories:
        try:
            directory.rmdir()
        except OSError:
            return


def check_report(path: str | Path, inputs: tuple[tuple[str, str | Path], ...] = ()) -> Target:
    """A report file's location (--json, --plot, --markdown): new, or a report edge-sdk wrote there before; never
    one of the command's inputs (noun, path) or inside one (a report written into a bundle would break its manifest)."""
    return check_target(path, REPORT, replace=True, inputs=inputs)


def check_reports(paths: Iterable[str | Path | None], inputs: tuple[tuple[str, str | Path], ...] = ()) -> None:
    """check_report for each of a command's report locations (None: not asked for), which must be distinct files."""
    seen: dict[Path, Path] = {}
    for path in paths:
        if path is None:
            continue
        check_report(path, inputs)
        real = _real(Path(path))
        if real in seen:
            raise OutputError(f"{path}: is also the location of another report ({seen[real]}); give each its own path")
        seen[real] = Path(path)


def write_report(
    path: str | Path, write: Callable[[Path], object], inputs: tuple[tuple[str, str | Path], ...] = ()
) -> Path:
    """Check path as a report location, let write(staging_path) write the file, then publish it."""
    target = check_report(path, inputs)
    with staged_output(target) as staging:
        write(staging)
    return target.path


def report_json(report: dict) -> str:
    """The text of a JSON report. A value JSON has no number for (nan, inf) is refused, naming where it is: json
    would write NaN, which no strict reader (edge-sdk's own included) accepts."""
    try:
        return json.dumps(report, indent=2, allow_nan=False) + "\n"
    except ValueError:
        raise OutputError(
            f"the report's {_non_finite_field(report)} is not a finite number; nothing was written"
        ) from None


def _non_finite_field(value: object, where: str = "") -> str | None:
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where} ({value})"
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list | tuple) else ()
    for key, child in children:
        found = _non_finite_field(child, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def write_reports(
    reports: Iterable[tuple[str | Path | None, Callable[[Path], object]]],
    inputs: tuple[tuple[str, str | Path], ...] = (),
) -> None:
    """write_report for each (path, write) of one command (None: not asked for), all or none: every report is
    staged first and published only once all were written, so a full disk while drawing the plot leaves no JSON."""
    with contextlib.ExitStack() as staged:
        for path, write in reports:
            if path is not None:
                write(staged.enter_context(staged_output(check_report(path, inputs))))


# ---- recognising edge-sdk's own outputs ------------------------------------------------------------------------


def _json_object(path: Path) -> dict | None:
    from edge_sdk.formats import strict_json
    from edge_sdk.formats.files import read_bounded

    try:
        value = strict_json.parse(read_bounded(path, MAX_MARK_BYTES, follow_symlinks=False), str(path))
    except EdgeSdkError:
        return None
    return value if isinstance(value, dict) else None


def _foreign_entries(directory: Path, allowed: set[str]) -> list[str]:
    """Entries edge-sdk did not write: names it does not write there, and its names held by anything but a regular
    file (a directory, a link: replacing the output would delete what they hold, or the user's link)."""
    foreign = []
    for name in sorted(os.listdir(directory)):
        mode = (directory / name).lstat().st_mode
        if name not in allowed:
            foreign.append(repr(name))
        elif not stat.S_ISREG(mode):
            foreign.append(f"{name!r} ({_file_type(mode)})")
    return foreign


def _bundle_manifest(directory: Path) -> dict | None:
    """The edge-sdk manifest of a bundle directory, or None when it has none."""
    from edge_sdk.bundle import format as bundle_format

    manifest_path = directory / bundle_format.MANIFEST_FILE
    if not manifest_path.is_file():
        return None
    manifest = _json_object(manifest_path)
    if (
        manifest is None
        or manifest.get("format") != bundle_format.FORMAT
        or not isinstance(manifest.get("files"), dict)
    ):
        return None
    return manifest


def bundle_is_ours(directory: Path) -> str | None:
    from edge_sdk.bundle import format as bundle_format

    manifest = _bundle_manifest(directory)
    if manifest is None:
        return f"has no edge-sdk {bundle_format.MANIFEST_FILE}, so it is not an edge-sdk bundle"
    foreign = _foreign_entries(directory, {bundle_format.MANIFEST_FILE, *manifest["files"]})
    if foreign:
        return f"holds {foreign[0]}, which is not part of the bundle ({len(foreign)} such)"
    return None


def sweep_bundles_are_ours(directory: Path) -> str | None:
    """A sweep's bundles directory (sweep -o DIR writes DIR/bundles): edge-sdk bundles only, and the staging entries
    of writers that died there."""
    for name in sorted(os.listdir(directory)):
        entry = directory / name
        if _STAGING_NAME.fullmatch(name):
            continue
        if entry.is_symlink() or not entry.is_dir():
            return f"holds {name!r} ({_file_type(entry.lstat().st_mode)}), which is not an edge-sdk bundle"
        why_not = bundle_is_ours(entry)
        if why_not is not None:
            return f"holds {name!r}, which {why_not}"
    return None


PREDICTORS_FORMAT = "edge-sdk-predictors"
PREDICTORS_FILES = ("predictors.safetensors", "report.json", "report.png")


def _has_predictors_header(directory: Path) -> bool:
    """Whether directory holds a predictors.safetensors whose header carries edge-sdk's predictors format."""
    from edge_sdk.formats import safetensors

    predictors_file = directory / PREDICTORS_FILES[0]
    if not predictors_file.is_file():
        return False
    try:
        header = safetensors.read_header(predictors_file, follow_symlinks=False)
    except EdgeSdkError:
        return False
    return header.metadata.get("format") == PREDICTORS_FORMAT


def predictors_dir_is_ours(directory: Path) -> str | None:
    if not _has_predictors_header(directory):
        return f"has no edge-sdk {PREDICTORS_FILES[0]}, so it is not an edge-sdk predictors directory"
    foreign = _foreign_entries(directory, set(PREDICTORS_FILES))
    if foreign:
        return f"holds {foreign[0]}, which edge-sdk did not write there ({len(foreign)} such)"
    return None


ENGINE_FILES = ("model.engine", "engine.json")  # libedge_sdk's names for a cached engine and its record
# the fixed name earlier builds wrote the engine under before renaming it, which a failed one left behind
OLD_ENGINE_STAGING_FILE = "model.partial"


def engine_dir_is_ours(directory: Path) -> str | None:
    """A TensorRT engine's directory in the engine cache (<cache>/<key digest>, named by libedge_sdk): edge-sdk's
    files only. Its record may be missing or unreadable (a build that failed before this module wrote engines)."""
    foreign = _foreign_entries(directory, {*ENGINE_FILES, OLD_ENGINE_STAGING_FILE})
    if foreign:
        return f"holds {foreign[0]}, which edge-sdk did not write there ({len(foreign)} such)"
    return None


def archive_is_ours(path: Path) -> str | None:
    from edge_sdk.bundle import format as bundle_format
    from edge_sdk.formats import strict_json

    try:
        with tarfile.open(path, mode="r:") as archive:
            members = archive.getmembers()
            member = archive.getmember(bundle_format.MANIFEST_FILE)
            handle = archive.extractfile(member) if member.isreg() and member.size <= MAX_MARK_BYTES else None
            manifest = strict_json.parse(handle.read(), str(path)) if handle is not None else None
    except (tarfile.TarError, KeyError, OSError, EdgeSdkError):
        manifest = None
    if (
        not isinstance(manifest, dict)
        or manifest.get("format") != bundle_format.FORMAT
        or not isinstance(manifest.get("files"), dict)
    ):
        return "is not an edge-sdk bundle archive"
    allowed = {bundle_format.MANIFEST_FILE, *manifest["files"]}
    foreign = [member.name for member in members if member.name not in allowed or not member.isreg()]
    if foreign:
        return f"holds {foreign[0]!r}, which is not part of the bundle ({len(foreign)} such)"
    return None


REPORT_PRODUCER_FIELD = "edge_sdk"
PNG_SOFTWARE = "edge-sdk"
PNG_METADATA = {"Software": f"{PNG_SOFTWARE} {__version__}"}  # matplotlib's savefig metadata for our plots
MARKDOWN_MARK = "<!-- written by edge-sdk"
MARKDOWN_HEADER = f"{MARKDOWN_MARK} {__version__} -->\n"  # the first line of our markdown reports


def report_is_ours(path: Path) -> str | None:
    """JSON reports carry bench.record.with_machine_info's fields (a top-level "edge_sdk" version string, the
    "machine" description and the "date"), PNG plots a Software text chunk "edge-sdk ...", markdown a first-line
    comment."""
    try:
        head = path.open("rb").read(64)
    except OSError as problem:
        return f"cannot be read ({problem.strerror})"
    if head.startswith(b"\x89PNG"):
        return None if _png_software(path).startswith(PNG_SOFTWARE) else "is a PNG image edge-sdk did not draw"
    if head.startswith(MARKDOWN_MARK.encode()):
        return None
    report = _json_object(path)
    if (
        report is not None
        and isinstance(report.get(REPORT_PRODUCER_FIELD), str)
        and re.fullmatch(r"[0-9]+\.[0-9]+\S*", report[REPORT_PRODUCER_FIELD])
        and isinstance(report.get("machine"), dict)
        and isinstance(report.get("date"), str)
    ):
        return None
    return "is not a report edge-sdk wrote"


def _png_software(path: Path) -> str:
    """The Software tEXt chunk of a PNG file ("" when absent)."""
    import struct

    with path.open("rb") as handle:
        handle.read(8)
        while True:
            head = handle.read(8)
            if len(head) < 8:
                return ""
            length, chunk = struct.unpack(">I4s", head)
            if chunk == b"IEND" or length > MAX_MARK_BYTES:
                return ""
            data = handle.read(length)
            handle.read(4)
            if chunk == b"tEXt" and data.startswith(b"Software\x00"):
                return data[len(b"Software\x00") :].decode("latin-1")


BUNDLE = OutputKind("bundle", True, bundle_is_ours)
PREDICTORS = OutputKind("predictors directory", True, predictors_dir_is_ours)
ARCHIVE = OutputKind("bundle archive", False, archive_is_ours)
REPORT = OutputKind("report", False, report_is_ours, replaced_with_force=False)
ENGINE = OutputKind("TensorRT engine", True, engine_dir_is_ours)
SWEEP_BUNDLES = OutputKind("sweep's bundles directory", True, sweep_bundles_are_ours)
