"""The layers under the queue: raw store operations, the JSON codec."""
