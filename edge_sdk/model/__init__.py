"""Hugging Face checkpoints (config, safetensors, tokenizer) and the torch reference decoder.

The submodules are imported by name: config and tokenizer are torch-free and serve the device runtime, while
checkpoint, decoder and loader need torch (the `export` extra)."""
