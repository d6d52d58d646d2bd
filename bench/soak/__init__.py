"""Long runs through injected network faults, then an audit of every message."""
