"""Hugging Face checkpoint loading and the reference decoder."""

from edge_sdk.model.activation import Activation
from edge_sdk.model.checkpoint import Checkpoint
from edge_sdk.model.config import ModelConfig, load_config
from edge_sdk.model.decoder import Decoder
from edge_sdk.model.loader import load_decoder
from edge_sdk.model.tokenizer import Tokenizer

__all__ = ["Activation", "Checkpoint", "Decoder", "ModelConfig", "Tokenizer", "load_config", "load_decoder"]
