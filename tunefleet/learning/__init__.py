"""Learning from measurements: datasets, the XGBoost cost model, the filter audit and the ranking
metric every cost-model judgement uses."""
