"""Adaptivity, the pure part: drift detectors with hysteresis, regime features, the expert gate,
the guard and rollback rules, safe exploration and the selection history.

No asyncio, NATS, environment variables or wall clock in here: time and randomness come in as
arguments. The adaptive-engine service and the regime-shift benchmark drive these functions; see
docs/adaptivity.md for the definitions and thresholds.
"""
