"""Writing outputs never harms what edge-sdk did not write (edge_sdk/outputs.py), asserted through real processes:
exit status 2, one line on stderr, no traceback, and the file system around the target unchanged, with no
staging left behind. Also: publishing is exclusive between two writers, a killed writer's staging is swept by the
next writer, and operating-system errors (a full disk, a read-only file system) are one line too."""

from __future__ import annotations

import errno
import fcntl
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import click
import numpy as np
import pytest

from edge_sdk import cli, outputs
from edge_sdk.bench.record import with_machine_info
from edge_sdk.outputs import (
    BUNDLE,
    PREDICTORS_FORMAT,
    REPORT,
    STAGING_MARK,
    OutputError,
    bundle_is_ours,
    check_report,
    check_target,
    predictors_dir_is_ours,
    report_is_ours,
    report_json,
    staged_output,
    write_reports,
)

from ..conftest import TINY_MODEL

QUICK_EXPORT = ["--predictor", "none", "--max-seq-len", "32"]
# A calibrated export kept short: a given rank and level, and the model-wide level in every layer (no rank search, no
# validation, one level fitted instead of the allocation grid). What these tests assert happens after calibration.
QUICK_CALIBRATION = ["--tokens", "1024", "--levels", "0.5", "--sparsity", "0.5", "--rank", "16"]
QUICK_CALIBRATION += ["--level-allocation", "uniform"]


def edge_sdk(*args: str | Path, cwd: Path | None = None, env: dict | None = None, timeout: int = 300):
    return subprocess.run(
        [sys.executable, "-m", "edge_sdk", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=timeout,
    )


def snapshot(root: Path) -> dict[str, tuple]:
    """Everything below root: path -> (kind, size, modification time, inode), links not followed."""
    found = {}
    for directory, names, files in os.walk(root):
        for name in names + files:
            path = Path(directory) / name
            info = path.lstat()
            found[str(path.relative_to(root))] = (info.st_mode >> 12, info.st_size, info.st_mtime_ns, info.st_ino)
    return found


def assert_refused(result: subprocess.CompletedProcess, *fragments: str) -> None:
    errors = [line for line in result.stderr.splitlines() if line.startswith("edge-sdk: error:")]
    assert result.returncode == 2, result.stderr
    assert len(errors) == 1 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


def staging_left(root: Path) -> list[str]:
    return [path for path in snapshot(root) if STAGING_MARK in path]


@pytest.fixture
def workspace(tmp_path, tiny_model_dir) -> Path:
    """A user's directory: a model, notes of their own, and nothing of edge-sdk's yet."""
    shutil.copytree(tiny_model_dir, tmp_path / "model", ignore=shutil.ignore_patterns("*.txt"))
    (tmp_path / "notes.txt").write_text("my own notes\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "more.txt").write_text("more\n")
    return tmp_path


@pytest.fixture(scope="module")
def archive(tiny_model_dir, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("archive")
    assert edge_sdk("export", tiny_model_dir, "-o", root / "bundle", *QUICK_EXPORT).returncode == 0
    assert edge_sdk("pack", root / "bundle", root / "bundle.tar").returncode == 0
    return root / "bundle.tar"


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        (".", "is the current directory"),
        ("..", "contains the current directory"),
        ("/", "is the filesystem root"),
        ("model", "is the input model"),
        ("model/bundle", "is inside the input model"),
        ("data", "has no edge-sdk manifest.json, so it is not an edge-sdk bundle"),
        ("notes.txt", "is a file, not an edge-sdk bundle"),
        ("link", "is a symbolic link"),
        ("notes.txt/bundle", "is a file, so the bundle cannot be created below it"),
    ],
)
def test_export_force_refuses_what_edge_sdk_did_not_write(workspace, target, reason):
    (workspace / "link").symlink_to(workspace / "data")
    before = snapshot(workspace)
    result = edge_sdk("export", "model", "-o", target, "--force", *QUICK_EXPORT, cwd=workspace)
    assert_refused(result, reason)
    assert snapshot(workspace) == before


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (["export", "model", "-o", "notes.txt", "--force", *QUICK_EXPORT], "is a file, not an edge-sdk bundle"),
        (["calibrate", "model", "-o", "model", "--force", "--calib", "notes.txt"], "is the input model"),
        (["export", "nosuch", "-o", "fresh", *QUICK_EXPORT], "nosuch: model directory not found"),
        (["calibrate", "data", "-o", "fresh", "--calib", "notes.txt"], "config.json is missing"),
        (["info", "nosuch"], "nosuch: model directory not found"),
    ],
    ids=["export location", "calibrate location", "export model", "calibrate model", "info model"],
)
def test_a_wrong_path_is_refused_before_torch_is_imported(workspace, torch_that_fails, command, reason):
    """The output location and the model path are checked first, so that a mistyped path is answered at once, not
    after torch has loaded."""
    assert_refused(edge_sdk(*command, cwd=workspace, env=torch_that_fails), reason)


def test_the_commands_import_the_torch_that_fails_once_their_paths_are_right(workspace, torch_that_fails):
    for command in (
        ["export", "model", "-o", "fresh", *QUICK_EXPORT],
        ["calibrate", "model", "-o", "fresh", "--calib", "notes.txt"],
        ["info", "model"],
    ):
        result = edge_sdk(*command, cwd=workspace, env=torch_that_fails)
        assert result.returncode != 0 and "torch was imported" in result.stderr, (command, result.stderr)


