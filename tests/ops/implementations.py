"""The implementations of the backend-ops table: each runs an op case on its inputs and returns what it computed.

An implementation says which cases it can run (`supports`, fixed by what the implementation is: the C kernels take
no bfloat16 weights, ONNX Runtime's SparseFFN needs a mask input...) and why it cannot run here at all
(`unavailable`: no GPU, no kernel library), which the table turns into a skip with that reason.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper

from edge_sdk.export import ops
from edge_sdk.native import NativeLibraryError, load_cpu_kernels
from edge_sdk.sparsity.ffn import sparse_ffn
from edge_sdk.sparsity.signbit import signbit_mask
from edge_sdk.sparsity.sparse_model import LayerPredictor

from .cases import (
    ACTIVATIONS,
    QUANT_FORMATS,
    MatVecCase,
    QuantizedMatMulCase,
    SignBitPredictorCase,
    SparseFFNCase,
    SvdPredictorCase,
)

_ONNX_TYPES = {
    torch.float32: TensorProto.FLOAT,
    torch.float16: TensorProto.FLOAT16,
    torch.bfloat16: TensorProto.BFLOAT16,
}
# numpy has no bfloat16: such an x is an initializer of the model instead of an input
_FED_DTYPES = (torch.float32, torch.float16)


def code_words(matrix) -> np.ndarray:
    """A QuantizedMatrix's codes as the quantized ops take them: INT32 words [rows, row bytes / 4] of the same bytes."""
    return np.ascontiguousarray(matrix.data).view(np.int32)


def asymmetric(case) -> bool:
    """Whether the case's int4 matrices have group minimums (the ops' weight_format "int4_asymmetric")."""
    return getattr(case, "asymmetric", False)


def weight_format(case) -> str:
    """The quantized ops' weight_format attribute of the case."""
    return "int4_asymmetric" if asymmetric(case) else case.weights


def int32_mask(mask: torch.Tensor) -> np.ndarray:
    """[T, D] bool -> the int32 mask of the op schema, active neurons alternating 1 and -7 (any nonzero is active)."""
    values = np.where(np.arange(mask.shape[-1]) % 2 == 0, 1, -7).astype(np.int32)
    return np.where(mask.numpy(), values, 0).astype(np.int32)


class TorchReference:
    """edge_sdk.sparsity itself, checked against the op's definition written out in float64 (test_backend_ops)."""

    name = "torch_reference"

    def unavailable(self) -> str | None:
        return None

    def supports(self, case) -> bool:
        return not isinstance(case, MatVecCase)

    def run(self, case):
        data = case.data()
        if isinstance(case, SparseFFNCase):
            result = sparse_ffn(data.x, *data.weights, data.reference_mask, case.act, thresholds=data.thresholds)
            return result.output, result.active
        if isinstance(case, QuantizedMatMulCase):
            return data.x @ (data.weight.T if case.transposed else data.weight)
        if isinstance(case, SvdPredictorCase):
            return data.scores > 0
        return signbit_mask(data.packed, data.x.float(), case.alpha)


# ------------------------------------------------------------------------------------------------ ONNX Runtime


def _initializer(name: str, tensor: torch.Tensor | np.ndarray) -> onnx.TensorProto:
    if isinstance(tensor, np.ndarray):
        return numpy_helper.from_array(tensor, name)
    if tensor.dtype == torch.bfloat16:
        bits = tensor.view(torch.int16).numpy().view(np.uint16)
        return helper.make_tensor(name, TensorProto.BFLOAT16, list(tensor.shape), bits.tobytes(), raw=True)
    return numpy_helper.from_array(tensor.numpy(), name)


