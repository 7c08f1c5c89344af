"""A real trained cost model with arbitrary scores, for tests and benchmarks of how it is used."""

from __future__ import annotations

from tunefleet.learning.costmodel import TrainedModel


def arbitrary_trained_model(seed: int = 0, *, rows: int = 64, rounds: int = 10) -> TrainedModel:
    """An XGBoost model on tunefleet's feature layout, trained on random rows and labels.

    Its scores are arbitrary but deterministic for a ``seed``: for checking what a caller does
    with a model's scores (filtering, blending, timing), not how good they are.
    """
    import numpy as np
    import xgboost as xgb

    from tunefleet.learning.costmodel import store_features

    width = store_features([]).shape[1]
    rng = np.random.default_rng(seed)
    booster = xgb.train({"seed": seed}, xgb.DMatrix(rng.random((rows, width)), label=rng.random(rows)), rounds)
    return TrainedModel(booster=booster, objective="reg:squarederror", version=1)
