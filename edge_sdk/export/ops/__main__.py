"""`python -m edge_sdk.export.ops`: regenerate the generated block of OPS.md."""

from edge_sdk.export.ops.markdown import OPS_MARKDOWN, regenerate_ops_markdown

regenerate_ops_markdown(OPS_MARKDOWN)
