"""edge-sdk: deploy activation-sparse LLMs to edge devices."""

__version__ = "0.1.0"


def load(bundle, backend: str = "auto", **options):
    """Load a bundle for generation: see edge_sdk.runtime.session.load."""
    from edge_sdk.runtime.session import load as load_session

    return load_session(bundle, backend, **options)
