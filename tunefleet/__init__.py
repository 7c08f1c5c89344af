"""tunefleet: tuned deep-learning tensor programs at fleet scale."""

from __future__ import annotations

__version__ = "0.1.0"
