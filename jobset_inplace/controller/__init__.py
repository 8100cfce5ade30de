"""The recovery controller: kopf watches -> cache -> planner -> executor."""