def test_export_force_refuses_the_home_directory_and_a_directory_holding_the_model(workspace, tmp_path):
    home = workspace / "data"
    before = snapshot(workspace)
    result = edge_sdk(
        "export", "model", "-o", home, "--force", *QUICK_EXPORT, cwd=workspace, env=os.environ | {"HOME": str(home)}
    )
    assert_refused(result, "is the home directory")
    elsewhere = tmp_path.parent / f"{tmp_path.name}-cwd"
    elsewhere.mkdir()
    result = edge_sdk("export", workspace / "model", "-o", workspace, "--force", *QUICK_EXPORT, cwd=elsewhere)
    assert_refused(result, "contains the input model")
    assert snapshot(workspace) == before


def test_force_replaces_an_earlier_bundle_but_not_one_holding_a_users_file(workspace):
    first = edge_sdk("export", "model", "-o", "bundle", *QUICK_EXPORT, cwd=workspace)
    assert first.returncode == 0, first.stderr
    again = edge_sdk("export", "model", "-o", "bundle", *QUICK_EXPORT, cwd=workspace)
    assert_refused(again, "already exists (use --force")
    (workspace / "bundle" / "mine.txt").write_text("kept\n")
    before = snapshot(workspace)
    assert_refused(edge_sdk("export", "model", "-o", "bundle", "--force", *QUICK_EXPORT, cwd=workspace), "'mine.txt'")
    assert snapshot(workspace) == before
    (workspace / "bundle" / "mine.txt").unlink()
    inode = (workspace / "bundle").stat().st_ino
    replaced = edge_sdk("export", "model", "-o", "bundle", "--force", *QUICK_EXPORT, cwd=workspace)
    assert replaced.returncode == 0, replaced.stderr
    assert (workspace / "bundle").stat().st_ino != inode and (workspace / "notes.txt").read_text() == "my own notes\n"
    assert staging_left(workspace) == []


def test_unpack_force_refuses_the_current_directory_and_foreign_directories(workspace, archive):
    before = snapshot(workspace)
    assert_refused(edge_sdk("unpack", archive, ".", "--force", cwd=workspace), "is the current directory")
    assert_refused(edge_sdk("unpack", archive, "data", "--force", cwd=workspace), "not an edge-sdk bundle")
    assert_refused(edge_sdk("unpack", archive, archive.parent, "--force", cwd=workspace), "contains the archive")
    assert snapshot(workspace) == before
    assert edge_sdk("unpack", archive, "unpacked", cwd=workspace).returncode == 0
    assert edge_sdk("unpack", archive, "unpacked", "--force", cwd=workspace).returncode == 0
    assert staging_left(workspace) == []


def test_pack_refuses_directories_and_files_it_did_not_write(workspace, archive):
    bundle = archive.parent / "bundle"
    before = snapshot(workspace)
    assert_refused(
        edge_sdk("pack", bundle, "data", cwd=workspace),
        "data: already exists, and --force would not replace it: is a directory",
    )
    assert_refused(
        edge_sdk("pack", bundle, "notes.txt", cwd=workspace),
        "notes.txt: already exists, and --force would not replace it: is not an edge-sdk bundle archive",
    )
    assert_refused(
        edge_sdk("pack", bundle, "data", "--force", cwd=workspace), "is a directory, not an edge-sdk bundle archive"
    )
    assert_refused(edge_sdk("pack", bundle, "notes.txt", "--force", cwd=workspace), "is not an edge-sdk bundle archive")
    assert snapshot(workspace) == before
    assert edge_sdk("pack", bundle, "out.tar", cwd=workspace).returncode == 0
    assert_refused(edge_sdk("pack", bundle, "out.tar", cwd=workspace), "already exists")
    assert edge_sdk("pack", bundle, "out.tar", "--force", cwd=workspace).returncode == 0
    assert staging_left(workspace) == []


def test_unpack_refuses_a_member_path_below_a_later_file(workspace, archive):
    hostile = workspace / "hostile.tar"
    with tarfile.open(archive) as source, tarfile.open(hostile, "w") as tar:
        info = tarfile.TarInfo("zz/x")
        tar.addfile(info)
        tar.addfile(tarfile.TarInfo("zz"))
        for member in source:
            tar.addfile(member, source.extractfile(member))
    before = snapshot(workspace)
    assert_refused(edge_sdk("unpack", hostile, "out", cwd=workspace), "'zz/x' is not a plain file name")
    assert snapshot(workspace) == before


