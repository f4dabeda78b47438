"""Where built engines live: one directory per (TensorRT version, GPU, bundle), named by the hash of that key.

    <cache>/<key digest>/model.engine, engine.json

model.engine is the one engine of the bundle (prefill and decode are its two optimization profiles, profiles.py).

engine.json records the key in words, so an engine that does not load (copied from another machine, or left
by another TensorRT) is reported with what built it and how to rebuild it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from edge_sdk.errors import EdgeSdkError

# Bump when the engine's inputs, profiles or build settings change, so older cache entries are not reused.
# 2: one engine with two profiles (model.engine) instead of prefill.engine and decode.engine.
CACHE_LAYOUT_VERSION = 2
CACHE_ENV = "EDGE_SDK_ENGINE_CACHE"
METADATA_FILE = "engine.json"
ENGINE_FILE = "model.engine"
REBUILD_HINT = "rebuild it on this device with `edge-sdk build {bundle} --force`"


class EngineCacheError(EdgeSdkError):
    """A cached engine is missing, unreadable, or was built for another TensorRT, GPU or bundle."""


@dataclass(frozen=True)
class EngineKey:
    """What a TensorRT engine is only valid for."""

    tensorrt_version: str  # tensorrt_version_key(): MAJOR.MINOR.PATCH
    gpu_name: str
    compute_capability: str
    bundle_sha256: str  # the bundle manifest's manifest_sha256

    def digest(self) -> str:
        fields = asdict(self) | {"cache_layout_version": CACHE_LAYOUT_VERSION}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()

    def describe(self) -> str:
        return (
            f"TensorRT {self.tensorrt_version}, {self.gpu_name} (compute capability {self.compute_capability}), "
            f"bundle {self.bundle_sha256[:12]}"
        )


def tensorrt_version_key(version: str) -> str:
    """MAJOR.MINOR.PATCH of a TensorRT version string, the version an engine key records.

    JetPack's python3-libnvinfer reports four parts (TensorRT 10.3.0.30 on JetPack 6.1 and 6.2), while the C runtime
    reads getInferLibVersion(), which holds only major, minor and patch (jetson/src/trt_version.h): both sides key on
    those three, so an engine `edge-sdk build` cached is found by the C runtime and the other way round."""
    parts = version.split(".")
    if len(parts) < 3 or not all(part.isdigit() for part in parts[:3]):
        raise EngineCacheError(f"TensorRT version: expected MAJOR.MINOR.PATCH[.BUILD], found {version!r}")
    return ".".join(str(int(part)) for part in parts[:3])


def default_cache_dir() -> Path:
    """$EDGE_SDK_ENGINE_CACHE, else $XDG_CACHE_HOME/edge-sdk/tensorrt, else ~/.cache/edge-sdk/tensorrt."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = Path(os.environ["XDG_CACHE_HOME"]) if os.environ.get("XDG_CACHE_HOME") else Path.home() / ".cache"
    return base / "edge-sdk" / "tensorrt"


def engine_dir(cache_dir: Path, key: EngineKey) -> Path:
    return cache_dir / key.digest()[:32]


def write_metadata(directory: Path, key: EngineKey, bundle_path: Path) -> None:
    record = {"cache_layout_version": CACHE_LAYOUT_VERSION, "bundle": str(bundle_path), **asdict(key)}
    (directory / METADATA_FILE).write_text(json.dumps(record, indent=2) + "\n")


def read_metadata(directory: Path) -> dict:
    path = directory / METADATA_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise EngineCacheError(f"{path}: engine metadata unreadable ({error})") from None


def is_complete(directory: Path, key: EngineKey) -> bool:
    """True when the engine file is present and engine.json records exactly this key."""
    if not (directory / ENGINE_FILE).is_file():
        return False
    try:
        recorded = read_metadata(directory)
    except EngineCacheError:
        return False
    return all(recorded.get(field) == value for field, value in asdict(key).items())


def unloadable_engine_message(engine_path: Path, current: EngineKey, bundle_path: Path | str) -> str:
    """Why TensorRT may have refused engine_path, from its engine.json, and how to rebuild it."""
    try:
        recorded = read_metadata(engine_path.parent)
        fields = ("tensorrt_version", "gpu_name", "compute_capability", "bundle_sha256")
        built = EngineKey(*(recorded[field] for field in fields))
        origin = f"it was built for {built.describe()}" if built != current else "it was built for this setup"
    except (EngineCacheError, KeyError):
        origin = "its engine.json is missing or incomplete"
    return (
        f"{engine_path}: TensorRT could not load this engine; {origin}, and this process has {current.describe()}; "
        + REBUILD_HINT.format(bundle=bundle_path)
    )