def one_node_model(
    node: onnx.NodeProto, inputs: dict[str, tuple[int, list]], outputs: dict[str, tuple[int, list]], constants: dict
) -> onnx.ModelProto:
    """A model of one custom node and the reference functions, as the exporter writes it (IR, opsets: 21 for the
    quantized ops, as int8 / int4 bundles), checked."""
    graph = helper.make_graph(
        [node],
        node.op_type,
        [helper.make_tensor_value_info(name, *spec) for name, spec in inputs.items()],
        [helper.make_tensor_value_info(name, *spec) for name, spec in outputs.items()],
        initializer=[_initializer(name, tensor) for name, tensor in constants.items()],
    )
    opset = ops.QUANTIZED_OPSET_VERSION if node.op_type in ops.QUANTIZED_OPS else ops.STANDARD_OPSET_VERSION
    model = helper.make_model(
        graph,
        opset_imports=ops.function_opset_imports(opset),
        functions=ops.reference_functions(opset),
        ir_version=ops.IR_VERSION,
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def _host_array(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as a numpy array (bfloat16 as its uint16 bit patterns)."""
    return tensor.view(torch.int16).numpy().view(np.uint16) if tensor.dtype == torch.bfloat16 else tensor.numpy()


def op_model(case, feed_bfloat16: bool = False) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The case as a one-node model and the feeds that run it: what a bundle's graph holds for the op.

    x is an input unless it is bfloat16 and feed_bfloat16 is False (ONNX Runtime's Python API takes no bfloat16
    arrays): then it is an initializer. Feeds hold raw bytes for bfloat16 (uint16 arrays).
    """
    data = case.data()
    x_fed = feed_bfloat16 or data.x.dtype in _FED_DTYPES
    d = data.x.shape[1]
    inputs = {"x": (_ONNX_TYPES[data.x.dtype], ["T", d])} if x_fed else {}
    feeds = {"x": _host_array(data.x)} if x_fed else {}
    constants = {} if x_fed else {"x": data.x}
    if isinstance(case, SparseFFNCase):
        matrices = ("w_gate", "w_up", "w_down_t")
        if data.quantized is None:
            constants.update(zip(matrices, data.weights, strict=True))
            names = [*matrices]
            layout = {}
        else:  # codes as INT32 words and fp16 scales, the quantized op's inputs
            names = [name for matrix in matrices for name in (matrix, f"{matrix}_scales")]
            for matrix, quantized in zip(matrices, data.quantized, strict=True):
                constants.update({matrix: code_words(quantized), f"{matrix}_scales": quantized.scales})
            layout = {"weight_format": weight_format(case), "group_size": case.group_size}
        names = ["x", *names, "mask"]
        if data.thresholds is not None or asymmetric(case):  # an asymmetric node always has them, zeros for none
            thresholds = data.thresholds if data.thresholds is not None else torch.zeros(case.n_neurons)
            constants["thresholds"] = thresholds
            names.append("thresholds")
        if asymmetric(case):
            for matrix, quantized in zip(matrices, data.quantized, strict=True):
                constants[f"{matrix}_mins"] = quantized.mins
                names.append(f"{matrix}_mins")
        attributes = {"activation": case.activation, "activation_threshold": case.act.threshold} | layout
        node = ops.make_node(case.op, names, ["y"], **attributes)
        inputs["mask"] = (TensorProto.INT32, ["T", case.n_neurons])
        feeds["mask"] = int32_mask(data.mask)
        outputs = {"y": (TensorProto.FLOAT, ["T", d])}
    elif isinstance(case, QuantizedMatMulCase):
        constants.update(w=code_words(data.quantized), w_scales=data.quantized.scales)
        names = ["x", "w", "w_scales"]
        if asymmetric(case):
            constants["w_mins"] = data.quantized.mins
            names.append("w_mins")
        layout = {
            "weight_format": weight_format(case),
            "group_size": case.group_size,
            "transposed": int(case.transposed),
        }
        node = ops.make_node(case.op, names, ["y"], **layout)
        outputs = {"y": (TensorProto.FLOAT, ["T", case.n_out])}
    elif isinstance(case, SvdPredictorCase):
        constants.update(a=data.a, b=data.b, bias=data.bias)
        node = ops.make_node("SvdPredictor", ["x", "a", "b", "bias"], ["mask"])
        outputs = {"mask": (TensorProto.INT32, ["T", case.n_neurons])}
    else:
        constants["packed"] = data.packed
        node = ops.make_node("SignBitPredictor", ["x", "packed"], ["mask"], alpha=case.alpha)
        stored = next(helper.get_attribute_value(a) for a in node.attribute if a.name == "alpha")
        assert stored == case.alpha, "the case's alpha must be a float32 value (make_node rounds up)"
        outputs = {"mask": (TensorProto.INT32, ["T", case.n_neurons])}
    return one_node_model(node, inputs, outputs, constants), feeds


class OnnxRuntime:
    """ONNX Runtime (CPU) running the op's reference function, the expansion every bundle carries."""

    name = "onnxruntime"

    def unavailable(self) -> str | None:
        return None

    def supports(self, case) -> bool:
        if isinstance(case, SparseFFNCase):  # the mask is an input
            return case.mask != "absent"
        if isinstance(case, SvdPredictorCase):
            return case.bias  # bias is a required input
        return isinstance(case, SignBitPredictorCase | QuantizedMatMulCase)

    def run(self, case):
        model, feeds = op_model(case)
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        (result,) = session.run(None, feeds)
        if isinstance(case, SparseFFNCase):
            return torch.from_numpy(result), None
        return torch.from_numpy(result)  # a mask, or QuantizedMatMul's y


# ------------------------------------------------------------------------------------------------- C kernels


class CKernels:
    """The native CPU kernels (kernels/cpu) through backends/cpu/kernels.py, one token per call.

    Quantized rows are dotted with x quantized to two int8 planes by default (integer dot products, the reference
    then runs on quantized_activations(x)), or with x in fp32 under EDGE_SDK_QUANT_ACTIVATIONS=fp32: one
    implementation each (`activations`); the fp32-x one runs the quantized cases only.
    """

    def __init__(self, activations: str):
        self.activations = activations
        self.name = "c_kernels" if activations == "integer" else "c_kernels_fp32x"

    @functools.cache  # noqa: B019 (one instance per session)
    def unavailable(self) -> str | None:
        try:
            load_cpu_kernels()
        except (NativeLibraryError, OSError) as error:
            return f"CPU kernel library not loadable: {error}"
        return None

    def supports(self, case) -> bool:
        if isinstance(case, QuantizedMatMulCase):  # edge_cpu_matvec_q: W [N, K], one token per call
            return case.transposed
        quantized = isinstance(case, SparseFFNCase | MatVecCase) and case.weights in QUANT_FORMATS
        if self.activations == "fp32":
            return quantized
        if isinstance(case, SparseFFNCase | MatVecCase):
            return case.weights in ("float32", "float16", "int8", "int4")
        return True

    def reference_input(self, case) -> torch.Tensor | None:
        """The x the kernel computes with when it is not the case's (integer dot products on quantized rows)."""
        if (
            self.activations == "integer"
            and isinstance(case, SparseFFNCase | MatVecCase | QuantizedMatMulCase)
            and case.weights in QUANT_FORMATS
        ):
            from edge_sdk.backends.cpu.kernels import quantized_activations

            return quantized_activations(case.data().x)
        return None

    def run(self, case):
        from edge_sdk.native import ACTIVATIONS_ENV

        previous = os.environ.pop(ACTIVATIONS_ENV, None)
        if self.activations == "fp32":
            os.environ[ACTIVATIONS_ENV] = "fp32"
        try:
            return self._run(case)
        finally:
            os.environ.pop(ACTIVATIONS_ENV, None)
            if previous is not None:
                os.environ[ACTIVATIONS_ENV] = previous

    def _run(self, case):
        from edge_sdk.backends.cpu import kernels

        data = case.data()
        if isinstance(case, QuantizedMatMulCase):
            weight = kernels.QuantizedWeight.from_matrix(data.quantized)
            return torch.stack([kernels.matvec_quantized(x, weight) for x in data.x])
        if isinstance(case, MatVecCase):
            if data.quantized is not None:
                return kernels.matvec_quantized(data.x, kernels.QuantizedWeight.from_matrix(data.quantized), data.bias)
            return kernels.matvec(data.x, data.weight, data.bias)
        if isinstance(case, SvdPredictorCase):
            a_t = data.a.t().contiguous()
            return torch.stack([kernels.svd_predictor(x.float(), a_t, data.b, data.bias) for x in data.x])
        if isinstance(case, SignBitPredictorCase):
            return torch.stack([kernels.signbit_predictor(x.float(), data.packed, case.alpha) for x in data.x])
        kernel = kernels.SparseFFNKernel(case.d, case.n_neurons)
        outputs, actives = [], []
        for token, x in enumerate(data.x):
            active = torch.zeros(case.n_neurons, dtype=torch.bool)
            mask = None if data.mask is None else data.mask[token]
            if data.quantized is None:
                y = kernel(x, *data.weights, case.act, mask=mask, thresholds=data.thresholds, active_out=active)
            else:
                weights = [kernels.QuantizedWeight.from_matrix(m) for m in data.quantized]
                y = kernel.quantized(x, *weights, case.act, mask=mask, thresholds=data.thresholds, active_out=active)
            outputs.append(y)
            actives.append(active)
        return torch.stack(outputs), torch.stack(actives)


# ------------------------------------------------------------------------------------- CANN gather path (CPU)


class CannGather:
    """The CANN backend's gather executor (backends/cann/gather_ffn.py, SVDP Algorithm 4) on the CPU in fp32.

    Its mask comes from a predictor, so a case's mask is given as an svd predictor whose scores are +-1 (zero
    factors, the bias says which neurons); all / absent as the predictor "none"; CHESS thresholds exist only as the
    predictor "threshold", whose candidates are every neuron. The predictor ops run in dynamic mode only (the mode
    changes the rows gathered, not the scores).

    Quantized weights (backends/cann/quantized.py) take one of the two products the backend chooses per chip:
    `weight-quant-matmul` (Atlas A2 / A3), torch_npu's operators replaced by the CPU reference of their documented
    semantics (tests/backends/cann_reference.py), on the float columns `cann_gather_{mode}`; and `dequantize` (310P),
    the code the NPU runs, on the columns `cann_gather_{mode}_dequantize`, which run the quantized cases only. Both run
    QuantizedSparseFFN through the gather FFN, and (mode dynamic) MatVec and QuantizedMatMul through the matrices the
    engine uses for the dense projections (W [N, K]) and the prompt's down projection (W [K, N], always dequantized).
    """

    def __init__(self, mode: str, quant_path: str):
        self.mode, self.quant_path = mode, quant_path
        self.name = f"cann_gather_{mode}" + ("_dequantize" if quant_path == "dequantize" else "")

    def unavailable(self) -> str | None:
        return None

    def supports(self, case) -> bool:
        if asymmetric(case):
            return False
        dequantize_column = self.quant_path == "dequantize"
        if isinstance(case, SparseFFNCase):
            if dequantize_column and not case.quantized:
                return False
            return not case.thresholds or case.mask in ("all", "absent")
        if isinstance(case, MatVecCase | QuantizedMatMulCase):
            return self.mode == "dynamic" and case.weights in QUANT_FORMATS
        return (
            self.mode == "dynamic"
            and not dequantize_column
            and isinstance(case, SvdPredictorCase | SignBitPredictorCase)
        )

    def _ops(self):
        from ..backends.cann_reference import ReferenceWeightQuant

        return None if self.quant_path == "dequantize" else ReferenceWeightQuant()

    def _matrix(self, matrix):
        from edge_sdk.backends.cann.quantized import device_matrix

        return device_matrix(matrix, torch.device("cpu"), torch.float32, self._ops())

    def _ffn(self, weights, activation, predictor: LayerPredictor, quantized=None):
        from edge_sdk.backends.cann.gather_ffn import GatherSparseFFN
        from edge_sdk.backends.cann.quantized import DequantizingMatrix, QuantizedFFN

        layer = None
        if quantized is not None:
            gate, up, down = quantized
            layer = QuantizedFFN(
                self._matrix(gate), self._matrix(up), DequantizingMatrix(down, torch.device("cpu"), torch.float32)
            )
        ffn = GatherSparseFFN(*weights, activation, predictor, mode=self.mode, quantized=layer)
        ffn.phase = "decode"
        return ffn

    def run(self, case):
        from edge_sdk.backends.cann.quantized import DequantizingMatrix

        from edge_sdk.sparsity.signbit import DeviceSignBit

        data = case.data()
        if isinstance(case, MatVecCase):
            y = self._matrix(data.quantized).product(data.x[None])[0]
            return y if data.bias is None else y + data.bias
        if isinstance(case, QuantizedMatMulCase):
            if case.transposed:
                return self._matrix(data.quantized).product(data.x)
            return data.x @ DequantizingMatrix(data.quantized, torch.device("cpu"), torch.float32).rows()
        if isinstance(case, SignBitPredictorCase):
            signbit = DeviceSignBit(data.packed, case.alpha, case.d, torch.device("cpu"))
            return torch.stack([signbit.scores(x) > 0 for x in data.x])
        if isinstance(case, SvdPredictorCase):
            bias = torch.zeros(case.n_neurons) if data.bias is None else data.bias
            predictor = LayerPredictor("svd", {"svd.a": data.a, "svd.b": data.b, "svd.biases": bias[None]})
            ffn = self._ffn([torch.zeros(case.n_neurons, case.d)] * 3, ACTIVATIONS["relu"], predictor)
            return torch.stack([ffn.scores(x) > 0 for x in data.x])
        capacity = torch.tensor([case.n_neurons], dtype=torch.int32)
        outputs, actives = [], []
        for token, x in enumerate(data.x):
            if data.thresholds is not None:
                tensors = {"threshold.thresholds": data.thresholds[None], "threshold.capacity": capacity}
                predictor = LayerPredictor("threshold", tensors)
            elif data.mask is None or case.mask == "all":
                predictor = LayerPredictor("none")
            else:
                signs = data.mask[token].float() * 2 - 1  # [D] +1 predicted, -1 not
                tensors = {
                    "svd.a": torch.zeros(case.n_neurons, 1),
                    "svd.b": torch.zeros(1, case.d),
                    "svd.biases": signs[None],
                    "svd.capacity": capacity,
                }
                predictor = LayerPredictor("svd", tensors)
            step = self._ffn(data.weights, case.act, predictor, data.quantized).step(x)
            outputs.append(step.output)
            actives.append(step.active(case.n_neurons))
        return torch.stack(outputs), torch.stack(actives)


# ------------------------------------------------------------------------------------------------------ CUDA


def cuda_reference_input(case) -> torch.Tensor | None:
    """The x the CUDA kernels compute with where it is not the case's: edge_sparse_ffn_q's gate and up rows and
    edge_matvec_q (QuantizedMatMul with W [N, K]) are integer dot products with x quantized as the CPU kernels quantize
    it (plugins/kernels/quant_rows.cuh); edge_matvec_q_t keeps x in fp32."""
    quantized_ffn = isinstance(case, SparseFFNCase) and case.quantized
    if quantized_ffn or (isinstance(case, QuantizedMatMulCase) and case.transposed):
        from edge_sdk.backends.cpu.kernels import quantized_activations

        return quantized_activations(case.data().x)
    return None


class Cuda:
    """The CUDA kernels (plugins/kernels, edge_cuda_kernels.h) through tests/gpu/cuda_harness.py. Quantized rows go to
    edge_sparse_ffn_q and edge_matvec_q, which dequantize them in registers and dot them with x quantized to two int8
    planes (the reference runs on quantized_activations(x)), and to edge_matvec_q_t, which keeps x in fp32."""

    name = "cuda"
    reference_input = staticmethod(cuda_reference_input)

    @functools.cache  # noqa: B019 (one instance per session)
    def unavailable(self) -> str | None:
        from ..gpu.cuda_harness import gpu_unavailable_reason

        return gpu_unavailable_reason()

    def supports(self, case) -> bool:
        return not isinstance(case, MatVecCase)

    def run(self, case):
        from ..gpu.cuda_harness import Device, Kernels, upload_quantized

        data = case.data()
        device = Device()
        try:
            kernels = Kernels(device)
            tokens = data.x.shape[0]
            if isinstance(case, QuantizedMatMulCase):
                y = device.empty((tokens, case.n_out), torch.float32)
                weight = upload_quantized(device, data.quantized)
                kernels.matvec_q(device.upload(data.x), weight, None, y, transposed=case.transposed)
                return device.download(y)
            mask = device.empty((tokens, case.n_neurons), torch.int32)
            if isinstance(case, SvdPredictorCase):
                bias = None if data.bias is None else device.upload(data.bias)
                scratch = device.empty((tokens, case.rank), torch.float32)
                upload = device.upload
                kernels.svd_predictor(upload(data.x), upload(data.a), upload(data.b), bias, mask, scratch)
                return device.download(mask)
            if isinstance(case, SignBitPredictorCase):
                kernels.signbit_predictor(device.upload(data.x), device.upload(data.packed), case.alpha, mask)
                return device.download(mask)
            y = device.empty((tokens, case.d), torch.float32)
            active = device.empty((tokens, case.n_neurons), torch.uint8)
            workspace = device.allocate(kernels.workspace_size(case.d, case.n_neurons, tokens))
            arguments = (
                None if data.mask is None else device.upload(torch.from_numpy(int32_mask(data.mask))),
                None if data.thresholds is None else device.upload(data.thresholds),
                case.activation,
                case.act.threshold,
                y,
                workspace,
                active,
            )
            if data.quantized is None:
                kernels.sparse_ffn(device.upload(data.x), tuple(device.upload(w) for w in data.weights), *arguments)
            else:
                weights = tuple(upload_quantized(device, m) for m in data.quantized)
                kernels.sparse_ffn_q(device.upload(data.x), weights, *arguments)
            return device.download(y), device.download(active).bool()
        finally:
            device.close()


class CudaEmulation:
    """The quantized CUDA kernels emulated on the host (tests/gpu/cuda_emulation.cu: every block, warp, lane and thread
    of edge_sparse_ffn_q, edge_matvec_q and edge_matvec_q_t through the kernels' own __host__ __device__ functions);
    needs nvcc, not a GPU."""

    name = "cuda_emulation"
    reference_input = staticmethod(cuda_reference_input)

    @functools.cache  # noqa: B019 (one instance per session)
    def unavailable(self) -> str | None:
        from ..gpu import cuda_emulation

        return cuda_emulation.unavailable_reason()

    def supports(self, case) -> bool:
        return (isinstance(case, SparseFFNCase) and case.quantized) or isinstance(case, QuantizedMatMulCase)

    def run(self, case):
        from ..gpu import cuda_emulation

        data = case.data()
        if isinstance(case, QuantizedMatMulCase):
            return torch.from_numpy(cuda_emulation.matvec_q(data.x.numpy(), data.quantized, None, case.transposed))
        mask = None if data.mask is None else int32_mask(data.mask)
        thresholds = None if data.thresholds is None else data.thresholds.numpy()
        y, active = cuda_emulation.sparse_ffn_q(
            data.x.numpy(), data.quantized, mask, thresholds, case.activation, case.act.threshold
        )
        return torch.from_numpy(y), torch.from_numpy(active)


# -------------------------------------------------------------------------------------------------- TensorRT


class TensorRT:
    """TensorRT with the edge-sdk plugins (plugins/tensorrt) on the case's one-node model without its reference
    function, as the TensorRT backend parses a bundle's graphs: strongly typed, TF32 off, one profile at the case's
    shapes. Quantized codes reach the plugins as the model's INT32 initializers, as in a bundle's decode.onnx."""

    name = "tensorrt"
    reference_input = staticmethod(cuda_reference_input)  # the plugins run the CUDA kernels

    @functools.cache  # noqa: B019 (one instance per session)
    def unavailable(self) -> str | None:
        import importlib.util

        from edge_sdk.backends.tensorrt import BACKEND

        from ..gpu.cuda_harness import gpu_unavailable_reason

        available, reason = BACKEND.probe()  # libedge_sdk registers the plugins with TensorRT here
        if not available:
            return reason
        if importlib.util.find_spec("tensorrt") is None:
            return "the tensorrt Python package is not installed (JetPack: python3-libnvinfer)"
        return gpu_unavailable_reason()  # device buffers through the CUDA kernel library's runtime

    def supports(self, case) -> bool:
        return OnnxRuntime().supports(case)  # the same graphs: mask and bias are inputs

    def run(self, case):
        import tensorrt as trt
        from edge_sdk.backends.tensorrt import BACKEND
        from edge_sdk.backends.tensorrt.builder import check_plugins_visible

        from edge_sdk.bundle.graph_ops import DOMAIN, OP_TYPES
        from edge_sdk.formats.onnx_wire import without_functions

        from ..gpu.cuda_harness import Device

        model, feeds = op_model(case, feed_bfloat16=True)
        logger = trt.Logger(trt.Logger.WARNING)
        check_plugins_visible(trt, BACKEND.probe()[1])
        builder = trt.Builder(logger)
        network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
        parser = trt.OnnxParser(network, logger)
        if not parser.parse(without_functions(model.SerializeToString(), DOMAIN, set(OP_TYPES))):
            errors = "; ".join(str(parser.get_error(index)) for index in range(parser.num_errors))
            raise AssertionError(f"TensorRT could not parse the {case.op} model: {errors}")
        config = builder.create_builder_config()
        config.clear_flag(trt.BuilderFlag.TF32)
        profile = builder.create_optimization_profile()
        for name, array in feeds.items():
            profile.set_shape(name, array.shape, array.shape, array.shape)
        config.add_optimization_profile(profile)
        plan = builder.build_serialized_network(network, config)
        assert plan is not None, f"TensorRT could not build the {case.op} engine"
        engine = trt.Runtime(logger).deserialize_cuda_engine(plan)
        context = engine.create_execution_context()
        device = Device()
        try:
            buffers = {}
            for name, array in feeds.items():
                context.set_input_shape(name, array.shape)
                buffers[name] = device.upload(torch.from_numpy(np.ascontiguousarray(array)))
            names = [engine.get_tensor_name(index) for index in range(engine.num_io_tensors)]
            (output,) = [name for name in names if engine.get_tensor_mode(name) == trt.TensorIOMode.OUTPUT]
            dtype = torch.float32 if isinstance(case, SparseFFNCase | QuantizedMatMulCase) else torch.int32
            buffers[output] = device.empty(tuple(context.get_tensor_shape(output)), dtype)
            for name, buffer in buffers.items():
                context.set_tensor_address(name, buffer.pointer)
            assert context.execute_async_v3(device.stream), "TensorRT failed to run the engine"
            result = device.download(buffers[output])  # waits for the stream
        finally:
            device.close()
        return (result, None) if isinstance(case, SparseFFNCase) else result


IMPLEMENTATIONS = [
    TorchReference(),
    OnnxRuntime(),
    CKernels("integer"),
    CKernels("fp32"),
    CannGather("dynamic", "weight-quant-matmul"),
    CannGather("static", "weight-quant-matmul"),
    CannGather("dynamic", "dequantize"),
    CannGather("static", "dequantize"),
    Cuda(),
    CudaEmulation(),
    TensorRT(),
]
