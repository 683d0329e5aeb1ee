"""What crosses the network: messages, the transport contract, sealed channel, liveness, auth."""
