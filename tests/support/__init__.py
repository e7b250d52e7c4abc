"""Helpers shared by the test suites: waiting on observable state, unique names, free ports,
loading scripts that are not modules. Import from the submodules (``tests.support.wait``, ...)."""
