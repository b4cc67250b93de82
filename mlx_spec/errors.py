"""User-facing errors: one line, no traceback, non-zero exit from the CLI."""


class MlxSpecError(Exception):
    """An error caused by input the user can fix; the CLI prints its message as one line."""


class SourceError(MlxSpecError):
    """A model source (HF repo, folder, GGUF file, recipe) is missing, corrupt or unreachable."""


class UnsupportedError(MlxSpecError):
    """An architecture, tensor type or option that mlx-spec does not support."""


class ConvertError(MlxSpecError):
    """Bad conversion options, an existing output folder, or no disk space."""


class GenerationError(MlxSpecError):
    """Bad generation input: incompatible draft, bad sampling options, prompt too long."""
