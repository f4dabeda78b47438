"""What benchmark result files record about the code they measured: the commit, marked when the tree differs."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from edge_sdk.bench import record
from edge_sdk.bench.record import COMMIT_ENV, machine_description, with_machine_info
from edge_sdk.cli import _write_json
from edge_sdk.errors import EdgeSdkError
from edge_sdk.native import load_cpu_kernels


def git(repo, *args: str) -> str:
    command = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t.invalid", *args]
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path, monkeypatch):
    git(tmp_path, "init", "-q")
    (tmp_path / "kernel.c").write_text("int x;\n")
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "ffn.json").write_text("{}\n")
    git(tmp_path, "add", "kernel.c", "benchmarks")
    git(tmp_path, "commit", "-q", "-m", "first")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(record, "SOURCE_ROOT", tmp_path)  # as if edge-sdk ran from this checkout
    monkeypatch.delenv(COMMIT_ENV, raising=False)
    return tmp_path


def test_clean_tree_records_the_commit(repo):
    record = with_machine_info({"rows": []})
    assert record["commit"] == git(repo, "rev-parse", "--short", "HEAD")
    assert record["rows"] == [] and record["machine"]["cores"] >= 1


def test_changed_tracked_file_marks_the_commit_dirty(repo):
    (repo / "notes.txt").write_text("untracked files do not count\n")
    (repo / "benchmarks" / "results" / "ffn.json").write_text('{"rows": []}\n')  # nor rewritten results
    assert not with_machine_info({})["commit"].endswith("-dirty")
    (repo / "kernel.c").write_text("int x = 1;\n")
    assert with_machine_info({})["commit"] == git(repo, "rev-parse", "--short", "HEAD") + "-dirty"


def test_a_copied_tree_records_the_commit_it_is_told(repo, monkeypatch):
    """scripts/gpu_check.sh on a lent machine: the tree's .git is another commit's, so the script names the commit."""
    (repo / "kernel.c").write_text("int x = 1;\n")
    monkeypatch.setenv(COMMIT_ENV, "4f55246")
    assert with_machine_info({})["commit"] == "4f55246"


def test_cli_json_records_the_commit_before_it_overwrites_a_tracked_file(repo):
    earlier = '{"edge_sdk": "0.1.0", "machine": {"cpu": "x"}, "date": "2026-11-27", "speedup": 1.2}\n'
    (repo / "e2e.json").write_text(earlier)  # an earlier edge-sdk result
    git(repo, "add", "e2e.json")
    git(repo, "commit", "-q", "-m", "result")
    _write_json(str(repo / "e2e.json"), {"speedup": 1.5})
    assert json.loads((repo / "e2e.json").read_text())["commit"] == git(repo, "rev-parse", "--short", "HEAD")


def test_cli_json_never_overwrites_a_file_edge_sdk_did_not_write(repo):
    (repo / "notes.json").write_text('{"mine": true}\n')
    with pytest.raises(EdgeSdkError, match=r"notes\.json: is not a report edge-sdk wrote"):
        _write_json(str(repo / "notes.json"), {"speedup": 1.5})
    assert (repo / "notes.json").read_text() == '{"mine": true}\n'


def test_outside_a_repository_the_commit_is_unknown(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(record, "SOURCE_ROOT", tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert with_machine_info({})["commit"] is None


def test_the_users_repository_is_not_the_commit_measured(repo, tmp_path_factory, monkeypatch):
    """`edge-sdk sweep` run from the user's own project recorded that project's HEAD as the commit it measured; an
    installed package (a virtual environment inside that project included) is no edge-sdk checkout: unknown."""
    installed = repo / ".venv" / "lib" / "site-packages"  # inside the user's repository, but not its root
    installed.mkdir(parents=True)
    monkeypatch.setattr(record, "SOURCE_ROOT", installed)
    assert with_machine_info({})["commit"] is None
    elsewhere = tmp_path_factory.mktemp("site-packages")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(elsewhere.parent))
    monkeypatch.setattr(record, "SOURCE_ROOT", elsewhere)
    assert with_machine_info({})["commit"] is None  # while the current directory is the user's repository


RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
GPU_CHECK_FILES = "gpu-check-*"  # recorded on a GPU by scripts/gpu_check.sh, not by benchmarks/record_results.py
COMMITTED_RESULTS = sorted(
    path
    for path in RESULTS.glob("*.json")
    if path.name != "recording.json"  # the recordings' index, checked below
)


def test_the_machine_names_the_instruction_set_the_kernels_ran():
    """A result says which build of the kernels produced it (a package's library holds several)."""
    isa = load_cpu_kernels().edge_cpu_isa().decode()
    assert isa in load_cpu_kernels().edge_cpu_isas().decode().split()
    assert machine_description()["cpu_kernels_isa"] == isa


@pytest.mark.parametrize("path", COMMITTED_RESULTS, ids=[path.name for path in COMMITTED_RESULTS])
def test_every_committed_result_names_its_commit_date_and_machine(path):
    record = json.loads(path.read_text())
    assert re.fullmatch(r"[0-9a-f]{7,40}(-dirty)?", record["commit"]), record["commit"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", record["date"]), record["date"]
    assert record["machine"]["cpu"] and record["machine"]["cores"] >= 1


def test_the_cpu_results_come_from_one_recording_at_one_commit():
    """benchmarks/record_results.py re-records every CPU result at one commit: results/recording.json names each
    recording's files, and every committed file (the GPU check's aside) is one of them, measured at that commit."""
    recordings = json.loads((RESULTS / "recording.json").read_text())["recordings"]
    commits = {recording["commit"] for recording in recordings.values()}
    assert len(commits) == 1 and not next(iter(commits)).endswith("-dirty"), commits
    listed = {RESULTS.parent.parent / name for recording in recordings.values() for name in recording["files"]}
    committed = {path for path in RESULTS.rglob("*") if path.is_file() and path.name != "recording.json"}
    committed -= set(RESULTS.glob(GPU_CHECK_FILES)) | set((RESULTS / "gpu-check-logs").rglob("*"))
    assert committed == listed, (sorted(committed - listed), sorted(listed - committed))
    for path in sorted(listed):
        if path.suffix == ".json" and path.name != "report.json":
            assert json.loads(path.read_text())["commit"] == next(iter(commits)), path
