"""verify against bundles rewritten so that every reader computes the same wrong thing (found by a mutation test of
verify): non-finite logits, and rope tables that are not the ones the manifest's RoPE settings give. A bundle whose
files were changed and their digests re-stamped passes the integrity checks, so only these checks see it."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from edge_sdk.bundle import Bundle, manifest_digest
from edge_sdk.bundle.format import MANIFEST_DIGEST_FIELD, WEIGHTS_FILE
from edge_sdk.export.verify import VerificationError, verify_graphs

STEPS = 4


def with_tensor_changed(source: Path, directory: Path, name: str, change: Callable[[np.ndarray], None]) -> Bundle:
    """A copy of source whose weights.safetensors tensor `name` change() edited in place, the manifest re-stamped."""
    copy = directory / "bundle"
    shutil.copytree(source, copy)
    header = Bundle.open(copy).header
    entry = header.tensors[name]
    dtype = {"F32": np.float32, "F16": np.float16}[entry.dtype]
    count = (entry.end - entry.begin) // np.dtype(dtype).itemsize
    values = np.memmap(copy / WEIGHTS_FILE, dtype=dtype, mode="r+", offset=header.data_start + entry.begin, shape=count)
    change(values.reshape(entry.shape))
    values.flush()
    del values
    manifest = json.loads((copy / "manifest.json").read_text())
    data = (copy / WEIGHTS_FILE).read_bytes()
    manifest["files"][WEIGHTS_FILE] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest[MANIFEST_DIGEST_FIELD] = manifest_digest(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return Bundle.open(copy)


def test_the_unchanged_bundle_verifies(bundle_matrix):
    assert verify_graphs(bundle_matrix["svd-fp32"], decode_steps=STEPS)["max_abs_logit_diff"] < 1e-4


@pytest.mark.parametrize(
    ("tensor", "value"), [("norm.weight", np.nan), ("lm_head.weight", np.inf), ("lm_head.weight", np.nan)]
)
def test_non_finite_logits_fail_naming_where(bundle_matrix, tmp_path, tensor, value):
    # NaN - NaN compares false with the tolerance and argmax takes NaN as the largest: it passed, "max diff 0.0"
    def poison(values):
        values.flat[0] = value

    bundle = with_tensor_changed(bundle_matrix.path("svd-fp32"), tmp_path, tensor, poison)
    with pytest.raises(VerificationError, match=r"the torch reference computed \d+ non-finite logits at prefill"):
        verify_graphs(bundle, decode_steps=STEPS)


def test_rope_tables_other_than_the_manifests_fail_at_any_position(bundle_matrix, tmp_path):
    # every reader takes the stored tables, and verify's few steps never reach position 100
    def shift(values):
        values[100, 3] += 0.5

    bundle = with_tensor_changed(bundle_matrix.path("svd-fp32"), tmp_path, "rope.cos", shift)
    with pytest.raises(VerificationError, match=r"tensor 'rope.cos' differs .* at position 100, column 3"):
        verify_graphs(bundle, decode_steps=STEPS)
