"""libedge_trt_plugins.so driven through TensorRT's plugin interfaces on the host: no GPU and no libnvinfer needed.

The plugin sources (plugins/tensorrt/*.cpp) are compiled against the TensorRT headers found here ($TENSORRT_INCLUDE_DIR,
$TENSORRT_ROOT/include or the system's) with every warning an error and linked, as the package build links them, to
the CUDA kernel library; plugin_host_check.cpp then drives that library, or the package's own build of it when
TensorRT was found at build time. The plugins call no libnvinfer function, so the headers are all they need (use
TensorRT 10.3's, JetPack 6.1/6.2's, to check the oldest TensorRT the plugins support). Skips when no headers, no
compiler or no CUDA kernel library (nvcc at build time) are found.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import onnx
import pytest
from edge_sdk.backends.tensorrt.profiles import ENGINE_GRAPH
from onnx import helper

from edge_sdk.bundle.graph_ops import DOMAIN
from edge_sdk.native import find_library

from .fake_engine import DATA_TYPES

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_SOURCES = ROOT / "plugins" / "tensorrt"
HEADER_DIRS = ("/usr/include/aarch64-linux-gnu", "/usr/include/x86_64-linux-gnu", "/usr/include")
CUDA_HEADER_DIRS = ("/usr/local/cuda/include",)
# The plugin library's only exports (edge_trt_plugins.map).
EXPORTS = {"getCreators", "setLoggerFinder"}
WARNINGS = ("-Wall", "-Wextra", "-Wpedantic", "-Werror")


def first_dir_with(header: str, candidates: list[str]) -> Path | None:
    return next((Path(c) for c in candidates if c and (Path(c) / header).is_file()), None)


def tensorrt_headers() -> Path | None:
    candidates = [os.environ.get("TENSORRT_INCLUDE_DIR", "")]
    if os.environ.get("TENSORRT_ROOT"):
        candidates.append(str(Path(os.environ["TENSORRT_ROOT"]) / "include"))
    return first_dir_with("NvInferRuntime.h", [*candidates, *HEADER_DIRS])


def cuda_headers() -> Path | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or ""
    return first_dir_with("cuda_runtime_api.h", [str(Path(home) / "include") if home else "", *CUDA_HEADER_DIRS])


def cuda_runtime_dir(cuda_include: Path) -> Path | None:
    return next((d for d in (cuda_include.parent / "lib64", cuda_include.parent / "lib") if d.is_dir()), None)


def compiler() -> str | None:
    return shutil.which("c++") or shutil.which("g++")


@pytest.fixture(scope="module")
def headers_and_kernels():
    """(TensorRT include dir, CUDA include dir, libedge_cuda_kernels.so, C++ compiler), or a skip naming what is
    missing."""
    trt_include, cuda_include = tensorrt_headers(), cuda_headers()
    kernels = find_library("libedge_cuda_kernels.so", "EDGE_SDK_CUDA_KERNELS")
    cxx = compiler()
    if trt_include is None or cuda_include is None or cxx is None:
        pytest.skip("TensorRT headers, CUDA headers or a C++ compiler not found (set TENSORRT_INCLUDE_DIR)")
    if kernels is None:
        pytest.skip("libedge_cuda_kernels.so was not built (no nvcc when the package was built)")
    return trt_include, cuda_include, kernels, cxx


@pytest.fixture(scope="module")
def plugins_built_from_sources(headers_and_kernels, tmp_path_factory) -> Path:
    """The plugin library compiled here from plugins/tensorrt with WARNINGS, linked with no undefined symbol."""
    trt_include, cuda_include, kernels, cxx = headers_and_kernels
    runtime_dir = cuda_runtime_dir(cuda_include)
    if runtime_dir is None:
        pytest.skip(f"no CUDA runtime library directory next to {cuda_include}")
    output = tmp_path_factory.mktemp("trt-plugins")
    includes = ["-isystem", str(trt_include), "-isystem", str(cuda_include)]
    includes += [f"-I{ROOT / 'plugins' / 'kernels'}", f"-I{ROOT / 'kernels' / 'cpu'}"]
    objects = []
    for source in sorted(PLUGIN_SOURCES.glob("*.cpp")):
        target = output / f"{source.stem}.o"
        command = [cxx, "-std=c++17", "-fPIC", "-fvisibility=hidden", *WARNINGS, *includes, "-c", str(source)]
        result = subprocess.run([*command, "-o", str(target)], capture_output=True, text=True)
        assert result.returncode == 0, f"{source.name} does not compile warning-free:\n{result.stderr}"
        objects.append(str(target))
    library = output / "libedge_trt_plugins.so"
    version_script = PLUGIN_SOURCES / "edge_trt_plugins.map"
    link = [cxx, "-shared", "-o", str(library), *objects, f"-Wl,--version-script={version_script}"]
    link += ["-Wl,--no-undefined", str(kernels), f"-L{runtime_dir}", "-lcudart"]
    result = subprocess.run(link, capture_output=True, text=True)
    assert result.returncode == 0, f"the plugin library does not link:\n{result.stderr}"
    return library


def test_plugin_sources_compile_warning_free_and_export_only_the_entry_points(plugins_built_from_sources):
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) is not installed")
    listing = subprocess.run(
        ["nm", "-D", "--defined-only", str(plugins_built_from_sources)], check=True, capture_output=True, text=True
    ).stdout
    assert {line.split()[-1] for line in listing.splitlines() if line.strip()} == EXPORTS


@pytest.fixture(scope="module")
def host_check(headers_and_kernels, tmp_path_factory) -> Path:
    """plugin_host_check.cpp compiled against the TensorRT headers."""
    trt_include, cuda_include, _, cxx = headers_and_kernels
    program = tmp_path_factory.mktemp("host-check") / "plugin_host_check"
    source = Path(__file__).with_name("plugin_host_check.cpp")
    includes = ["-isystem", str(trt_include), "-isystem", str(cuda_include)]
    # -rdynamic: the program's edge_sparse_ffn_q (the recorder of enqueue's arguments) takes the plugins' calls
    command = [cxx, "-std=c++17", *WARNINGS, *includes, str(source), "-rdynamic", "-ldl", "-o", str(program)]
    subprocess.run(command, check=True)
    return program


@pytest.mark.parametrize("build", ["package", "sources"])
def test_plugins_through_tensorrt_interfaces(build, headers_and_kernels, host_check, request):
    kernels = headers_and_kernels[2]
    if build == "package":
        plugins = find_library("libedge_trt_plugins.so", "EDGE_SDK_TRT_PLUGINS")
        if plugins is None:
            pytest.skip("libedge_trt_plugins.so was not built (TensorRT was not found when the package was built)")
    else:
        plugins = request.getfixturevalue("plugins_built_from_sources")
    result = subprocess.run([str(host_check), str(plugins), str(kernels)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "all checks passed"


def plugin_nodes(graph: onnx.ModelProto) -> list[str]:
    """The custom nodes of `graph` in plugin_host_check.cpp's nodes format: attributes as stored, each input's and
    output's TensorRT type and dims (-1 where only runtime knows one) from ONNX shape inference, which sees through
    the ops' reference functions."""
    inferred = onnx.shape_inference.infer_shapes(graph)
    tensors = {tensor.name: (tensor.data_type, list(tensor.dims)) for tensor in inferred.graph.initializer}
    for value in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        shape = value.type.tensor_type.shape.dim
        tensors[value.name] = (
            value.type.tensor_type.elem_type,
            [dim.dim_value if dim.HasField("dim_value") else -1 for dim in shape],
        )
    lines = []
    for node in graph.graph.node:
        if node.domain != DOMAIN:
            continue
        lines.append(f"node {node.name} {node.op_type}")
        for attribute in node.attribute:
            value = helper.get_attribute_value(attribute)
            if attribute.type == onnx.AttributeProto.INT:
                lines.append(f"attribute {attribute.name} int {value}")
            elif attribute.type == onnx.AttributeProto.FLOAT:
                lines.append(f"attribute {attribute.name} float {float(value).hex()}")
            else:
                lines.append(f"attribute {attribute.name} string {value.decode()}")
        for role, names in (("input", node.input), ("output", node.output)):
            for name in names:
                elem_type, dims = tensors[name]
                lines.append(f"{role} {DATA_TYPES[elem_type]} {len(dims)} {' '.join(map(str, dims))}".rstrip())
    return lines


