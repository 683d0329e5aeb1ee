"""The shepherd: admission, rounds, aggregation, the outer-step guard, the session."""
