"""The demo: a small trainer and the scripted recovery run of ``make demo``."""