# every plugin and both SparseFFN input counts: SVD and sign-bit predictors, CHESS thresholds, and the quantized ops,
# symmetric and asymmetric int4 (12 QuantizedSparseFFN inputs; tied: the head reads the embedding's minimums; with an
# int8 head among int4_asymmetric nodes), and int4 bundles with int8 down rows (down_weight_format "int8": 8 or 9
# inputs, 11 when asymmetric; the prompt's down products int8 QuantizedMatMul nodes)
GRAPH_BUNDLES = (
    "svd-fp16",
    "signbit-fp32",
    "threshold-fp32",
    "svd-int8",
    "svd-int4",
    "svd-int4-asym",
    "tied-svd-int4-asym",
    "tied-svd-int4-asym-head-int8",
    "svd-int4-down-int8",
    "tied-svd-int4-asym-head-int8-down-int8",
)


@pytest.mark.parametrize("name", GRAPH_BUNDLES)
def test_every_plugin_node_of_an_exported_graph_makes_its_plugin(
    name, bundle_matrix, headers_and_kernels, host_check, plugins_built_from_sources, tmp_path
):
    """The graph the engine is built from (decode.onnx) and the plugins agree: each custom node's attributes are the
    creator's field names and, passed as TensorRT's ONNX parser passes them, make a plugin; that plugin takes the
    node's input types and shapes and gives the output type the graph declares."""
    bundle = bundle_matrix[name]
    graph = onnx.load(str(bundle.graph_path(ENGINE_GRAPH)), load_external_data=False)
    lines = plugin_nodes(graph)
    ops = {line.split()[2] for line in lines if line.startswith("node ")}
    predictor = bundle.sparsity.predictor
    expected = {"svd": {"SvdPredictor"}, "signbit": {"SignBitPredictor"}, "threshold": set()}[predictor]
    if bundle.manifest.dtype in ("int8", "int4"):
        # every product with a quantized matrix is a plugin; the graph holds no SparseFFN over dequantized rows
        assert {"QuantizedSparseFFN", "QuantizedMatMul"} <= ops and "SparseFFN" not in ops
        matmuls = [line for line in lines if line.startswith("attribute transposed")]
        assert {line.split()[-1] for line in matmuls} == {"0", "1"}  # projections and the prompt's down rows
        formats = {line.split()[-1] for line in lines if line.startswith("attribute weight_format")}
        # every int4 matrix with its minimums if asymmetric; an int8 head or int8 down rows have none
        wider = {"int8"} if "-head-int8" in name or name.endswith("-down-int8") else set()
        assert formats == {"int4_asymmetric" if bundle.manifest.asymmetric else bundle.manifest.dtype} | wider
        down_formats = [line.split()[-1] for line in lines if line.startswith("attribute down_weight_format")]
        ffn_nodes = [line for line in lines if line.startswith("node ") and line.endswith(" QuantizedSparseFFN")]
        assert down_formats == (["int8"] * len(ffn_nodes) if name.endswith("-down-int8") else [])
    else:
        expected |= {"SparseFFN"}
    assert expected <= ops
    nodes = tmp_path / "nodes.txt"
    nodes.write_text("\n".join(lines) + "\n")
    kernels = headers_and_kernels[2]
    result = subprocess.run(
        [str(host_check), str(plugins_built_from_sources), str(kernels), str(nodes)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == "all checks passed"
