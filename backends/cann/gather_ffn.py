"""SVDP Algorithm 4: the decode FFN as gather-plus-matmul on any torch device (Ascend NPU, CUDA, CPU).

An NPU's matrix unit (the Ascend "cube") runs dense matmuls and has no sparse-row GEMV, so a decode step
copies the rows of the neurons that may fire into small dense matrices and multiplies those (SVDP,
Algorithm 4), with the sequential pipeline of DESIGN 3.1 between gate and up:

    candidates = predictor(x)                           svd | signbit | core; all D for threshold / none
    a = act.gate(W_gate[candidates] x)                  gathered rows
    active = candidates with a != 0 [and |a| > t]       the predictor's false positives dropped
    y = (a * act.up(W_up[active] x)) W_down_t[active]   W_down is stored neuron-major: rows again

Every predictor gives a score per neuron, positive exactly where it predicts the neuron active
(DESIGN 3.2): svd x B^T A^T + b; signbit (the largest N_neg predicted active) + 1 - N_neg; core 1 for the
prompt's core neurons, 0 otherwise; threshold |act.gate(g)| - t after a dense gate.

Two modes:
- dynamic: candidates and active are nonzero() index lists. Exact (the same neurons as sparsity/ffn.py),
  reads only the rows needed, but nonzero has a data-dependent shape, so each call waits for the device
  (a host synchronisation on Ascend and CUDA).
- static: the candidates are the top-`capacity` scores, capacity being the bundle's {kind}.capacity at
  the chosen level (the 99th percentile of predicted-active counts on calibration data), and false
  positives are zeroed by masking instead of compaction. Every shape is fixed and nothing waits for the
  device, so the step can be captured in a graph. When more neurons score positive than fit, the
  lowest-scoring ones are dropped; with the calibrated capacity that happens on about 1% of tokens.

int8 / int4 bundles (quantized.py): the gate and up rows are gathered as codes and scales and multiplied through
torch_npu's weight-quant matmul where the chip has one, or dequantized on gather; the down rows are always
dequantized on gather. The predictors, the selection and the masking are the same for every weight format.

The same code runs on every torch device; the compute dtype is fp16 on the NPU (the 310P cube has no fp32
matmul) and fp32 on the CPU, where it is tested against sparsity/ffn.py. Two parts never run in fp16:
- the svd predictor's scores: x B^T A^T + b in fp32 from the unrounded x. B is whitened (V_r^T S^-1), so a channel
  of small calibration variance has a large factor and x B^T can pass fp16's 65504: inf - inf is NaN, and a NaN
  score is "inactive". The two GEMVs are r (d + D) multiply-adds, about 2% of the FFN's.
- the FFN input's cast to fp16 clamps to the finite fp16 range first (to_compute_dtype): an activation beyond
  65504 would become inf and turn the layer's output into inf or NaN. Clamping keeps the fp16 cube path and a
  finite result; keeping such tokens in fp32 would need an fp32 matmul the 310P cube does not have.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edge_sdk.errors import EdgeSdkError
from edge_sdk.model.activation import Activation
from edge_sdk.sparsity.sparse_model import LayerPredictor, SparseFeedForward

from . import MODES
from .quantized import QuantizedFFN

FP16_MAX = torch.finfo(torch.float16).max  # 65504


def to_compute_dtype(x: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """x on the device in the compute dtype; for fp16 clamped to +-65504 first, so no entry becomes inf."""
    x = x.to(device=device)
    if dtype == torch.float16:
        x = x.float().clamp(-FP16_MAX, FP16_MAX)
    return x.to(dtype)


@dataclass
class GatherStep:
    """One decode token through the gather executor."""

    output: torch.Tensor  # [d] float32
    rows: torch.Tensor | None  # [k] int64 neurons whose W_up / W_down_t rows were read; None: all D rows
    kept: torch.Tensor | None  # [k] bool ([D] when rows is None): which rows contribute; None: every one

    def active(self, n_neurons: int) -> torch.Tensor:
        """[D] bool: the neurons that reached up/down and contribute to the output (no host synchronisation)."""
        if self.rows is None:
            everyone = torch.ones(n_neurons, dtype=torch.bool, device=self.output.device)
            return everyone if self.kept is None else self.kept.clone()
        flags = torch.ones_like(self.rows, dtype=torch.bool) if self.kept is None else self.kept
        return torch.zeros(n_neurons, dtype=torch.bool, device=self.rows.device).index_put_((self.rows,), flags)


class GatherSparseFFN(SparseFeedForward):
    """A SparseFeedForward whose decode step is SVDP Algorithm 4 on `device` in `dtype` (see the module doc).

    Prefill stays dense (core predictors choose their neurons there, like SparseFeedForward). `capacity`
    overrides the bundle's {kind}.capacity in static mode; without either, static mode keeps all D neurons.
    `quantized` holds the layer's matrices of an int8 / int4 bundle on the device; the float w_gate, w_up and
    w_down_t are then only their shapes (never copied to the device).
    """

    def __init__(
        self,
        w_gate: torch.Tensor,
        w_up: torch.Tensor,
        w_down_t: torch.Tensor,
        activation: Activation,
        predictor: LayerPredictor,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        mode: str = "dynamic",
        capacity: int | None = None,
        quantized: QuantizedFFN | None = None,
    ):
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {', '.join(MODES)}, found {mode!r}")
        device = torch.device(device)
        if quantized is not None:  # shapes only: the products read the quantized matrices
            weights = [torch.empty(w.shape, device="meta") for w in (w_gate, w_up, w_down_t)]
        else:  # [D, d] each, on the device in the compute dtype (a no-op when they already are: no copy)
            weights = [w.to(device=device, dtype=dtype) for w in (w_gate, w_up, w_down_t)]
        super().__init__(*weights, activation, predictor)
        self.quantized = quantized
        self.w_down_t = self.w_down_t.contiguous()
        self.device, self.dtype, self.mode = device, dtype, mode
        self.capacity_override = capacity
        d, tensors = self.w_gate.shape[1], predictor.tensors
        self.scorer = self.kind.device_scorer(predictor, d, device)  # None for gate-first kinds
        self.thresholds = self.kind.device_thresholds(predictor, device)  # [levels, D] or None
        capacity_name = f"{predictor.kind}.capacity"
        if mode == "static" and capacity is None and self.kind.calibrated and capacity_name not in tensors:
            raise EdgeSdkError(
                f"static mode needs the predictor tensor '{capacity_name}', which this bundle lacks; "
                f"re-export it with this edge-sdk version or use dynamic mode"
            )
        self.capacities = [int(c) for c in tensors[capacity_name].tolist()] if capacity_name in tensors else []
        # a mask fixed at prefill gives the same candidates at every step: (prefill_mask, candidates per batch row)
        self._fixed_candidates_cache: tuple[torch.Tensor | None, dict[int, tuple]] | None = None

    @property
    def gate_first(self) -> bool:
        """True when the gate is computed densely before any selection (gate-first kinds, dense decoding)."""
        return self.dense or self.kind.gate_first

    def static_capacity(self) -> int:
        """Rows gathered per token in static mode: the override, else the bundle's capacity at the chosen level
        (clamped to D), else all D."""
        n_neurons = self.w_gate.shape[0]
        if self.dense:
            return n_neurons
        if self.capacity_override is not None:
            return max(0, min(self.capacity_override, n_neurons))
        if not self.capacities:
            return n_neurons
        capacity = self.capacities[self.level_index if len(self.capacities) > 1 else 0]
        return max(0, min(capacity, n_neurons))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, S, d] -> [B, S, d] in x's dtype
        if self.phase == "prefill":
            return self._prefill(x)
        tokens = x.reshape(-1, x.shape[-1])  # [T = B*S, d], batch-major
        steps = [self.step(token, batch_row=row // x.shape[1]) for row, token in enumerate(tokens)]
        self.last_active = torch.stack([step.active(self.w_gate.shape[0]) for step in steps])  # [T, D]
        return torch.stack([step.output for step in steps]).to(x.dtype).view_as(x)

    def _prefill(self, x: torch.Tensor) -> torch.Tensor:
        # x: [B, S, d]; dense, in the compute dtype; core masks are chosen on the host (once per prompt)
        x_c = to_compute_dtype(x, self.device, self.dtype)
        gate = self.activation.gate(self._product("gate", x_c, None))  # [B, S, D]
        hidden = gate * self.activation.up(self._product("up", x_c, None))
        prefill_mask = self.kind.prefill_mask(self.predictor, gate)
        self.prefill_mask = None if prefill_mask is None else prefill_mask.to(self.device)  # [B, D]
        return (hidden @ self._down_rows(None)).to(x.dtype)

    def scores(self, x: torch.Tensor, batch_row: int = 0) -> torch.Tensor:
        """x: [d] -> [D] float32 predictor scores, positive exactly where the predictor predicts active
        (the kinds with a mask before the gate; the others select after the gate)."""
        if self.scorer is None:
            raise EdgeSdkError(
                f"predictor {self.predictor.kind!r} has no scores before the gate (it selects after a dense gate)"
            )
        prefill_row = None if self.prefill_mask is None else self.prefill_mask[batch_row]
        return self.scorer(x, self.level_index, prefill_row)

    def candidates(self, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """scores [D] -> (rows [k] int64, valid [k] bool or None): the neurons whose gate rows are gathered.

        dynamic: rows = nonzero(scores > 0), valid None (all of them). static: rows = the top-capacity scores
        (highest first), valid = their score > 0."""
        if self.mode == "dynamic":
            return torch.nonzero(scores > 0).squeeze(1), None
        # sorted=True: aclnnTopk documents sorted=False as unsupported ("当前该参数仅支持取True"), CANN 8.0.0
        rows = torch.topk(scores, self.static_capacity(), sorted=True).indices  # [capacity]
        return rows, scores.index_select(0, rows) > 0

    def _fixed_candidates(self, x: torch.Tensor, batch_row: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A mask fixed for the whole decode (fixed_at_prefill) has its candidates computed once per prompt."""
        if self._fixed_candidates_cache is None or self._fixed_candidates_cache[0] is not self.prefill_mask:
            self._fixed_candidates_cache = (self.prefill_mask, {})
        cached = self._fixed_candidates_cache[1]
        if batch_row not in cached:
            cached[batch_row] = self.candidates(self.scores(x, batch_row))
        return cached[batch_row]

    def step(self, x: torch.Tensor, batch_row: int = 0) -> GatherStep:
        """One decode token x [d] (any device, any float dtype) through predictor and gather executor.
        batch_row picks the sequence's core mask."""
        x_c = to_compute_dtype(x, self.device, self.dtype)  # [d]
        if self.gate_first:
            return self.step_dense_gate(x_c)
        if self.kind.fixed_at_prefill:
            rows, valid = self._fixed_candidates(x, batch_row)
        else:
            rows, valid = self.candidates(self.scores(x, batch_row))
        return self.step_from_candidates(x_c, rows, valid)

    def step_from_candidates(self, x: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor | None) -> GatherStep:
        """Algorithm 4 after the predictor: x [d] in the compute dtype on the device; rows [k] candidate
        neurons; valid [k] bool (static mode: which candidates the predictor really marked) or None."""
        if rows.numel() == 0:
            return self._empty_step()
        gate_act = self._gate(x, rows)  # [k] float32
        if valid is not None:
            kept = valid & (gate_act != 0)
            return GatherStep(self._up_down(x, rows, gate_act, kept), rows, kept)
        nonzero = torch.nonzero(gate_act).squeeze(1)  # false positives of the predictor dropped
        if nonzero.numel() == 0:
            return self._empty_step()
        rows, gate_act = rows.index_select(0, nonzero), gate_act.index_select(0, nonzero)
        return GatherStep(self._up_down(x, rows, gate_act, None), rows, None)

    def step_dense_gate(self, x: torch.Tensor) -> GatherStep:
        """Threshold, none and dense decoding: x [d] in the compute dtype; the gate over all D rows, then
        active = (a != 0) [& |a| > t] selects the rows of W_up / W_down_t."""
        gate_act = self._gate(x, None)  # [D] float32
        thresholds = None if self.dense or self.thresholds is None else self.thresholds[self.level_index]  # [D]
        keep = gate_act != 0
        if thresholds is not None:
            keep &= gate_act.abs() > thresholds
        if self.mode == "dynamic":
            rows = torch.nonzero(keep).squeeze(1)
            if rows.numel() == 0:
                return self._empty_step()
            return GatherStep(self._up_down(x, rows, gate_act.index_select(0, rows), None), rows, None)
        capacity = self.static_capacity()
        if capacity >= gate_act.shape[0]:
            return GatherStep(self._up_down(x, None, gate_act, keep), None, keep)
        if capacity == 0:
            return self._empty_step()
        scores = gate_act.abs() if thresholds is None else gate_act.abs() - thresholds  # [D]
        rows = torch.topk(scores, capacity, sorted=True).indices  # sorted=True: see candidates()
        kept = keep.index_select(0, rows)
        return GatherStep(self._up_down(x, rows, gate_act.index_select(0, rows), kept), rows, kept)

    def _product(self, name: str, x: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        """x [..., d] @ W[rows]^T for W = W_gate or W_up ("gate" | "up"): [..., k] ([..., D] for rows None)."""
        if self.quantized is not None:
            matrix = getattr(self.quantized, name)
            return matrix.product(x.reshape(-1, x.shape[-1]), rows).view(*x.shape[:-1], -1)
        weight = getattr(self, f"w_{name}")
        return x @ (weight if rows is None else weight.index_select(0, rows)).T  # rows gathered: [k, d]

    def _down_rows(self, rows: torch.Tensor | None) -> torch.Tensor:
        """W_down_t[rows] [k, d] ([D, d] for rows None) in the compute dtype; quantized rows dequantized on gather."""
        if self.quantized is not None:
            return self.quantized.down.rows(rows)
        return self.w_down_t if rows is None else self.w_down_t.index_select(0, rows)

    def _gate(self, x: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        """act.gate(W_gate[rows] x) as float32 [k] ([D] for rows None)."""
        return self.activation.gate(self._product("gate", x, rows).float())

    def _up_down(
        self, x: torch.Tensor, rows: torch.Tensor | None, gate_act: torch.Tensor, kept: torch.Tensor | None
    ) -> torch.Tensor:
        """y = sum over rows of gate_act * act.up(W_up_i . x) * W_down_t_i, masked by kept: [d] float32."""
        hidden = gate_act * self.activation.up(self._product("up", x, rows).float())  # [k]
        if kept is not None:
            hidden = torch.where(kept, hidden, torch.zeros_like(hidden))
        return (hidden.to(self.dtype) @ self._down_rows(rows)).float()

    def _empty_step(self) -> GatherStep:
        """No neuron fires: y = 0, nothing read past the gate."""
        d = self.w_gate.shape[1]
        rows = torch.zeros(0, dtype=torch.int64, device=self.device)
        return GatherStep(torch.zeros(d, dtype=torch.float32, device=self.device), rows, None)
