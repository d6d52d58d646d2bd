"""Servers the tests start on loopback: SeaweedFS, and a fault-injecting HTTP proxy."""
