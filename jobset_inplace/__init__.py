"""jobset-inplace: hybrid failure recovery for JobSet training gangs."""

__version__ = "0.2.0"
