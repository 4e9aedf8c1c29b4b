"""The fuzz suite: seeded damaged and adversarial models and inputs (docs/fuzzing.md)."""
