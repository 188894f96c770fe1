"""xlakit's version: part of the `backend` key component."""
__version__ = "0.1.0"
