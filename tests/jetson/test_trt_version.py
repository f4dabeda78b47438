"""The TensorRT version of the engine cache key (jetson/src/trt_version.h): MAJOR.MINOR.PATCH of getInferLibVersion(),
never the build number, for what JetPack ships. The key is computed only there (edge_tensorrt_engine_info), for the
engine `edge-sdk build` writes and the one the C engine reads; compiled with g++ against the header alone.
"""

from __future__ import annotations

from .support import JETSON, run
from .test_trt_engine_build import require_compiler

# (JetPack, getInferLibVersion() of its libnvinfer, the key's version; python3-libnvinfer reports 10.3.0.30 on 6.1/6.2)
JETPACK_TENSORRT = [("6.1", 100300, "10.3.0"), ("6.2", 100300, "10.3.0"), ("7.0", 101303, "10.13.3")]

PROGRAM = """
#include <cstdio>
#include <cstdlib>
#include "trt_version.h"
int main(int argc, char **argv) {
  for (int i = 1; i < argc; ++i) std::printf("%s\\n", tensorrt_version(std::atoi(argv[i])).c_str());
  return 0;
}
"""


def test_key_version_is_major_minor_patch(tmp_path):
    compiler = require_compiler()
    source = tmp_path / "trt_version_check.cpp"
    source.write_text(PROGRAM)
    binary = tmp_path / "trt_version_check"
    built = run([compiler, "-std=c++17", "-Wall", "-Wextra", "-I", JETSON / "src", source, "-o", binary], timeout=120)
    assert built.returncode == 0 and "warning" not in built.stderr, built.stderr
    result = run([binary, *(str(library) for _, library, _ in JETPACK_TENSORRT)], timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [key for _, _, key in JETPACK_TENSORRT]
