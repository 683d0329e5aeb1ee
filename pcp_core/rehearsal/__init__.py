"""Rehearse a deployment over emulated links: namespaces, rate limits, loss and delay.

`scenario` reads a scenario TOML file, `links` builds one network namespace per node
joined through a router namespace, `relay` adds one-way delay and jitter to TCP (this
kernel has no netem) and `probe` measures what a link delivers. docs/wan.md explains
what each knob really does. Importing this package is cheap: nothing runs until
`links.emulated_network` is entered.
"""
