"""What types cannot check: every rule that refuses a configuration before submission (pure)."""
