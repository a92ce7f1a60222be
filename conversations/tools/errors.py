"""Errors a tool raises to report a problem to the model rather than crash the run."""


class ToolError(Exception):
    """A tool failed in an expected way; the message is meant to be shown to the model."""
