"""trainer: answers train requests; trains, evaluates and publishes models (torch lives here only)."""