def test_two_writers_to_one_target_one_wins_the_other_is_told(workspace):
    calibration = Path(__file__).parents[1] / "fixtures" / "tiny-relu-llama" / "calibration.txt"
    args = [
        sys.executable,
        "-m",
        "edge_sdk",
        "export",
        "model",
        "-o",
        "bundle",
        "--calib",
        str(calibration),
        *QUICK_CALIBRATION,
        "--max-seq-len",
        "32",
    ]
    writers = [
        subprocess.Popen(args, cwd=workspace, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [(writer.wait(timeout=300), writer.stderr.read()) for writer in writers]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(stderr for code, stderr in results if code == 2)
    assert "changed while this command ran" in loser or "already exists" in loser, loser
    assert "Traceback" not in loser
    assert edge_sdk("verify", "bundle", "--files-only", cwd=workspace).returncode == 0
    assert staging_left(workspace) == []


def export_writing(workspace: Path, output: str, stderr: int = subprocess.DEVNULL) -> subprocess.Popen:
    """A calibrated export of the workspace's model to output, returned once it has started writing its staging."""
    calibration = Path(__file__).parents[1] / "fixtures" / "tiny-relu-llama" / "calibration.txt"
    export = ["export", "model", "-o", output, "--calib", str(calibration), *QUICK_CALIBRATION, "--max-seq-len", "32"]
    writer = subprocess.Popen(
        [sys.executable, "-m", "edge_sdk", *export],
        cwd=workspace,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        text=True,
    )
    # Calibration comes before the first write: on a busy 2-core machine a default one alone took over two minutes.
    deadline = time.monotonic() + 600
    while not staging_left(workspace) and writer.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert staging_left(workspace), f"the export never started writing (exit status {writer.poll()})"
    return writer


def test_a_killed_writer_leaves_only_hidden_staging_which_the_next_writer_sweeps(workspace):
    writer = export_writing(workspace, "bundle")
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    left = staging_left(workspace)
    assert left and all(Path(path).parts[0].startswith(".") for path in left)
    assert not (workspace / "bundle").exists()
    result = edge_sdk("export", "model", "-o", "other", *QUICK_EXPORT, cwd=workspace)
    assert result.returncode == 0, result.stderr
    assert staging_left(workspace) == []


def test_a_live_writers_staging_is_not_swept(workspace):
    staging = workspace / f".bundle{STAGING_MARK}99999-live"
    staging.mkdir()
    lock = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert edge_sdk("export", "model", "-o", "other", *QUICK_EXPORT, cwd=workspace).returncode == 0
        assert staging.is_dir()
    finally:
        os.close(lock)


def in_mount_namespace(script: str) -> subprocess.CompletedProcess:
    """Run a shell script in a private mount namespace (tmpfs and read-only mounts vanish with it)."""
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
    )


def mounts_available(tmp_path: Path) -> bool:
    probe = tmp_path / "probe"
    probe.mkdir()
    if shutil.which("unshare") is None:
        return False
    return in_mount_namespace(f"mount -t tmpfs -o size=1m tmpfs {probe}").returncode == 0


def test_a_full_disk_and_a_read_only_file_system_are_one_line(workspace, tmp_path):
    if not mounts_available(tmp_path):
        pytest.skip("needs unshare and mount (root with CAP_SYS_ADMIN) to make a small tmpfs and a read-only mount")
    command = f"{sys.executable} -m edge_sdk export {workspace / 'model'} {' '.join(QUICK_EXPORT)} -o"
    full = tmp_path / "full"
    full.mkdir()
    result = in_mount_namespace(
        f"mount -t tmpfs -o size=512k tmpfs {full} && {command} {full}/bundle; echo rc=$?; ls -A {full}"
    )
    lines = result.stdout.splitlines()
    assert "rc=2" in lines and lines[-1] == "rc=2", result.stdout + result.stderr  # nothing listed after rc: empty
    errors = [line for line in result.stderr.splitlines() if line.startswith("edge-sdk: error:")]
    assert len(errors) == 1 and "No space left on device" in errors[0] and "Traceback" not in result.stderr
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    result = in_mount_namespace(
        f"mount --bind -o ro {read_only} {read_only} && {command} {read_only}/bundle; echo rc=$?"
    )
    assert result.stdout.strip().endswith("rc=2"), result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("edge-sdk: error:")]
    assert len(errors) == 1 and "read-only file system" in errors[0] and "Traceback" not in result.stderr
    assert list(read_only.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--seed", "-1"], "'--seed': -1 is not in the range"),
        (["--threads", "5000"], "'--threads': 5000 is not in the range"),
        (["--max-new-tokens", "-3"], "'--max-new-tokens': -3 is not in the range"),
        (["--prompt", b"\xff\xfeabc".decode("utf-8", "surrogateescape")], "--prompt: not UTF-8 text"),
        (["--stop", b"ok\xff".decode("utf-8", "surrogateescape")], "--stop: not UTF-8 text"),
        (["--dense", "--sparsity", "0.5"], "--dense and --sparsity 0.5: the dense model has no sparsity level"),
        (["--stop", ""], "--stop: expected a non-empty text, found ''"),
        (["--temperature", "inf"], "'--temperature': expected a finite number, found 'inf'"),
        (["--top-p", "nan"], "'--top-p': expected a finite number, found 'nan'"),
        (["--sparsity", "nan"], "'--sparsity': expected a finite number, found 'nan'"),
    ],
)
def test_run_refuses_bad_arguments_in_one_line(archive, args, fragment):
    bundle = archive.parent / "bundle"
    extra = [] if "--prompt" in args else ["--prompt", "x"]
    assert_refused(edge_sdk("run", bundle, *extra, *args), fragment)


def test_run_refuses_a_prompt_on_standard_input_that_is_not_utf8(archive):
    result = subprocess.run(
        [sys.executable, "-m", "edge_sdk", "run", str(archive.parent / "bundle")],
        input=b"abc\xff\xfe",
        capture_output=True,
        timeout=120,
    )
    assert (
        result.returncode == 2
        and b"standard input: the prompt is not UTF-8 text (byte 0xff at offset 3)" in result.stderr
    )
    assert b"Traceback" not in result.stderr


