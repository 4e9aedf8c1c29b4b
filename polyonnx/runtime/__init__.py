"""Sessions, compiled models and memory planning."""
