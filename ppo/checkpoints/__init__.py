"""Checkpoints of the online runs: saving, resuming and the fallback (`checkpoint`), and the
checks that refuse another run's checkpoint (`resume_check`)."""
