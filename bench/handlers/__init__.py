"""What runs handlers: batch handlers against per-message listen(), the worker."""
