"""Engine timing (placeholder: the calibrated performance model lands here)."""
