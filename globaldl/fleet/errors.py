"""The error a fleet operation raises when the system refuses it (after any rollback)."""


class FleetError(RuntimeError):
    """The system refused a fleet operation (after any rollback has run)."""
