"""Bundle archives (edge_sdk/bundle/archive.py): deterministic packing, a verified round trip, and unpacking that
refuses every member that is not one of the bundle's plain files."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from edge_sdk.bundle import Bundle, BundleError
from edge_sdk.bundle.archive import ArchiveError, pack_bundle, unpack_bundle
from edge_sdk.errors import EdgeSdkError
from edge_sdk.export.exporter import ExportSettings, export_bundle
from edge_sdk.sparsity.settings import CalibrationSettings


@pytest.fixture(scope="module")
def bundle_dir(tiny_model_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("archive") / "bundle"
    export_bundle(
        tiny_model_dir,
        out,
        ExportSettings(dtype="fp16", max_seq_len=32, calibration=CalibrationSettings(predictor="none")),
    )
    return out


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def leftovers(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir() if path.name.startswith("."))


def test_pack_is_deterministic_and_normalizes_metadata(bundle_dir, tmp_path):
    first = pack_bundle(bundle_dir, tmp_path / "first.tar")
    for path in bundle_dir.iterdir():
        os.utime(path, (1_700_000_000, 1_700_000_000))
    second = pack_bundle(bundle_dir, tmp_path / "second.tar")
    assert digest(first) == digest(second)
    with tarfile.open(first) as tar:
        members = tar.getmembers()
    names = [member.name for member in members]
    # the manifest first: unpack reads it before it has to get past any other member
    assert names[0] == "manifest.json" and names[1:] == sorted(names[1:]) and "weights.safetensors" in names
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname, m.mode) for m in members} == {(0, 0, 0, "", "", 0o644)}
    assert leftovers(tmp_path) == []


def test_round_trip_gives_the_same_verified_bundle(bundle_dir, tmp_path):
    archive = pack_bundle(bundle_dir, tmp_path / "bundle.tar")
    unpacked = unpack_bundle(archive, tmp_path / "out")
    assert isinstance(unpacked, Bundle) and unpacked.root == tmp_path / "out"
    for path in bundle_dir.iterdir():
        assert digest(tmp_path / "out" / path.name) == digest(path)
    with pytest.raises(EdgeSdkError, match="already exists"):
        unpack_bundle(archive, tmp_path / "out")
    assert unpack_bundle(archive, tmp_path / "out", force=True).config.vocab_size == 2048
    assert leftovers(tmp_path) == []


def test_pack_takes_only_listed_files_and_refuses_links_and_corrupt_bundles(bundle_dir, tmp_path):
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in bundle_dir.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    (copy / "notes.txt").write_text("the user's own notes")
    with tarfile.open(pack_bundle(copy, tmp_path / "listed.tar")) as tar:
        assert "notes.txt" not in tar.getnames()
    (copy / "weights.safetensors").rename(tmp_path / "weights.safetensors")
    (copy / "weights.safetensors").symlink_to(tmp_path / "weights.safetensors")
    with pytest.raises(BundleError, match=r"weights\.safetensors: is a symbolic link"):
        pack_bundle(copy, tmp_path / "x.tar")
    (copy / "weights.safetensors").unlink()
    (tmp_path / "weights.safetensors").rename(copy / "weights.safetensors")
    with (copy / "tokenizer.json").open("ab") as handle:
        handle.write(b" ")
    with pytest.raises(BundleError, match=r"tokenizer\.json"):
        pack_bundle(copy, tmp_path / "x.tar")
    assert not (tmp_path / "x.tar").exists()


def archive_with(bundle_dir: Path, path: Path, extra: tarfile.TarInfo, data: bytes = b"") -> Path:
    """The bundle's files plus one extra member."""
    with tarfile.open(path, "w") as tar:
        for file in sorted(bundle_dir.iterdir()):
            tar.add(file, arcname=file.name)
        extra.size = len(data) if extra.isreg() else 0
        tar.addfile(extra, io.BytesIO(data) if extra.isreg() else None)
    return path


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (member("/etc/evil"), "not a plain file name"),
        (member("../evil"), "not a plain file name"),
        (member("sub/../../evil"), "not a plain file name"),
        (member("a\\b"), "not a plain file name"),
        (member("zz/x"), "not a plain file name"),
        (member(".hidden"), "not a plain file name"),
        (member("sub", tarfile.DIRTYPE), "is a directory, link, device or FIFO"),
        (member("link", tarfile.SYMTYPE, "/etc/passwd"), "is a directory, link, device or FIFO"),
        (member("hard", tarfile.LNKTYPE, "manifest.json"), "is a directory, link, device or FIFO"),
        (member("device", tarfile.CHRTYPE), "is a directory, link, device or FIFO"),
        (member("fifo", tarfile.FIFOTYPE), "is a directory, link, device or FIFO"),
        (member("manifest.json"), "appears twice"),
        (member("extra.bin"), "is not a file the bundle's manifest lists"),
    ],
)
def test_unpack_refuses_unsafe_members(bundle_dir, tmp_path, extra, message):
    archive = archive_with(bundle_dir, tmp_path / "bad.tar", extra, b"payload")
    target = tmp_path / "out" / "bundle"
    with pytest.raises(ArchiveError, match=message):
        unpack_bundle(archive, target)
    assert not target.parent.exists() and leftovers(tmp_path) == []  # out/, created for the bundle, removed too
    assert not (tmp_path / "evil").exists()