def test_export_refuses_sizes_beyond_the_model_and_the_machine(workspace):
    calibration = Path(__file__).parents[1] / "fixtures" / "tiny-relu-llama" / "calibration.txt"
    before = snapshot(workspace)
    assert_refused(
        edge_sdk("export", "model", "-o", "b", "--predictor", "none", "--max-seq-len", "1000000000", cwd=workspace),
        "max sequence length must be in [2, 1024]",
    )
    assert_refused(
        edge_sdk("export", "model", "-o", "b", "--calib", calibration, "--tokens", "4000000000", cwd=workspace),
        "calibrating on 4000000000 tokens needs about",
        "GiB available",
    )
    assert snapshot(workspace) == before


def test_calibrate_force_refuses_what_edge_sdk_did_not_write(workspace):
    calibration = Path(__file__).parents[1] / "fixtures" / "tiny-relu-llama" / "calibration.txt"
    before = snapshot(workspace)
    for target, reason in ((".", "is the current directory"), ("data", "not an edge-sdk predictors directory")):
        result = edge_sdk("calibrate", "model", "--calib", calibration, "-o", target, "--force", cwd=workspace)
        assert_refused(result, reason)
    assert snapshot(workspace) == before


def test_report_files_replace_only_edge_sdk_reports(workspace, archive):
    bundle = archive.parent / "bundle"
    before = snapshot(workspace)
    result = edge_sdk("bench", "e2e", bundle, "--tokens", "2", "--repeats", "1", "--json", "notes.txt", cwd=workspace)
    assert_refused(result, "notes.txt: is not a report edge-sdk wrote")
    assert snapshot(workspace) == before
    for _ in range(2):  # the second run replaces the first run's report
        result = edge_sdk(
            "bench", "e2e", bundle, "--tokens", "2", "--repeats", "1", "--json", "e2e.json", cwd=workspace
        )
        assert result.returncode == 0, result.stderr
    assert staging_left(workspace) == []


def test_reports_are_never_written_into_the_commands_inputs_nor_two_on_one_path(workspace, archive, torch_that_fails):
    """Each refused before torch is imported (the report locations are checked first): at once."""
    bundle = archive.parent / "bundle"
    held_out = Path(__file__).parents[1] / "fixtures" / "tiny-relu-llama" / "held_out.txt"
    bundle_before, before = snapshot(bundle), snapshot(workspace)
    e2e = ["bench", "e2e", bundle, "--tokens", "2", "--repeats", "1"]
    result = edge_sdk(*e2e, "--json", bundle / "e2e.json", cwd=workspace, env=torch_that_fails)
    assert_refused(result, "is inside the bundle")
    evaluate = ["eval", bundle, "--text", held_out, "--tokens", "64", "--threads", "1", "--no-layer-stats"]
    result = edge_sdk(*evaluate, "--plot", bundle / "plot.png", cwd=workspace, env=torch_that_fails)
    assert_refused(result, "is inside the bundle")
    assert_refused(edge_sdk(*evaluate, "--json", held_out, cwd=workspace, env=torch_that_fails), "is the text file")
    result = edge_sdk(*evaluate, "--json", "eval.json", "--plot", "./eval.json", cwd=workspace, env=torch_that_fails)
    assert_refused(result, "./eval.json: is also the location of another report (eval.json)")
    assert snapshot(bundle) == bundle_before and snapshot(workspace) == before


def test_pack_force_refuses_an_archive_holding_a_member_edge_sdk_did_not_write(workspace, archive):
    mixed = workspace / "mixed.tar"
    shutil.copy(archive, mixed)
    with tarfile.open(mixed, "a") as tar:
        tar.add(workspace / "notes.txt", arcname="notes.txt")
    before = snapshot(workspace)
    result = edge_sdk("pack", archive.parent / "bundle", mixed, "--force", cwd=workspace)
    assert_refused(result, "mixed.tar: holds 'notes.txt', which is not part of the bundle")
    assert snapshot(workspace) == before


def test_a_failed_unpack_removes_the_directories_it_created_for_its_output(workspace, archive):
    corrupt = workspace / "corrupt.tar"
    with tarfile.open(archive) as source, tarfile.open(corrupt, "w") as tar:
        for member in source:
            data = source.extractfile(member).read()
            if member.name == "weights.safetensors":
                data = data[:-1] + bytes([data[-1] ^ 1])
            tar.addfile(member, io.BytesIO(data))
    before = snapshot(workspace)
    assert_refused(edge_sdk("unpack", corrupt, "new/deeper/bundle", cwd=workspace), "weights.safetensors")
    assert snapshot(workspace) == before  # neither new/ nor new/deeper/ is left
    (workspace / "data" / "new").mkdir()  # a directory that existed before the command stays
    before = snapshot(workspace)
    assert_refused(edge_sdk("unpack", corrupt, "data/new/bundle", cwd=workspace), "weights.safetensors")
    assert snapshot(workspace).keys() == before.keys()  # (data/new's time moved: the staging came and went)


