"""Choosing the default operating level: each calibrated level's perplexity on validation text.

How far a model tolerates sparsity differs from model to model (the SVDP paper's Table 1 keeps under 1% loss
at s = 0.7 on one model and only at s = 0.4 on another), so a fixed default level is either slow or lossy.
With no level given, calibration reserves validation tokens that the predictors are not fitted on, measures
the perplexity of the dense model and of every calibrated level on them, and picks the most aggressive level
whose perplexity increase stays within a budget.

The measurement is `edge-sdk eval`'s, teacher-forced: each validation chunk's first tokens are a dense prompt,
and every later token goes through its layer's predictor and the sequential SparseFFN (sparse_model.py, the
reference every backend is tested against). A token's FFN depends on that token alone and attention is
causal, so one masked forward over a chunk equals decoding it token by token. Like the calibration, it runs
one layer at a time: one residual stream [C, L, d] per level plus the dense one, and one layer's weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from edge_sdk.model.checkpoint import Checkpoint
from edge_sdk.model.decoder import RMSNorm, TransformerBlock, rope_tables
from edge_sdk.sparsity.collect import token_chunks
from edge_sdk.sparsity.settings import MIN_CALIBRATION_TOKENS, MIN_VALIDATION_TOKENS, CalibrationSettings
from edge_sdk.sparsity.sparse_model import LayerPredictor, SparseFeedForward

VALIDATION_PROMPT_TOKENS = 32  # `edge-sdk eval`'s default dense prompt per window
VALIDATION_SHARE = 5  # without text beyond the calibration tokens, 1/5 of the text is held back for validation
BATCH_CHUNKS = 4
LOGIT_BLOCK_BYTES = 32 << 20


def split_validation(
    tokens: Sequence[int], fit_tokens: int, validation_tokens: int, min_fit_tokens: int
) -> tuple[list[int], list[int]]:
    """(fit, validation) token lists from one calibration token stream.

    Validation tokens come from after the first fit_tokens when the text is long enough; otherwise the last
    1/VALIDATION_SHARE of the text is held back (at most validation_tokens). Returns an empty validation list
    when that would leave fewer than min_fit_tokens to fit on or fewer than MIN_VALIDATION_TOKENS to validate."""
    tokens = list(tokens)
    held = min(validation_tokens, max(len(tokens) - fit_tokens, len(tokens) // VALIDATION_SHARE))
    if held < MIN_VALIDATION_TOKENS or len(tokens) - held < min_fit_tokens:
        return tokens[:fit_tokens], []
    fit_end = min(fit_tokens, len(tokens) - held)
    return tokens[:fit_end], tokens[fit_end : fit_end + held]


def validation_chunks(tokens: Sequence[int], chunk_tokens: int) -> torch.Tensor:
    """Token ids [C, L] of the validation tokens: the fewest chunks of at most chunk_tokens that hold them, of equal
    length, so at most C - 1 tokens are left over (token_chunks' chunks of chunk_tokens leave up to chunk_tokens - 1
    of the tokens held back from fitting unvalidated, a quarter of the default 2048)."""
    count = -(-len(tokens) // chunk_tokens)
    return token_chunks(tokens, len(tokens) // count)


@dataclass(frozen=True)
class LevelChoice:
    """The chosen default level and why: validation perplexity per level against dense."""

    level: float | None  # None: dense, when even the mildest level exceeds the budget
    within_budget: bool
    budget_percent: float
    dense_perplexity: float
    perplexity_change_percent: dict[float, float]  # level -> 100 * (sparse / dense - 1)
    validation_tokens: int
    scored_tokens: int

    def to_report(self) -> dict:
        return {
            "method": "validation perplexity",
            "level": self.level,
            "dense": self.level is None,
            "within_budget": self.within_budget,
            "budget_percent": self.budget_percent,
            "validation_tokens": self.validation_tokens,
            "scored_tokens": self.scored_tokens,
            "dense_perplexity": self.dense_perplexity,
            "perplexity_change_percent": {
                f"{level:g}": change for level, change in self.perplexity_change_percent.items()
            },
        }


def choose_level(changes: dict[float, float], budget_percent: float) -> tuple[float | None, bool]:
    """The most aggressive level reached by raising the level from the mildest while the perplexity change stays
    within the budget (a later level that dips back under it after one over it is noise, not a choice);
    (None, False) when already the mildest is over: dense decoding is the only operating point within it."""
    chosen = None
    for level in sorted(changes):
        if changes[level] > budget_percent:
            break
        chosen = level
    return chosen, chosen is not None


class LevelValidation:
    """Residual streams of the validation chunks, dense and one per level, advanced one layer at a time."""

    def __init__(self, checkpoint: Checkpoint, chunks: torch.Tensor, levels: Sequence[float], prompt_tokens: int):
        config = checkpoint.config
        self.checkpoint = checkpoint
        self.chunks = chunks  # [C, L]
        self.levels = tuple(levels)
        self.prompt_tokens = min(prompt_tokens, chunks.shape[1] - 2)
        dense = F.embedding(chunks, checkpoint.tensor("model.embed_tokens.weight", torch.float32))  # [C, L, d]
        self.hidden: dict[float | None, torch.Tensor] = {None: dense}
        self.hidden |= {level: dense.clone() for level in self.levels}
        self.cos, self.sin = rope_tables(config.rope, config.head_dim, chunks.shape[1])

    @torch.inference_mode()
    def advance(self, block: TransformerBlock, predictor: LayerPredictor) -> None:
        """Run one layer on every stream: the dense FFN on the dense stream and on every prompt, the predictor
        at the stream's level and the sparse FFN on every later token."""
        mlp = block.mlp
        sparse = SparseFeedForward(
            mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight.T, mlp.activation, predictor
        )
        sparse.phase = "decode"
        prompt = self.prompt_tokens
        for index, level in enumerate((None, *self.levels)):
            hidden = self.hidden[level]
            sparse.level_index = index - 1
            for start in range(0, hidden.shape[0], BATCH_CHUNKS):
                rows = slice(start, start + BATCH_CHUNKS)
                h = hidden[rows]
                h = h + block.self_attn(block.input_layernorm(h), self.cos, self.sin, 0)
                x = block.post_attention_layernorm(h)
                if level is None:
                    h = h + mlp(x)
                else:
                    h[:, :prompt] += mlp(x[:, :prompt])
                    h[:, prompt:] += sparse(x[:, prompt:])
                hidden[rows] = h

    @torch.inference_mode()
    def perplexities(self) -> dict[float | None, float]:
        """Perplexity per stream (None: dense) of each token after the first decoded one, predicted from the
        positions that went through the sparse FFN, as `edge-sdk eval` scores its decode steps."""
        config = self.checkpoint.config
        norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        norm.weight = torch.nn.Parameter(self.checkpoint.tensor("model.norm.weight", torch.float32), False)
        head_name = "model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"
        lm_head = self.checkpoint.tensor(head_name, torch.float32)
        targets = self.chunks[:, self.prompt_tokens + 1 :].flatten()  # [T]
        # the float64 logits of one block of scored tokens stay within LOGIT_BLOCK_BYTES whatever the vocabulary
        block = max(1, LOGIT_BLOCK_BYTES // (8 * lm_head.shape[0]))
        result = {}
        for level, hidden in self.hidden.items():
            scored = hidden[:, self.prompt_tokens : -1].flatten(0, 1)  # [T, d]
            total = 0.0
            for start in range(0, scored.shape[0], block):
                logits = norm(scored[start : start + block]) @ lm_head.T  # [block, V]
                total += F.cross_entropy(logits.double(), targets[start : start + block], reduction="sum").item()
            result[level] = math.exp(total / targets.numel())
        return result

    def choose(self, budget_percent: float) -> LevelChoice:
        perplexity = self.perplexities()
        dense = perplexity[None]
        changes = {level: 100.0 * (perplexity[level] / dense - 1.0) for level in self.levels}
        level, within = choose_level(changes, budget_percent)
        return LevelChoice(level, within, budget_percent, dense, changes, int(self.chunks.numel()), self.scored_tokens)

    @property
    def scored_tokens(self) -> int:
        return self.chunks.shape[0] * (self.chunks.shape[1] - self.prompt_tokens - 1)


def default_level(
    settings: CalibrationSettings, validation: LevelValidation | None
) -> tuple[float | None, dict[str, Any]]:
    """The default operating level (None: dense) and how it was set, for the report."""
    if settings.sparsity is not None:
        return settings.sparsity, {"method": "given"}
    if not settings.chooses_level:
        return settings.reference_level, {"method": f"nominal ({settings.predictor} has no calibrated levels)"}
    if validation is None:
        return settings.reference_level, {
            "method": "fallback",
            "reason": f"the calibration text leaves fewer than {MIN_VALIDATION_TOKENS} validation tokens beside the "
            f"{MIN_CALIBRATION_TOKENS} needed for fitting; give more text or --sparsity",
        }
    choice = validation.choose(settings.ppl_budget)
    return choice.level, choice.to_report()
