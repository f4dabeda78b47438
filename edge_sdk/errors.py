"""Errors a user can act on.

Library code raises these; only the CLI turns them into a one-line message and exit status 2.
Each message names the file or field, what was expected and what was found.
"""


class EdgeSdkError(Exception):
    """Base class of every error caused by input the user can fix."""


class CheckpointError(EdgeSdkError):
    """A checkpoint directory, its config.json or its weight files are missing or inconsistent."""


class CalibrationError(EdgeSdkError):
    """Calibration data or predictor settings do not fit the model."""
