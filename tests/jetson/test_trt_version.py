"""The TensorRT version of the engine cache key: one rule on both sides (MAJOR.MINOR.PATCH of the library).

The C runtime keys engines on getInferLibVersion() (jetson/src/trt_version.h), the Python builder on
trt.__version__ (backends/tensorrt/cache.py); both must give the same string for what JetPack ships, or the C runtime
never finds an engine `edge-sdk build` made. The C++ side is compiled with g++ against the header alone.
"""

from __future__ import annotations

import pytest
from edge_sdk.backends.tensorrt.cache import EngineCacheError, tensorrt_version_key

from .support import JETSON, run
from .test_trt_engine_build import require_compiler

# (JetPack, trt.__version__ of its python3-libnvinfer, getInferLibVersion() of its libnvinfer, the key's version)
JETPACK_TENSORRT = [
    ("6.1", "10.3.0.30", 100300, "10.3.0"),
    ("6.2", "10.3.0.30", 100300, "10.3.0"),
    ("7.0", "10.13.3.9", 101303, "10.13.3"),
]

PROGRAM = """
#include <cstdio>
#include <cstdlib>
#include "trt_version.h"
int main(int argc, char **argv) {
  for (int i = 1; i < argc; ++i) std::printf("%s\\n", tensorrt_version(std::atoi(argv[i])).c_str());
  return 0;
}
"""


@pytest.mark.parametrize(("jetpack", "python_version", "library_version", "key"), JETPACK_TENSORRT)
def test_python_key_drops_the_build_number(jetpack, python_version, library_version, key):
    assert tensorrt_version_key(python_version) == key
    assert tensorrt_version_key(key) == key


@pytest.mark.parametrize("version", ["10.3", "10", "ten.3.0", "10.3.x.30", ""])
def test_python_key_refuses_a_version_without_three_numbers(version):
    with pytest.raises(EngineCacheError, match=r"expected MAJOR\.MINOR\.PATCH\[\.BUILD\], found"):
        tensorrt_version_key(version)


def test_c_key_matches_the_python_key(tmp_path):
    compiler = require_compiler()
    source = tmp_path / "trt_version_check.cpp"
    source.write_text(PROGRAM)
    binary = tmp_path / "trt_version_check"
    built = run([compiler, "-std=c++17", "-Wall", "-Wextra", "-I", JETSON / "src", source, "-o", binary], timeout=120)
    assert built.returncode == 0 and "warning" not in built.stderr, built.stderr
    result = run([binary, *(str(library) for _, _, library, _ in JETPACK_TENSORRT)], timeout=30)
    assert result.returncode == 0, result.stderr
    c_keys = result.stdout.split()
    python_keys = [tensorrt_version_key(python_version) for _, python_version, _, _ in JETPACK_TENSORRT]
    assert c_keys == python_keys == [key for _, _, _, key in JETPACK_TENSORRT]