def test_unpack_verifies_checksums(bundle_dir, tmp_path):
    archive = tmp_path / "changed.tar"
    with tarfile.open(archive, "w") as tar:
        for file in sorted(bundle_dir.iterdir()):
            data = file.read_bytes()
            if file.name == "weights.safetensors":
                data = data[:-1] + bytes([data[-1] ^ 1])
            info = tarfile.TarInfo(file.name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with pytest.raises(BundleError, match=r"weights\.safetensors: sha256 is"):
        unpack_bundle(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_unpack_refuses_non_archives(tmp_path):
    not_tar = tmp_path / "bundle.tar"
    not_tar.write_bytes(b"this is not a tar file" * 100)
    with pytest.raises(ArchiveError) as refused:
        unpack_bundle(not_tar, tmp_path / "out")
    assert str(refused.value) == (
        f"{not_tar}: not a tar archive (expected a bundle archive, plain or compressed with gzip, bzip2 or xz)"
    )
    with pytest.raises(ArchiveError, match="archive not found"):
        unpack_bundle(tmp_path / "missing.tar", tmp_path / "out")
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("compression", ["gz", "xz"])
def test_unpack_refuses_a_member_larger_than_the_manifest_says_before_extracting_anything(
    bundle_dir, tmp_path, monkeypatch, compression
):
    """50 MB of zeros compress to a few KB: a member declaring more than the manifest lists is refused from its
    header, before any member is written."""
    archive = tmp_path / f"bomb.tar.{compression}"
    zeros = 50 << 20
    with tarfile.open(archive, f"w:{compression}") as tar:
        for file in sorted(bundle_dir.iterdir()):
            info = tarfile.TarInfo(file.name)
            info.size = zeros if file.name == "weights.safetensors" else file.stat().st_size
            tar.addfile(info, io.BytesIO(bytes(zeros)) if file.name == "weights.safetensors" else file.open("rb"))
    assert archive.stat().st_size < 1 << 20
    written = []
    monkeypatch.setattr("edge_sdk.bundle.archive.shutil.copyfileobj", lambda *args: written.append(args))
    listed = (bundle_dir / "weights.safetensors").stat().st_size
    with pytest.raises(ArchiveError) as refused:
        unpack_bundle(archive, tmp_path / "out")
    assert str(refused.value) == (
        f"{archive}: member 'weights.safetensors' holds {zeros} bytes; the manifest lists {listed}"
    )
    assert written == [] and not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_unpack_refuses_a_member_before_the_manifest_that_it_does_not_list(bundle_dir, tmp_path):
    archive = tmp_path / "unlisted.tar"
    with tarfile.open(archive, "w") as tar:
        tar.addfile(tarfile.TarInfo("aaa.bin"), io.BytesIO(b""))
        for file in sorted(bundle_dir.iterdir()):
            tar.add(file, arcname=file.name)
    with pytest.raises(ArchiveError, match=r"member 'aaa\.bin' is not a file the bundle's manifest lists"):
        unpack_bundle(archive, tmp_path / "out")
    missing_manifest = tmp_path / "no-manifest.tar"
    with tarfile.open(missing_manifest, "w") as tar:
        tar.add(bundle_dir / "weights.safetensors", arcname="weights.safetensors")
    with pytest.raises(ArchiveError, match=r"has no manifest\.json; expected an edge-sdk bundle archive"):
        unpack_bundle(missing_manifest, tmp_path / "out")
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_pack_refuses_a_file_swapped_for_a_link_after_the_bundle_was_opened(bundle_dir, tmp_path, monkeypatch):
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in bundle_dir.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    outside = tmp_path / "outside.json"
    outside.write_text("the user's secret\n")
    opened = Bundle.open

    def open_then_swap(*args, **kwargs):
        bundle = opened(*args, **kwargs)
        (copy / "tokenizer.json").unlink()
        (copy / "tokenizer.json").symlink_to(outside)
        return bundle

    monkeypatch.setattr("edge_sdk.bundle.archive.Bundle.open", open_then_swap)
    with pytest.raises(ArchiveError, match=r"tokenizer\.json: is a symbolic link; a bundle holds regular files only"):
        pack_bundle(copy, tmp_path / "out.tar")
    assert not (tmp_path / "out.tar").exists() and leftovers(tmp_path) == []


def test_unpack_names_the_outputs_directory_not_its_staging_when_the_disk_is_too_small(
    bundle_dir, tmp_path, monkeypatch
):
    archive = pack_bundle(bundle_dir, tmp_path / "bundle.tar")
    small = shutil.disk_usage(tmp_path)._replace(free=1000)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: small)
    with pytest.raises(ArchiveError) as refused:
        unpack_bundle(archive, tmp_path / "out" / "bundle")
    assert str(refused.value).endswith(f"bytes, the file system of {tmp_path / 'out'} has 1000 free")
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_an_archive_packed_with_sorted_names_still_unpacks(bundle_dir, tmp_path):
    """Archives packed before the manifest came first hold decode.onnx before it: a few KB, well within what may
    come before the manifest."""
    archive = tmp_path / "sorted.tar"
    with tarfile.open(archive, "w") as tar:
        for file in sorted(bundle_dir.iterdir()):
            tar.add(file, arcname=file.name)
    with tarfile.open(archive) as tar:
        assert tar.getnames()[0] == "decode.onnx"
    assert unpack_bundle(archive, tmp_path / "out").config.vocab_size == 2048


def test_members_before_the_manifest_are_bounded_before_their_data_is_read(bundle_dir, tmp_path, monkeypatch):
    """To reach the manifest of a compressed archive, unpack decompresses every member before it: a hostile archive
    put terabytes of zeros (a few MB compressed) there. The members before the manifest may declare
    MAX_BYTES_BEFORE_MANIFEST in all (lowered here to keep the archive small); one declaring more is refused from
    its header, nothing read past it."""
    monkeypatch.setattr("edge_sdk.bundle.archive.MAX_BYTES_BEFORE_MANIFEST", 4096)
    archive = tmp_path / "padded.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.addfile(_sized("decode.onnx", 3000), io.BytesIO(bytes(3000)))
        tar.addfile(_sized("prefill.onnx", 2000), io.BytesIO(bytes(2000)))
        tar.add(bundle_dir / "manifest.json", arcname="manifest.json")
    read = []
    monkeypatch.setattr("edge_sdk.bundle.archive._read_manifest", lambda *args: read.append(args))
    with pytest.raises(ArchiveError) as refused:
        unpack_bundle(archive, tmp_path / "out")
    assert str(refused.value) == (
        f"{archive}: its members before manifest.json declare 5000 bytes, more than the 4096 a bundle's graphs take; "
        "expected an archive that edge-sdk pack wrote (manifest.json first)"
    )
    assert read == [] and not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def _sized(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    return info


@pytest.mark.parametrize("name", ["bundle.tgz", "bundle.tar.gz", "bundle.TAR.XZ", "bundle.zip"])
def test_pack_refuses_a_name_that_promises_compression(bundle_dir, tmp_path, name):
    """`pack B out.tgz` wrote an uncompressed tar under a gzip name."""
    with pytest.raises(ArchiveError, match=r"pack writes an uncompressed \.tar .* name it \.tar"):
        pack_bundle(bundle_dir, tmp_path / name)
    assert not (tmp_path / name).exists()
