"""The worker: its loop, its saved inner state, and the supervisor that restarts it."""
