"""Scheduler service: admission, dispatch to an engine and token relay."""
