"""core (SparseInfer, semantic): sentence-level core neurons, chosen from the prompt at prefill and held fixed for the
whole decode.

Per prompt token its top-alpha share of positive gate activations; counted per neuron over the prompt; the top-beta
share of neurons is the decode's mask (sparsity/core.py holds the rule in torch). Nothing is fitted but the capacity.

The selection is also here in numpy (no torch): the runtimes that get the prompt's gate activations from the prefill
graph (ONNX Runtime, TensorRT) count each layer's token-wise core neurons and pick the decode's core neurons with it;
the torch reference and the C runtime apply the same rule. It stays off the graph: per token it takes the top alpha
share of the positive activations, a TopK over all D neurons, which TensorRT 10.3 cannot build past K = 3840
(ITopKLayer), and its ties and float64 sums have no TensorRT formulation either."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_sdk.predictors.kind import MaskAndThresholds, PredictorKind, capacity, check_fraction

if TYPE_CHECKING:
    import onnx
    import torch

    from edge_sdk.bundle.manifest import SparsityConfig
    from edge_sdk.export.graph import GraphBuilder
    from edge_sdk.export.graph import _Context as StepContext
    from edge_sdk.model.config import ModelConfig
    from edge_sdk.sparsity.fitting import FittedLayer, LayerActivations, LayerWeights
    from edge_sdk.sparsity.settings import CalibrationSettings
    from edge_sdk.sparsity.sparse_model import LayerPredictor

CHUNK_ELEMENTS = 1 << 22  # tokens are counted in chunks of about this many activations (bounded temporaries)


def core_counts_from_activations(activations: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """[S, D] gate activations of one prompt -> (counts [D] int64, sums [D] float64): per token its
    ceil(alpha * n_pos) largest positive activations (equal values: lower index first), counted per neuron, and
    those activations summed per neuron in float64."""
    n_tokens, n_neurons = activations.shape
    ratio = Fraction(repr(float(alpha)))  # alpha read as the decimal written
    counts = np.zeros(n_neurons, dtype=np.int64)
    sums = np.zeros(n_neurons, dtype=np.float64)
    step = max(1, CHUNK_ELEMENTS // max(1, n_neurons))
    for start in range(0, n_tokens, step):
        acts = np.asarray(activations[start : start + step], dtype=np.float32)  # [t, D]
        n_positive = (acts > 0).sum(axis=1)
        keep = np.array([-(-ratio * int(n) // 1) for n in n_positive], dtype=np.int64)  # [t], ceil; <= n_positive
        order = np.argsort(-acts, axis=1, kind="stable")  # [t, D] descending, equal values: lower index first
        taken = np.arange(n_neurons)[None, :] < keep[:, None]  # [t, D] by rank
        neurons = order[taken]
        values = np.take_along_axis(acts, order, axis=1)[taken].astype(np.float64)
        counts += np.bincount(neurons, minlength=n_neurons)
        sums += np.bincount(neurons, weights=values, minlength=n_neurons)
    return counts, sums


def core_masks_from_activations(activations: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    """[B, S, D] gate activations of a prefill -> [B, D] bool decode masks (counts, then core_mask_from_counts)."""
    rows = [core_counts_from_activations(row, alpha) for row in activations]
    counts = np.stack([row_counts for row_counts, _ in rows])
    sums = np.stack([row_sums for _, row_sums in rows])
    return core_mask_from_counts(counts, sums, beta)


def core_mask_from_counts(counts: np.ndarray, sums: np.ndarray, beta: float) -> np.ndarray:
    """[B, D] counts and sums -> [B, D] bool masks: the top ceil(beta*D) neurons by count, then larger sum, then
    lower index; neurons never picked (count 0) are never in the mask."""
    batch, n_neurons = counts.shape
    keep = -(-Fraction(repr(float(beta))) * n_neurons // 1)  # ceil, with beta read as written
    masks = np.zeros((batch, n_neurons), dtype=bool)
    for row in range(batch):
        order = np.lexsort((np.arange(n_neurons), -sums[row], -counts[row]))[: int(keep)]
        chosen = order[counts[row, order] > 0]
        masks[row, chosen] = True
    return masks


@dataclass(frozen=True)
class CoreSettings:
    """core's knobs (recorded as CalibrationSettings' core_alpha, core_beta, core_prompt_fraction; alpha and beta
    also in every manifest, which the runtimes read)."""

    alpha: float = 0.4  # top fraction of each prompt token's positive activations
    beta: float = 0.2  # fraction of neurons kept for the decode
    prompt_fraction: float = 0.5  # calibration's evaluation: leading share of each chunk used as the prompt


def _chosen_mask(prefill_row: torch.Tensor | None) -> torch.Tensor:
    if prefill_row is None:
        from edge_sdk.errors import EdgeSdkError

        raise EdgeSdkError("core predictor: decode called before prefill chose the core neurons")
    return prefill_row


class Core(PredictorKind):
    def check_settings(self, settings: CalibrationSettings, config: ModelConfig) -> None:
        check_fraction("core alpha", settings.core_alpha, low_open=True)
        check_fraction("core beta", settings.core_beta, low_open=True)

    def fit(
        self,
        acts: LayerActivations,
        weights: LayerWeights,
        settings: CalibrationSettings,
        config: ModelConfig,
        factor_dtype: str = "F32",
    ) -> FittedLayer:
        import torch

        from edge_sdk.sparsity.core import core_neuron_mask
        from edge_sdk.sparsity.fitting import FittedLayer, LevelStatistics

        chunk_len = settings.chunk_tokens

        def mask(scores, acts, level):
            # Each chunk is a sequence: its first tokens are the prompt (dense prefill), whose activations
            # choose the core neurons used for every following (decode) token of that chunk.
            gate_act = acts.gate_act
            chunks = gate_act.view(-1, min(chunk_len, gate_act.shape[0]), gate_act.shape[1])
            prompt_len = max(1, int(chunks.shape[1] * settings.core_prompt_fraction))
            predicted = torch.ones_like(chunks, dtype=torch.bool)
            for index, chunk in enumerate(chunks):
                predicted[index, prompt_len:] = core_neuron_mask(
                    chunk[:prompt_len], settings.core_alpha, settings.core_beta
                )
            return predicted.view_as(gate_act)

        # the decode keeps ceil(beta * D) neurons whatever the level: its statistics are the setting's
        capacity = math.ceil(settings.core_beta * acts.gate_act.shape[1])
        return FittedLayer(
            tensors={},
            mask=mask,
            details={"alpha": settings.core_alpha, "beta": settings.core_beta},
            level_dependent=False,
            statistics=LevelStatistics(torch.tensor([capacity], dtype=torch.int32), [1.0 - settings.core_beta], [0.0]),
        )

    def prefill_mask(self, predictor: LayerPredictor, gate: torch.Tensor) -> torch.Tensor | None:
        import torch

        from edge_sdk.sparsity.core import core_mask_from_counts, core_neuron_counts

        masks = []
        for row in gate.float().cpu():
            counts, sums = core_neuron_counts(row, predictor.core_alpha)
            masks.append(core_mask_from_counts(counts, sums, predictor.core_beta))
        return torch.stack(masks)

    def decode_mask(
        self, predictor: LayerPredictor, tokens: torch.Tensor, level_index: int, prefill_mask: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        chosen = _chosen_mask(prefill_mask)  # [B, D]
        return chosen.repeat_interleave(tokens.shape[0] // chosen.shape[0], dim=0), None

    def native_masker(self, predictor: LayerPredictor, kernels: Any) -> Callable[..., MaskAndThresholds]:
        return lambda token, level_index, prefill_row: (_chosen_mask(prefill_row).contiguous(), None)

    def device_scorer(
        self, predictor: LayerPredictor, d: int, device: torch.device
    ) -> Callable[..., torch.Tensor] | None:
        import torch

        return lambda x, level_index, prefill_row: _chosen_mask(prefill_row).to(torch.float32)

    def decode_inputs(self, config: ModelConfig) -> list[onnx.ValueInfoProto]:
        from onnx import TensorProto, helper

        shape = ["batch", config.intermediate_size]
        return [
            helper.make_tensor_value_info(f"core_mask.{layer}", TensorProto.INT32, shape)
            for layer in range(config.num_layers)
        ]

    def emit_prompt_outputs(
        self, g: GraphBuilder, layer: int, gate: str, rows: str, ctx: StepContext, outputs: list
    ) -> None:
        """The layer's gate activations [T, D] (rows: [1] int64 = T) as the output core_activations.{layer}
        [B, T / B, D] float32, from which the runtime picks the decode's core neurons on the host (the module
        docstring)."""
        from onnx import TensorProto, helper

        n_neurons = g.spec.config.intermediate_size
        name = f"core_activations.{layer}"
        batch = g.op("Slice", [ctx.batch_seq, g.ints(0), g.ints(1)])
        # the row count spelled out, and allowzero: a decode step leaves no prompt rows, and with allowzero = 0 a 0
        # would copy the input's dimension (a -1 would not be inferable either)
        per_row = g.op("Concat", [batch, g.op("Div", [rows, batch]), g.ints(n_neurons)], axis=0)
        g.nodes.append(helper.make_node("Reshape", [gate, per_row], [name], allowzero=1))
        outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", "seq", n_neurons]))

    def emit_step_mask(
        self, g: GraphBuilder, layer: int, x2d: str, prompt_rows: str, ctx: StepContext
    ) -> tuple[str, str | None]:
        """The core_mask.{layer} input [B, D], one row per token of the step."""
        n_neurons = g.spec.config.intermediate_size
        rows = g.op("Unsqueeze", [f"core_mask.{layer}", g.ints(1)])  # [B, 1, D]
        per_token = g.op("Expand", [rows, g.op("Concat", [ctx.batch_seq, g.ints(n_neurons)], axis=0)])
        every_token = g.op("Reshape", [per_token, g.op("Concat", [ctx.tokens, g.ints(n_neurons)], axis=0)])
        return g.op("Slice", [every_token, prompt_rows, ctx.tokens, g.ints(0)]), None  # the step's rows

    def decode_feed(self, prompt_outputs: dict[str, np.ndarray], sparsity: SparsityConfig) -> dict[str, np.ndarray]:
        # decode's core_mask inputs are int32 (1 = core neuron), as every mask of the graphs
        return {
            f"core_mask.{layer}": core_masks_from_activations(
                prompt_outputs[f"core_activations.{layer}"], sparsity.core_alpha, sparsity.core_beta
            ).astype(np.int32)
            for layer in range(len(sparsity.layers))
        }


KIND = Core(
    "core",
    "SparseInfer (semantic)",
    has_levels=False,
    relu_only=True,
    tensors=(capacity(1),),
    fixed_at_prefill=True,
    gate_first=False,
    knobs=("core_alpha", "core_beta", "core_prompt_fraction"),
)
