"""Shared test helpers, imported as ``helpers.<module>`` (pyproject puts tests/ on the
path). A test never imports another test module: what two test files share lives here
or in a conftest fixture."""
