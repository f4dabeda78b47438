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
import torch.nn.functional as F

from edge_sdk.errors import EdgeSdkError
from edge_sdk.model.activation import Activation
from edge_sdk.sparsity.core import core_mask_from_counts, core_neuron_counts
from edge_sdk.sparsity.signbit import BITS_PER_WORD
from edge_sdk.sparsity.sparse_model import LayerPredictor, SparseFeedForward

from . import MODES

FP16_MAX = torch.finfo(torch.float16).max  # 65504


def to_compute_dtype(x: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """x on the device in the compute dtype; for fp16 clamped to +-65504 first, so no entry becomes inf."""
    x = x.to(device=device)
    if dtype == torch.float16:
        x = x.float().clamp(-FP16_MAX, FP16_MAX)
    return x.to(dtype)


# Predictors whose mask exists before the gate; the others (and dense decoding) compute the gate densely.
PREDICTOR_FIRST_KINDS = ("svd", "signbit", "core")
# Value of bit j of a two's complement int32 word: 2^j, and -2^31 for bit 31 (as sparsity/signbit.py packs).
_BIT_VALUES = [1 << j for j in range(BITS_PER_WORD - 1)] + [-(1 << 31)]


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


def signbit_max_negatives(d: int, alpha: float) -> int:
    """The largest count of negative products N_neg that sparsity/signbit.signbit_mask predicts active.

    The rule there is: active unless alpha * (d - N_neg) < N_neg, compared in float64. The left side falls
    and the right side grows with N_neg, so the active counts are exactly 0..this value, and the device
    compares integers instead of doubles (float64 is slow or missing on NPUs)."""
    negatives = torch.arange(d + 1, dtype=torch.float64)
    predicted_active = ~(float(alpha) * (d - negatives) < negatives)
    return int(predicted_active.sum()) - 1


def _popcount32(words: torch.Tensor) -> torch.Tensor:
    """words: int32 -> their set-bit counts (int32), by SWAR bit arithmetic.

    The sign bit is counted apart so that every intermediate stays non-negative: no int32 overflow on any
    device. In-place steps keep the temporaries few (each is as large as the packed W_gate)."""
    counts = words & 0x7FFFFFFF
    counts -= (counts >> 1).bitwise_and_(0x55555555)  # 2-bit fields: 0..2
    counts = (counts & 0x33333333).add_((counts >> 2).bitwise_and_(0x33333333))  # 4-bit fields: 0..4
    counts += counts >> 4
    counts &= 0x0F0F0F0F  # bytes: 0..8
    counts += counts >> 8
    counts += counts >> 16
    counts &= 0x3F  # 0..31
    return counts + (words < 0)


class DeviceSignBit:
    """The sign-bit predictor (DESIGN 3.2, sparsity/signbit.py) in torch integer ops on the weights' device:
    pack x's sign bits, XOR with W_gate's packed bits, popcount per row."""

    def __init__(self, packed: torch.Tensor, alpha: float, d: int, device: torch.device):
        self.packed = packed.to(device=device, dtype=torch.int32)  # [D, W] sign bits of W_gate
        self.d = d
        self.max_negatives = signbit_max_negatives(d, alpha)
        self.bit_values = torch.tensor(_BIT_VALUES, dtype=torch.int32, device=device)  # [32]

    def negatives(self, x: torch.Tensor) -> torch.Tensor:
        """x: [d] -> N_neg [D] int32, the products W_gate_ij * x_j predicted negative per row."""
        words = self.packed.shape[1]
        negative = F.pad((x < 0).to(torch.int32), (0, words * BITS_PER_WORD - self.d))  # [32W]; -0.0 is not < 0
        packed_x = (negative.view(words, BITS_PER_WORD) * self.bit_values).sum(-1, dtype=torch.int32)  # [W]
        return _popcount32(self.packed ^ packed_x).sum(-1, dtype=torch.int32)  # XOR: [D, W]

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """x: [d] -> [D] float32, positive exactly where signbit_mask predicts the neuron active."""
        return (self.max_negatives + 1 - self.negatives(x)).to(torch.float32)


class GatherSparseFFN(SparseFeedForward):
    """A SparseFeedForward whose decode step is SVDP Algorithm 4 on `device` in `dtype` (see the module doc).

    Prefill stays dense (core predictors choose their neurons there, like SparseFeedForward). `capacity`
    overrides the bundle's {kind}.capacity in static mode; without either, static mode keeps all D neurons.
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
    ):
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {', '.join(MODES)}, found {mode!r}")
        device = torch.device(device)
        # [D, d] each, on the device in the compute dtype (a no-op when they already are: no copy)
        super().__init__(*(w.to(device=device, dtype=dtype) for w in (w_gate, w_up, w_down_t)), activation, predictor)
        self.w_down_t = self.w_down_t.contiguous()
        self.device, self.dtype, self.mode = device, dtype, mode
        self.capacity_override = capacity
        d = self.w_gate.shape[1]
        kind, tensors = predictor.kind, predictor.tensors
        self.svd_a = self.svd_b = self.svd_biases = self.thresholds = self.signbit = None
        if kind == "svd":
            self.svd_a = tensors["svd.a"].to(device=device, dtype=torch.float32)  # [D, r], scores in fp32
            self.svd_b = tensors["svd.b"].to(device=device, dtype=torch.float32)  # [r, d]
            self.svd_biases = tensors["svd.biases"].to(device=device, dtype=torch.float32)  # [levels, D]
        elif kind == "signbit":
            self.signbit = DeviceSignBit(tensors["signbit.packed"], float(tensors["signbit.alpha"][0]), d, device)
        elif kind == "threshold":
            self.thresholds = tensors["threshold.thresholds"].to(device=device, dtype=torch.float32)  # [levels, D]
        capacity_name = f"{kind}.capacity"
        if mode == "static" and capacity is None and kind != "none" and capacity_name not in tensors:
            raise EdgeSdkError(
                f"static mode needs the predictor tensor '{capacity_name}', which this bundle lacks; "
                f"re-export it with this edge-sdk version or use dynamic mode"
            )
        self.capacities = [int(c) for c in tensors[capacity_name].tolist()] if capacity_name in tensors else []
        self._core_cache: tuple[torch.Tensor, list] | None = None  # (core_mask, candidates per batch row)

    @property
    def gate_first(self) -> bool:
        """True when the gate is computed densely before any selection (threshold, none, dense decoding)."""
        return self.dense or self.predictor.kind not in PREDICTOR_FIRST_KINDS

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
        gate = self.activation.gate(x_c @ self.w_gate.T)  # [B, S, D]
        hidden = gate * self.activation.up(x_c @ self.w_up.T)
        if self.predictor.kind == "core":
            masks = []
            for row in gate.float().cpu():
                counts, sums = core_neuron_counts(row, self.predictor.core_alpha)
                masks.append(core_mask_from_counts(counts, sums, self.predictor.core_beta))
            self.core_mask = torch.stack(masks).to(self.device)  # [B, D]
        return (hidden @ self.w_down_t).to(x.dtype)

    def scores(self, x: torch.Tensor, batch_row: int = 0) -> torch.Tensor:
        """x: [d] -> [D] float32 predictor scores, positive exactly where the predictor predicts active
        (svd, signbit and core; the other kinds select after the gate)."""
        kind = self.predictor.kind
        if kind == "svd":
            x_f = x.to(device=self.device, dtype=torch.float32).unsqueeze(0)  # [1, d], unrounded
            low_rank = ((x_f @ self.svd_b.T) @ self.svd_a.T)[0]  # [D] float32
            return low_rank + self.svd_biases[self.level_index]
        if kind == "signbit":
            return self.signbit.scores(x.to(self.device))
        if kind == "core":
            return self._core_mask_row(batch_row).to(torch.float32)
        raise EdgeSdkError(f"predictor {kind!r} has no scores before the gate (it selects after a dense gate)")

    def _core_mask_row(self, batch_row: int) -> torch.Tensor:
        if self.core_mask is None:
            raise EdgeSdkError("core predictor: decode called before prefill chose the core neurons")
        return self.core_mask[batch_row]  # [D] bool

    def candidates(self, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """scores [D] -> (rows [k] int64, valid [k] bool or None): the neurons whose gate rows are gathered.

        dynamic: rows = nonzero(scores > 0), valid None (all of them). static: rows = the top-capacity scores
        (in no particular order), valid = their score > 0."""
        if self.mode == "dynamic":
            return torch.nonzero(scores > 0).squeeze(1), None
        rows = torch.topk(scores, self.static_capacity(), sorted=False).indices  # [capacity]
        return rows, scores.index_select(0, rows) > 0

    def _core_candidates(self, batch_row: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The core neurons are fixed for the whole decode: their candidates are computed once per prompt."""
        mask = self._core_mask_row(batch_row)
        if self._core_cache is None or self._core_cache[0] is not self.core_mask:
            self._core_cache = (self.core_mask, [None] * self.core_mask.shape[0])
        cached = self._core_cache[1]
        if cached[batch_row] is None:
            cached[batch_row] = self.candidates(mask.to(torch.float32))
        return cached[batch_row]

    def step(self, x: torch.Tensor, batch_row: int = 0) -> GatherStep:
        """One decode token x [d] (any device, any float dtype) through predictor and gather executor.
        batch_row picks the sequence's core mask."""
        x_c = to_compute_dtype(x, self.device, self.dtype)  # [d]
        if self.gate_first:
            return self.step_dense_gate(x_c)
        if self.predictor.kind == "core":
            rows, valid = self._core_candidates(batch_row)
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
        rows = torch.topk(scores, capacity, sorted=False).indices
        kept = keep.index_select(0, rows)
        return GatherStep(self._up_down(x, rows, gate_act.index_select(0, rows), kept), rows, kept)

    def _gate(self, x: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        """act.gate(W_gate[rows] x) as float32 [k] ([D] for rows None)."""
        w_gate = self.w_gate if rows is None else self.w_gate.index_select(0, rows)  # [k, d]
        return self.activation.gate((w_gate @ x).float())

    def _up_down(
        self, x: torch.Tensor, rows: torch.Tensor | None, gate_act: torch.Tensor, kept: torch.Tensor | None
    ) -> torch.Tensor:
        """y = sum over rows of gate_act * act.up(W_up_i . x) * W_down_t_i, masked by kept: [d] float32."""
        w_up = self.w_up if rows is None else self.w_up.index_select(0, rows)  # [k, d]
        w_down_t = self.w_down_t if rows is None else self.w_down_t.index_select(0, rows)  # [k, d]
        hidden = gate_act * self.activation.up((w_up @ x).float())  # [k]
        if kept is not None:
            hidden = torch.where(kept, hidden, torch.zeros_like(hidden))
        return (hidden.to(self.dtype) @ w_down_t).float()

    def _empty_step(self) -> GatherStep:
        """No neuron fires: y = 0, nothing read past the gate."""
        d = self.w_gate.shape[1]
        rows = torch.zeros(0, dtype=torch.int64, device=self.device)
        return GatherStep(torch.zeros(d, dtype=torch.float32, device=self.device), rows, None)
