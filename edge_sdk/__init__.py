"""edge-sdk: deploy activation-sparse LLMs to edge devices."""

__version__ = "0.1.0"