def test_the_sweep_of_stale_staging_removes_only_names_edge_sdk_makes(workspace, archive):
    kept = [f".notes{STAGING_MARK}keep", f".notes{STAGING_MARK}12-0123abcd.bak", f"notes{STAGING_MARK}12-0123abcd"]
    for name in kept:
        (workspace / name).write_text("the user's\n")
    stale = workspace / f".old{STAGING_MARK}12-0123abcd"  # its writer is gone: no lock held
    stale.write_text("half-written\n")
    assert edge_sdk("unpack", archive, "bundle", cwd=workspace).returncode == 0
    assert all((workspace / name).read_text() == "the user's\n" for name in kept)
    assert not stale.exists()


def test_a_file_given_for_a_directory_or_a_directory_for_a_file_is_named_so(workspace, archive):
    bundle = archive.parent / "bundle"
    assert_refused(edge_sdk("unpack", "data", "out", cwd=workspace), "data: is a directory, not an archive file")
    result = edge_sdk("pack", "notes.txt", "out.tar", cwd=workspace)
    assert_refused(result, "notes.txt: is a file, not a bundle directory")
    result = edge_sdk("calibrate", "model", "--calib", "data", "-o", "predictors", cwd=workspace)
    assert_refused(result, "data: calibration file is not a regular file")
    held_out = ["--text", "data", "--tokens", "64"]
    assert_refused(edge_sdk("eval", bundle, *held_out, cwd=workspace), "data: held-out text file is not a regular file")


def test_a_runtime_library_named_on_purpose_that_does_not_load_is_refused_not_replaced(archive, tmp_path):
    broken = tmp_path / "libedge_sdk.so"
    broken.write_text("not a library\n")
    for named, found in ((broken, "file too short"), (tmp_path / "missing.so", "does not exist")):
        env = {**os.environ, "EDGE_SDK_RUNTIME_LIBRARY": str(named)}
        result = edge_sdk("run", archive.parent / "bundle", "--prompt", "x", "--backend", "cpu", env=env)
        assert_refused(result, "$EDGE_SDK_RUNTIME_LIBRARY names the C runtime to use, but", found)


def test_an_openmp_thread_count_beyond_the_bound_is_refused_naming_the_variable(archive):
    env = {**os.environ, "OMP_NUM_THREADS": "5000"}
    result = edge_sdk("run", archive.parent / "bundle", "--prompt", "x", "--backend", "cpu", env=env)
    assert_refused(result, "OpenMP allows 5000 threads ($OMP_NUM_THREADS='5000'); expected 1 to 4096")


def test_a_quantized_activation_setting_the_kernels_do_not_know_is_refused(archive):
    env = {**os.environ, "EDGE_SDK_QUANT_ACTIVATIONS": "FP32"}
    result = edge_sdk("run", archive.parent / "bundle", "--prompt", "x", "--backend", "cpu", env=env)
    assert_refused(result, "$EDGE_SDK_QUANT_ACTIVATIONS='FP32': expected fp32")


def test_force_refuses_a_bundle_whose_file_names_hold_a_directory_or_a_link(workspace, archive):
    assert edge_sdk("unpack", archive, "bundle", cwd=workspace).returncode == 0
    config = workspace / "bundle" / "tokenizer_config.json"
    config.unlink()
    config.mkdir()
    (config / "mine.txt").write_text("the user's\n")
    before = snapshot(workspace)
    result = edge_sdk("unpack", archive, "bundle", "--force", cwd=workspace)
    assert_refused(result, "bundle: holds 'tokenizer_config.json' (a directory), which is not part of the bundle")
    assert snapshot(workspace) == before
    shutil.rmtree(config)
    config.symlink_to(workspace / "notes.txt")
    before = snapshot(workspace)
    result = edge_sdk("unpack", archive, "bundle", "--force", cwd=workspace)
    assert_refused(result, "bundle: holds 'tokenizer_config.json' (a symbolic link)")
    assert snapshot(workspace) == before and config.is_symlink()


def test_a_predictors_directory_holding_a_directory_under_its_names_is_not_ours(tmp_path):
    from safetensors.numpy import save_file

    save_file({"x": np.zeros(1, np.float32)}, tmp_path / "predictors.safetensors", {"format": PREDICTORS_FORMAT})
    assert predictors_dir_is_ours(tmp_path) is None
    (tmp_path / "report.json").mkdir()
    (tmp_path / "report.json" / "mine.txt").write_text("the user's\n")
    assert predictors_dir_is_ours(tmp_path) == (
        "holds 'report.json' (a directory), which edge-sdk did not write there (1 such)"
    )


def test_a_fifo_or_device_is_refused_without_being_read(workspace, archive):
    bundle = archive.parent / "bundle"
    os.mkfifo(workspace / "fifo")
    before = snapshot(workspace)
    # each would wait forever on the FIFO if it read it (the timeout turns that into a failure)
    result = edge_sdk("pack", bundle, "fifo", "--force", cwd=workspace, timeout=120)
    assert_refused(result, "fifo: is a FIFO, not an edge-sdk bundle archive; refusing to replace it")
    e2e = ["bench", "e2e", bundle, "--tokens", "2", "--repeats", "1"]
    assert_refused(
        edge_sdk(*e2e, "--json", "fifo", cwd=workspace, timeout=120), "fifo: is a FIFO, not an edge-sdk report"
    )
    result = edge_sdk("unpack", "fifo", "out", cwd=workspace, timeout=120)
    assert_refused(result, "fifo: is not a regular file; expected a bundle archive (.tar)")
    assert_refused(edge_sdk("pack", bundle, "/dev/null", "--force", timeout=120), "/dev/null: is a device, not an")
    assert snapshot(workspace) == before


