"""The mistakes a user can make, one error type per kind, each message naming what is valid.
Imports nothing."""


class InterventionError(ValueError):
    """An intervention this model cannot take (a layer or head out of range, a mask of the wrong
    shape, ...); the message says what is valid."""


class ConfigError(ValueError):
    """A chapter parameter that cannot run (an unknown profile, a count that is not positive,
    ...); the message lists the valid values. Raised before any model is loaded."""


class StoreError(ValueError):
    """A sweep cell or result that a results store cannot keep (not a dict of JSON values); the
    message names the cell. Raised before anything is written."""


class StaleResults(RuntimeError):
    """A results store written by other code or other weights than this run's; the message
    says how to start afresh."""
