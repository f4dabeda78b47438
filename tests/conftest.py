"""Shared fixtures: the committed tiny model and small random Hugging Face checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
TINY_MODEL = FIXTURES / "tiny-relu-llama"


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The committed tiny ReLU Llama (tests/fixtures/tiny-relu-llama, trained by its script)."""
    return TINY_MODEL
