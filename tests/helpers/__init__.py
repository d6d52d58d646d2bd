"""Shared test code: fixtures and helpers imported by the test modules."""
