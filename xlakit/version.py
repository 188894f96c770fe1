"""xlakit's version: part of the `backend` key component, and the package's (pyproject.toml reads it here)."""
__version__ = "0.1.0"
