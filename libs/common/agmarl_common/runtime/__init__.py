"""The service runtime: wire contract, NATS bus and server, service shell, settings, health, metrics, tracing."""
