"""Energy and money of tuning: meters, accounting, energy-aware priorities and Prometheus metrics."""