def test_an_output_path_ending_in_dotdot_is_refused(workspace, archive):
    assert edge_sdk("unpack", archive, "bundle", cwd=workspace).returncode == 0
    before = snapshot(workspace)
    for force in ([], ["--force"]):
        result = edge_sdk("unpack", archive, "bundle/missing/..", *force, cwd=workspace)
        assert_refused(result, "bundle/missing/..: ends in '..'; name the bundle itself")
    assert snapshot(workspace) == before


def test_sigterm_removes_the_staging_and_the_directories_made_for_it(workspace):
    before = snapshot(workspace)
    writer = export_writing(workspace, "new/deeper/bundle", stderr=subprocess.PIPE)
    writer.send_signal(signal.SIGTERM)
    _, stderr = writer.communicate(timeout=300)
    assert writer.returncode == 128 + signal.SIGTERM, stderr
    assert stderr.splitlines()[-1] == "edge-sdk: stopped by SIGTERM; nothing was written" and "Traceback" not in stderr
    assert snapshot(workspace) == before  # no staging, and neither new/ nor new/deeper/


def test_a_signal_that_a_library_turned_into_its_own_error_still_stops_the_command(capsys):
    """A library that calls back into Python can catch the Terminated that SIGTERM's handler raises there and raise an
    error of its own (safetensors reading a tensor raised a ValueError, and the command died with its traceback): the
    command still ends as stopped by SIGTERM, and after Ctrl-C as interrupted. Without a signal the same error is a
    bug of ours and keeps its traceback."""
    group = cli.EdgeSdkGroup()

    @group.command()
    @click.argument("name")
    def read(name: str) -> None:
        try:
            os.kill(os.getpid(), signal.Signals[name])
            time.sleep(10)  # the handler runs here
        except KeyboardInterrupt:  # Terminated too
            raise ValueError("could not determine the shape of object type 'torch.storage.UntypedStorage'") from None

    @group.command()
    def fail() -> None:
        raise ValueError("a bug")

    with pytest.raises(SystemExit) as exited:
        group.main(["read", "SIGTERM"], prog_name="edge-sdk")
    assert exited.value.code == 128 + signal.SIGTERM
    assert capsys.readouterr().err == "edge-sdk: stopped by SIGTERM; nothing was written\n"
    with pytest.raises(SystemExit) as exited:  # Ctrl-C, caught as KeyboardInterrupt by the library
        group.main(["read", "SIGINT"], prog_name="edge-sdk")
    assert exited.value.code == 130
    assert capsys.readouterr().err.splitlines()[-1] == "edge-sdk: interrupted; nothing was written"
    with pytest.raises(ValueError, match="a bug"):  # the signal of the run before is forgotten
        group.main(["fail"], prog_name="edge-sdk")


def test_ctrl_c_while_the_command_imports_is_one_line_and_130(tmp_path):
    """Ctrl-C in the first tenths of a second, while Python imports the CLI, printed a KeyboardInterrupt traceback.
    The interrupt is raised here where the command's script imports click (a sitecustomize module's import hook),
    through the installed `edge-sdk` script as a user runs it."""
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class CtrlC:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'click':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, CtrlC())\n"
    )
    script = Path(sys.executable).parent / "edge-sdk"
    result = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, env=os.environ | {"PYTHONPATH": str(tmp_path)}
    )
    assert (result.returncode, result.stdout) == (130, "")
    assert result.stderr == "edge-sdk: interrupted; nothing was written\n"


def test_reports_of_one_command_are_published_all_or_none(tmp_path):
    def full_disk(path: Path) -> None:
        path.write_bytes(b"\x89PNG")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    reports = [(tmp_path / "eval.json", lambda path: path.write_text('{"edge_sdk": "0"}\n')), (None, full_disk)]
    write_reports(reports)  # None: not asked for
    assert [path.name for path in tmp_path.iterdir()] == ["eval.json"]
    reports = [(tmp_path / "again.json", reports[0][1]), (tmp_path / "eval.png", full_disk)]
    with pytest.raises(OutputError) as failed:
        write_reports(reports)
    assert (
        str(failed.value)
        == f"{tmp_path / 'eval.png'}: cannot write the report (No space left on device); nothing was left behind"
    )
    assert [path.name for path in tmp_path.iterdir()] == ["eval.json"]


