"""Errors meant for users: the CLI prints them as one line, the server as OpenAI-style JSON."""


class UserFacingError(Exception):
    """Bad input or a missing resource, explained in the message; never a bug."""


class InvalidInputError(UserFacingError, ValueError):
    """A parameter, trace line or request that cannot be accepted."""


class ModelLoadError(UserFacingError):
    """A model file or directory that is missing, corrupt or unsupported."""


class WorkerFailedError(RuntimeError):
    """A tensor-parallel rank died or stopped answering: the engine cannot run another step."""
