"""The ``tributary`` command line (entry point ``gateway.cli.main:main``)."""