def test_full_and_read_only_file_systems_name_the_output_and_keep_what_was_there(workspace, archive, tmp_path):
    if not mounts_available(tmp_path):
        pytest.skip("needs unshare and mount (root with CAP_SYS_ADMIN) to make a small tmpfs and a read-only mount")
    command = f"cd {workspace} && {sys.executable} -m edge_sdk"
    bundle, held_out = (
        archive.parent / "bundle",
        Path(__file__).parents[1] / "fixtures" / "tiny-relu-llama" / "held_out.txt",
    )

    def one_error(result: subprocess.CompletedProcess) -> str:
        assert "rc=2" in result.stdout.split(), result.stdout + result.stderr
        errors = [line for line in result.stderr.splitlines() if line.startswith("edge-sdk: error:")]
        assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
        return errors[0]

    read_only = tmp_path / "read-only"
    assert edge_sdk("unpack", archive, read_only / "bundle").returncode == 0
    before = snapshot(read_only)
    error = one_error(
        in_mount_namespace(
            f"mount --bind -o ro {read_only} {read_only} && {command} unpack {archive} {read_only}/bundle --force; "
            f"echo rc=$?"
        )
    )
    assert error.endswith(
        f"{read_only}/bundle: {read_only} is on a read-only file system, so the bundle cannot be created there"
    )
    mounted = tmp_path / "mounted"
    mounted.mkdir()
    error = one_error(
        in_mount_namespace(
            f"mount -t tmpfs -o size=16m tmpfs {mounted} && cp {bundle}/* {mounted} && "
            f"{command} unpack {archive} {mounted} --force; echo rc=$?"
        )
    )
    assert error.endswith(
        f"{mounted}: is a mount point; edge-sdk replaces its bundle by a rename, which cannot move it"
    )
    full = tmp_path / "full"
    full.mkdir()
    fill = f"mount -t tmpfs -o size=64k tmpfs {full} && (dd if=/dev/zero of={full}/fill bs=4k 2>/dev/null; true)"
    result = in_mount_namespace(f"{fill} && {command} pack {bundle} {full}/out.tar; echo rc=$?; ls -A {full}")
    error = one_error(result)
    assert result.stdout.split() == ["rc=2", "fill"]  # no staging left in the full file system
    assert error.endswith(
        f"{full}/out.tar: cannot write the bundle archive (No space left on device); nothing was left behind"
    )
    evaluate = f"eval {bundle} --text {held_out} --tokens 64 --prompt-tokens 8 --threads 1 --no-layer-stats"
    result = in_mount_namespace(f"{fill} && {command} {evaluate} --json eval.json --plot {full}/eval.png; echo rc=$?")
    assert one_error(result).endswith(
        f"{full}/eval.png: cannot write the report (No space left on device); nothing was left behind"
    )
    assert not (workspace / "eval.json").exists()  # the JSON, which fitted, is not published without the plot
    assert snapshot(read_only) == before and staging_left(workspace) == []


def test_a_name_too_long_for_the_hidden_staging_name_is_refused_before_any_work(workspace, archive):
    before = snapshot(workspace)
    result = edge_sdk("unpack", archive, "b" * 250, cwd=workspace)
    assert_refused(result, "bytes too long for edge-sdk, which writes the bundle beside it under a longer hidden name")
    assert STAGING_MARK not in result.stderr and snapshot(workspace) == before


def replace_bundle_while(bundle: Path, during) -> None:
    """Replace bundle by a copy of itself as export --force does, calling during() while the new one is staged."""
    target = check_target(bundle, BUNDLE, replace=True)
    with staged_output(target) as staging:
        shutil.copytree(bundle, staging, dirs_exist_ok=True)
        during()


def test_force_keeps_an_earlier_output_the_user_added_files_to_while_the_command_ran(workspace, archive):
    """--force checked the old bundle before the work only, then removed it whole: a user's notes put into it during
    an hour-long export went with it."""
    bundle = workspace / "bundle"
    shutil.copytree(archive.parent / "bundle", bundle)

    def users_notes() -> None:
        (bundle / "notes").mkdir()
        (bundle / "notes" / "results.txt").write_text("my results\n")

    with pytest.raises(OutputError) as changed:
        replace_bundle_while(bundle, users_notes)
    assert str(changed.value) == (
        f"{bundle}: changed while this command ran: it now holds 'notes', which is not part of the "
        f"bundle (1 such); this bundle was discarded and the earlier one left as it is"
    )
    assert (bundle / "notes" / "results.txt").read_text() == "my results\n"
    assert staging_left(workspace) == []


def test_a_file_reaching_the_replaced_output_during_the_exchange_undoes_it(workspace, archive, monkeypatch):
    bundle = workspace / "bundle"
    shutil.copytree(archive.parent / "bundle", bundle)
    old_manifest = (bundle / "manifest.json").read_bytes()
    exchange = outputs._renameat2

    def exchange_then_users_file(source: Path, destination: Path, flags: int) -> bool:
        done = exchange(source, destination, flags)
        if flags == outputs._RENAME_EXCHANGE:  # source now holds the old bundle
            (source / "late.txt").write_text("mine\n")
        return done

    monkeypatch.setattr(outputs, "_renameat2", exchange_then_users_file)
    with pytest.raises(OutputError, match=r"changed while this command ran: it now holds 'late\.txt'"):
        replace_bundle_while(bundle, lambda: None)
    assert (bundle / "late.txt").read_text() == "mine\n"
    assert (bundle / "manifest.json").read_bytes() == old_manifest
    assert bundle_is_ours(bundle) is not None and staging_left(workspace) == []


