"""Device collectors: each module declares its feature (DeviceFeature) by name."""
