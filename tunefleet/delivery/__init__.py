"""Delivery: best schedules, zero-shot proposals, building a model with them, and the alternatives
a user would run instead."""
