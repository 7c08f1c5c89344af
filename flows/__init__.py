"""Prefect flows: ``pipeline`` and one flow per step; deployments live in ``prefect.yaml`` here."""
