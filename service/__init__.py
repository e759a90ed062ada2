"""engine-advisor service package."""
