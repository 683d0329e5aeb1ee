"""The one error of bad training data, shared by every module of `pcp_core.data`."""


class DataError(ValueError):
    """Bad training data (missing file, too short for the block size, ...)."""
