"""Optional add-ons that are not part of the core API."""
