"""Tier 2: every role on the real wiring, in one process (``run_in_process``)."""
