"""The ``llmfleet`` command line (entry point ``llmfleet.cli.main:main``)."""
