"""The exit codes of PCP's commands, and which of them a supervisor must not retry."""

OK = 0
CRASHED = 1  # a crash or a lost connection: a restart may help
CONFIGURATION = 2  # bad input, no device, missing driver: a restart cannot fix it
REFUSED = 3  # the shepherd refused this worker (secret, version, program)
INTERRUPTED = 130  # Ctrl-C

FINAL = frozenset({OK, CONFIGURATION, REFUSED, INTERRUPTED})
