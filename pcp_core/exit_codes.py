"""The exit codes of PCP's commands, and which of them a supervisor must not retry."""

OK = 0
CRASHED = 1  # a crash: a restart may help
CONFIGURATION = 2  # bad input, no device, missing driver: a restart cannot fix it
REFUSED = 3  # the shepherd refused this worker (secret, version, program)
UNREACHABLE = 4  # the shepherd is gone or out of reach: retried while the run may come back
CHECKPOINT = 5  # the run trained, but its final checkpoint could not be written
INTERRUPTED = 130  # Ctrl-C

FINAL = frozenset({OK, CONFIGURATION, REFUSED, CHECKPOINT, INTERRUPTED})
