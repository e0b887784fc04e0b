"""Pattern matcher and pattern library (fusion)."""
