"""engine-advisor calibration package."""
