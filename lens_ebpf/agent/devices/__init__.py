"""Device collectors: each module declares its feature (CollectorFeature) by name."""
