"""Lambda entry points: one module per concern, each handler one screen over the domain and adapters."""
