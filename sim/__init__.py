"""engine-advisor sim package."""