def test_nothing_is_written_into_another_bundle_or_predictors_directory(workspace, archive, torch_that_fails):
    """A bundle's report.png carries edge-sdk's PNG mark, so `eval --plot OTHER/report.png` replaced it as an earlier
    report and broke that bundle's checksums; any output inside an edge-sdk bundle or predictors directory is
    refused, before torch is imported."""
    other = workspace / "other"
    shutil.copytree(archive.parent / "bundle", other)
    (other / "report.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 8)
    before = snapshot(workspace)
    held_out = Path(__file__).parents[1] / "fixtures" / "tiny-relu-llama" / "held_out.txt"
    evaluate = ["eval", archive.parent / "bundle", "--text", held_out, "--tokens", "64", "--no-layer-stats"]
    result = edge_sdk(*evaluate, "--plot", other / "report.png", cwd=workspace, env=torch_that_fails)
    assert_refused(result, f"{other / 'report.png'}: is inside the edge-sdk bundle {other}, which holds only its own")
    predictors = workspace / "predictors"
    predictors.mkdir()
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    safetensors_numpy.save_file(
        {"x": np.zeros(1, np.float32)}, predictors / "predictors.safetensors", metadata={"format": PREDICTORS_FORMAT}
    )
    with pytest.raises(OutputError, match="is inside the edge-sdk predictors directory"):
        check_report(predictors / "report.json")
    with pytest.raises(OutputError, match=f"is inside the edge-sdk bundle {other}"):
        check_target(other / "deeper" / "bundle", BUNDLE, replace=False)
    assert snapshot(workspace).keys() == before.keys() | {"predictors", "predictors/predictors.safetensors"}


def test_a_json_file_is_an_edge_sdk_report_only_with_all_its_marks(tmp_path):
    users = tmp_path / "user.json"
    users.write_text('{"edge_sdk": {"theme": "dark"}, "important": "user config"}\n')
    assert report_is_ours(users) == "is not a report edge-sdk wrote"
    users.write_text('{"edge_sdk": "0.1.0", "important": "user config"}\n')
    assert report_is_ours(users) == "is not a report edge-sdk wrote"
    ours = tmp_path / "ours.json"
    ours.write_text(report_json(with_machine_info({"benchmark": "e2e"})))
    assert report_is_ours(ours) is None


def test_a_report_holding_nan_is_refused_naming_the_field():
    with pytest.raises(OutputError) as refused:
        report_json({"kinds": {"svd": {"points": [{"speedup": 1.5}, {"speedup": float("nan")}]}}})
    assert (
        str(refused.value)
        == "the report's kinds.svd.points.1.speedup (nan) is not a finite number; nothing was written"
    )


def test_an_empty_output_path_is_refused_as_empty_not_as_the_current_directory(workspace, archive):
    held_out = Path(__file__).parents[1] / "fixtures" / "tiny-relu-llama" / "held_out.txt"
    evaluate = ["eval", archive.parent / "bundle", "--text", held_out, "--tokens", "64", "--no-layer-stats"]
    assert_refused(
        edge_sdk(*evaluate, "--json", "", cwd=workspace), "the report's path is empty; name where to write it"
    )
    assert_refused(edge_sdk("export", "model", "-o", "", cwd=workspace), "the bundle's path is empty")


def test_a_failed_output_below_a_dotdot_removes_every_directory_made_for_it(tmp_path):
    target = check_target(tmp_path / "new" / ".." / "other" / "report.json", REPORT, replace=False)
    with pytest.raises(OSError), staged_output(target):
        raise OSError(errno.EIO, "input/output error")
    assert list(tmp_path.iterdir()) == []


def test_without_force_the_hint_to_use_it_comes_only_where_force_would_replace(tmp_path):
    """`export -o DIR` into the user's own directory said "already exists (use --force to replace an earlier edge-sdk
    bundle)", and with --force it was refused again: the hint is given only for an output edge-sdk wrote."""
    users = tmp_path / "mine"
    users.mkdir()
    (users / "notes.txt").write_text("kept\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    for directory in (users, empty):
        with pytest.raises(OutputError) as refused:
            check_target(directory, BUNDLE, replace=False)
        assert str(refused.value) == (
            f"{directory}: already exists, and --force would not replace it: has no edge-sdk manifest.json, so it is "
            "not an edge-sdk bundle; --force replaces only an edge-sdk bundle"
        )
    with pytest.raises(OutputError, match=r"already exists, and --force would not replace it: is a file, not an"):
        check_target(users / "notes.txt", BUNDLE, replace=False)


def test_a_report_location_holding_a_users_file_is_refused_without_mentioning_force(tmp_path):
    """`eval --json notes.txt` said "--force replaces only an edge-sdk report": eval has no --force, and a report
    option replaces an earlier edge-sdk report without one."""
    users = tmp_path / "notes.txt"
    users.write_text("my own notes\n")
    with pytest.raises(OutputError) as refused:
        check_report(users)
    assert str(refused.value) == (f"{users}: is not a report edge-sdk wrote; write the report elsewhere")


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (["info", ""], "MODEL_DIR"),
        (["verify", ""], "BUNDLE_DIR"),
        (["run", "", "--prompt", "x"], "BUNDLE_DIR"),
        (["pack", "", "out.tar"], "BUNDLE_DIR"),
        (["unpack", "", "out"], "ARCHIVE"),
    ],
)
def test_an_empty_input_path_is_refused_not_read_as_the_current_directory(tmp_path, args, name):
    """`info ""` read the model in the current directory (Path("") is "."), or said "config.json is missing"."""
    shutil.copytree(TINY_MODEL, tmp_path / "model")  # a model in the current directory, for "" to find
    result = edge_sdk(*args, cwd=tmp_path / "model")
    assert_refused(result, f"Invalid value for '{name}': expected a path, found an empty string")
