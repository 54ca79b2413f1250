"""Checks of constructor and builder arguments shared by the layers and the models."""

__all__ = ["validate_positive_ints", "validate_rates"]


def validate_positive_ints(owner: str | None = None, **values) -> None:
    """ValueError unless each value is a positive int (bools refused), named by `owner`."""
    prefix = f"{owner}: " if owner else ""
    for label, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(
                f"{prefix}{label} must be a positive int. Received: {label}={value!r}"
            )


def validate_rates(**rates: float) -> None:
    """ValueError unless each (dropout) rate is in [0, 1)."""
    for label, rate in rates.items():
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"{label} must be in [0, 1). Received: {label}={rate}")
